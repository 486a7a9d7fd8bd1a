"""engine-bridge commands: export, profiles and launch (engine profiles, docs/engine-profiles.md)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from core import rig as rigmod
from core.cli import JsonOption, RigOption, err, out, print_result
from core.errors import MismatchError
from core.fsutil import atomic_write_text, check_output
from core.units import plural
from engine_bridge.profiles import export as ex
from engine_bridge.profiles import launch as ln
from engine_bridge.profiles import profile as pf
from engines.registry import ENGINES


def export_cmd(
    rig: Optional[str] = RigOption,
    plan: str = typer.Option("latest", "--plan", metavar="PLAN", help="Plan file written by `planner solve`, its name "
                                                                      "in rig/plans, or 'latest' (the default)."),
    fmt: Optional[str] = typer.Option(None, "--format", metavar="FORMAT",
                                      help=f"{' or '.join(pf.formats()[:-1])}: that engine's shell file + JSON (the "
                                           f"engine's variables); {pf.JSON_FORMAT}: the plan's engine's profile as data "
                                           "(default: the plan's engine)."),
    profile: Optional[str] = typer.Option(None, "--profile", metavar="NAME",
                                          help="Name of the exported profile (default: the plan file's name)."),
    base: Optional[str] = typer.Option(None, "--base", metavar="PROFILE",
                                       help=f"Named profile to build on (default {ex.DEFAULT_BASE}; a name or a .toml "
                                            "file)."),
    cache_experts: Optional[int] = typer.Option(None, "--cache-experts", metavar="N",
                                                help="Expert-cache size in experts (an engine argument; default: "
                                                     "the named profile's, else the cache the plan was priced with)."),
    output: Optional[str] = typer.Option(None, "-o", "--output", metavar="FILE",
                                         help="Write here ('-' = stdout) instead of rig/profiles/NAME.env; an env "
                                              "file gets its JSON beside it (FILE without .env, plus .json: launch "
                                              "reads it). A file there that export did not write is refused."),
    allow_unverified: bool = typer.Option(False, "--allow-unverified",
                                          help="Export replicas not verified against the manifest; the profile says so."),
    fallbacks: bool = typer.Option(True, "--fallbacks/--no-fallbacks",
                                   help="Also write the N-1 profiles: the plan re-solved without each drive "
                                        "(NAME.without-DRIVE)."),
):
    """Check a plan against the engine's rules and write it as an engine profile (and one per drive that could fail)."""
    result = ex.export_profile(rig_root=rigmod.rig_dir(rig), plan_path=plan, fmt=fmt, name=profile, base=base,
                               cache_experts=cache_experts, output=output, allow_unverified=allow_unverified,
                               fallbacks=fallbacks,
                               report=lambda ev: err.print(f"export: {ev.message}", highlight=False, soft_wrap=True))
    p = result.profile
    for path in p.provenance.get("memory_members") or ():
        err.print(f"[yellow]warning:[/] {escape(path)} is in RAM (tmpfs): it takes RAM for as long as it exists and "
                  "vanishes at reboot (`replicas sync` restores it; until then launch names the profile without it)",
                  soft_wrap=True)
    if p.unverified:
        err.print("[yellow]warning:[/] not verified against the manifest (exported with --allow-unverified): "
                  + escape(", ".join(p.unverified)), soft_wrap=True)
    if result.files == ("-",):
        sys.stdout.write(result.text)
        sys.stdout.flush()
        return
    chain = " + ".join(p.provenance.get("chain") or [])
    said = [p.engine, plural(p.sources, "source")] + ([f"named profile {chain}"] if chain else [])
    err.print(f"profile {p.id!r} ({', '.join(said)}) written:", soft_wrap=True)
    for f in result.files:
        typer.echo(f)
    for drive, path in result.fallbacks:
        err.print(f"without {escape(drive)}: {escape(path)}", soft_wrap=True)
    for drive, why in result.skipped:
        err.print(f"[yellow]no N-1 profile without {escape(drive)}:[/] {escape(why)}", soft_wrap=True)

def profiles_cmd(rig: Optional[str] = RigOption, json_out: bool = JsonOption):
    """List named profiles (shipped and rig/profiles/*.toml) with the delta of each, and exported profiles."""
    root = rigmod.rig_dir(rig)
    defs = ex.all_definitions(root)
    exported = ex.exported_profiles(root)
    if json_out:
        print_result(ex.ProfileList(defs, tuple(exported)))
        return
    # Plain lines, not a table: variable names are long and a delta must be readable whole.
    for d in defs.values():
        dl = pf.delta(d, defs)
        origin = d.origin if d.origin == ex.SHIPPED else os.path.relpath(d.origin, root)
        head = f"{d.name} = {d.base} +" if d.base else f"{d.name}"
        out.print(f"[bold]{head}[/] ({origin}){': ' + d.description if d.description else ''}", markup=True,
                  highlight=False, soft_wrap=True)
        for k, v in dl["added"].items():
            out.print(f"  + {k}={v}", markup=False, highlight=False, soft_wrap=True)
        for k, v in dl["changed"].items():
            out.print(f"  ~ {k}={v}", markup=False, highlight=False, soft_wrap=True)
        for k in dl["removed"]:
            out.print(f"  - {k}", markup=False, highlight=False, soft_wrap=True)
        if "cache_experts" in dl:
            out.print(f"  cache_experts {dl['cache_experts']}", markup=False, highlight=False, soft_wrap=True)
    if exported:
        # The folder on a line of its own: a table's title wraps at the table's width.
        out.print(f"exported profiles in {root}/profiles", highlight=False, markup=False)
        t2 = Table()
        for c in ("id", "engine", "weights", "decode", "cache", "note"):
            t2.add_column(c)
        for p in exported:
            t2.add_row(p.id, p.engine, ":".join(map(str, (p.primary_weight, *p.replica_weights))),
                       ":".join(map(str, p.decode_weights)) or "-", str(p.cache_experts or "-"),
                       "UNVERIFIED replicas" if p.unverified else "")
        out.print(t2)

def launch_cmd(
    binary: str = typer.Option(..., "--binary", metavar="PATH", help="The ds4 / ds4-bench executable, or colibri's (coli "
                                                                     "or its engine binary)."),
    profile: str = typer.Option(..., "--profile", metavar="PROFILE", help="An exported profile (.json or its .env), its "
                                                                          "name in rig/profiles, or 'latest'."),
    rig: Optional[str] = RigOption,
    out_dir: Optional[str] = typer.Option(None, "--out", metavar="DIR", help="Run folder (default "
                                                                             "rig/runs/launch-NAME-TIME)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS", help="Stop the engine after this long."),
    json_out: bool = JsonOption,
    engine_args: Optional[List[str]] = typer.Argument(None, metavar="-- ENGINE_ARGS",
                                                      help="Passed to the engine after the profile's arguments."),
):
    """Run a real ds4 / ds4-bench or colibri with a profile and confirm from its log that the profile was applied."""
    if timeout is not None and not timeout > 0:       # -0 or a negative: the engine would be started only to be stopped
        from core.errors import UsageError
        raise UsageError(f"--timeout {timeout:g}: give positive seconds")
    root = rigmod.rig_dir(rig)
    profile = ln.resolve_profile(profile, root)     # a file, a name in rig/profiles, or 'latest'
    if rig is None and not os.environ.get(rigmod.RIG_ENV):
        root = ln.profile_rig(profile) or root      # a profile exported into another rig runs and records there
    if out_dir:
        ln.check_run_dir(out_dir)        # before the engine starts
    path = ln.which(binary)
    p, dead = ln.preflight(path, profile)
    if dead:
        err.print(f"[yellow]dead knobs:[/] {escape(path)} never names {', '.join(dead)}; setting them changes nothing",
                  soft_wrap=True)
    if p.unverified:
        err.print("[yellow]warning:[/] this profile was exported with unverified replicas: "
                  + escape(", ".join(p.unverified)), soft_wrap=True)
    err.print(f"launching {escape(path)} with profile {p.id!r} ({plural(p.sources, 'source')})", soft_wrap=True)
    r = ln.launch_arm(path, profile, engine_args or [], run_dir=out_dir, rig_root=root, timeout=timeout)
    stopped = ""
    if r.returncode != 0:        # the engine's own words first: nothing else was judged
        how = ("was stopped after --timeout" if r.returncode is None else f"was killed by signal {-r.returncode}"
               if r.returncode < 0 else f"exited {r.returncode}")
        stopped = f"the engine {how}" + (f": {r.engine_said}" if r.engine_said else " and printed nothing")
        err.print(stopped, soft_wrap=True, markup=False, highlight=False)
    if r.ok and r.calibration:
        # the engine's own lines calibrate the next solve (docs/planner.md, "Calibrated by the engine's own lines")
        from planner.rigmodel import record_calibration

        r = replace(r, calibration_plan=record_calibration(root, p.engine, r.calibration) or "")
        if r.calibration_plan:
            err.print(f"calibration from the engine's lines recorded in {escape(r.calibration_plan)}", soft_wrap=True)
    if json_out:
        print_result(r)
    else:
        out.print(f"confirmations ({r.run_dir})", highlight=False, markup=False)
        t = Table()
        for c in ("check", "ok", "expected", "observed", "detail"):
            t.add_column(c)
        for c in r.confirmations:
            t.add_row(c.name, "ok" if c.ok else "FAILED", c.expected, c.observed, c.detail)
        out.print(t)
        if r.metrics:
            out.print("metrics: " + ", ".join(f"{k}={v}" for k, v in r.metrics.items()))
    if stopped:
        raise MismatchError(f"{stopped}; logs in {r.run_dir}")
    if not r.ok:
        why = "; ".join(f"{c.name} ({c.detail})" for c in r.confirmations if not c.ok)
        raise MismatchError(f"arm failed, not confirmed by the engine log: {why}; logs in {r.run_dir}")

def standin_cmd(
    path: str = typer.Argument(..., metavar="PATH", help="The executable to write."),
    engine: str = typer.Option(..., "--engine", metavar="NAME", help="The engine whose interface it speaks: "
                               + ", ".join(n for n, e in ENGINES.items() if e.profile is not None) + "."),
    force: bool = typer.Option(False, "--force", help="Replace PATH even if it is not a stand-in this tool wrote."),
):
    """Write an executable stand-in for a real engine: the embedded engine behind its interface (its variables, arguments,
    read pattern and lines), for `launch` and `autotune` where the real engine cannot run."""
    from core.errors import UsageError
    from engine_bridge.standin import STANDIN_MARK, launcher_text

    if engine not in ENGINES or ENGINES[engine].profile is None:
        names = ", ".join(n for n, e in ENGINES.items() if e.profile is not None)
        raise UsageError(f"--engine {engine!r}: use one of {names}")
    # a user's engine (or a link to one) at PATH is never replaced without --force
    path = check_output(path, "stand-in", lambda head: STANDIN_MARK in head, force=force)
    atomic_write_text(path, launcher_text(engine))
    os.chmod(path, 0o755)
    typer.echo(os.path.abspath(path))


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""
    app.command("export")(export_cmd)
    app.command("profiles")(profiles_cmd)
    app.command("launch")(launch_cmd)
    app.command("standin")(standin_cmd)
