"""The chain's steps after the copy, one function each, shared by `engine-bridge tune-rig` and
fleet's node job (docs/tune-rig.md): verify every member against a manifest, measure the drives
or reuse a result that still covers them, solve, export the profile and its N-1 profiles, and run
the real engine's trials. Each step that can reuse what it made before says so and why.

`plan_rig` is measure + solve + export, the part fleet and tune-rig must never do differently.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from core.errors import Interrupted
from core.events import Reporter
from core.rig import Rig
from replicas.checks import FilePiece

from .constants import MISMATCH, MISSING, OK, REUSE, RUN
from .coverage import MeasureChoice, choose_measure
from .settings import BenchSettings
from .state import changed, file_digest, identities, key_of, load_state, save_step

Say = Callable[[str, str, str], None]      # (step, action, why): one line per step, as it is decided


def _quiet(step: str, action: str, why: str) -> None:
    pass


def check_cancel(cancel: threading.Event | None, after: str) -> None:
    """Between steps: a first Ctrl-C stops here (every finished step is recorded)."""
    if cancel is not None and cancel.is_set():
        raise Interrupted(f"stopped after {after}; the steps done are kept: run the same command again to resume")


# ---- verify -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Checked:
    """One member as verify found it."""
    name: str
    path: str
    role: str
    state: str                       # identical / mismatch / broken / missing / unreadable
    bad: tuple[FilePiece, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class Verified:
    members: tuple[Checked, ...]
    problems: tuple[str, ...]
    recorded: bool                   # the manifest was the rig's own: stamps and verdicts written

    @property
    def status(self) -> str:
        states = {m.state for m in self.members}
        if states & {"mismatch", "broken"}:      # broken: a failed check, as in `replicas verify` (exit 1)
            return MISMATCH
        if states & {"missing", "unreadable"}:
            return MISSING
        return OK


def verify_rig(rig: Rig, manifest=None, where: str = "", mode: str = "quick", tap=None, report: Reporter = None,
               cancel: threading.Event | None = None) -> Verified:
    """Every member against `manifest` (None: the rig's own), as `replicas verify --manifest` does:
    stamps and verdicts only where it is the rig's own; `tap` takes the primary's upstream digests
    on the same reads. Never raises for what it finds: the states and one problem line each."""
    from replicas.verify import against, verify_members

    checked, record = against(rig, manifest, where)
    rep = verify_members(list(rig.members), checked, rig, mode=mode, record=record, tap=tap, report=report,
                         cancel=cancel)
    problems = []
    if not record:
        problems.append(f"the rig has another manifest than {where or 'the one given'} (checked against it; nothing "
                        "stamped)")
    rows = []
    for m in rep.members:
        rows.append(Checked(m.name, m.path, m.role, m.state, tuple(m.bad), m.detail or ""))
        if m.state in ("missing", "unreadable"):
            problems.append(f"{m.name} ({m.path}): {m.state}" + (f": {m.detail}" if m.detail else ""))
        elif m.bad:
            problems.append(f"{m.name}: repair with `replicas repair {m.path} --rig {rig.root}`")
        elif m.state == "broken":        # identical bytes that do not parse (docs/replicas.md, "A scrub also parses")
            problems.append(f"{m.name} ({m.path}): broken: {m.detail}")
    return Verified(tuple(rows), tuple(problems), record)


# ---- measure ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    path: str                        # the iobench result the next steps use
    result: object                   # its iobench.result.BenchResult
    action: str                      # RUN or REUSE
    why: str
    measured: tuple[str, ...] = ()   # the members measured on this run


def decide_measure(rig: Rig, manifest, measure: str = "auto", copied: Sequence[str] = ()) -> tuple[MeasureChoice, object]:
    """(what the measure step will do, the newest result or None), reading the rig and the drives'
    identities, writing nothing. `copied`: members the replicas step is about to copy (their files
    will be new)."""
    from core.errors import ReplicaTunerError
    from iobench.result import latest_result, result_files

    files = result_files(rig)
    previous = None
    if files:
        try:
            previous = latest_result(rig)
        except ReplicaTunerError:
            previous = None
    record = load_state(rig).get("measure") or {}
    recorded = record.get("members") if previous is not None and record.get("bench") == os.path.basename(files[-1]) else None
    now = identities(rig, manifest)
    for name in copied:
        if name in now:
            now[name] = dict(now[name], files=[["(to be copied)", None]])
    members = [(m.name, os.path.realpath(m.path), now[m.name]) for m in rig.members]
    drives = None
    if previous is not None:
        drives = [(d.name, os.path.realpath(d.path), d.drive.key if d.drive else "") for d in previous.drives
                  if d.model is not None]
    choice = choose_measure(members, drives, recorded, os.path.basename(files[-1]) if files else "",
                            always=measure == "always")
    return choice, previous


def measure_rig(rig: Rig, manifest, settings: BenchSettings = BenchSettings(), measure: str = "auto",
                report: Reporter = None, cancel: threading.Event | None = None) -> Measured:
    """The measure step: reuse the newest iobench result while it covers every member (the same
    drive by its identity, the same files since they were measured), else measure the members it
    does not cover — alone, the others' figures carried over — or, when a drive is new or another,
    every drive; the result is saved in the rig and recorded with the members' identities."""
    from iobench.bench import targets_from_rig
    from iobench.result import result_files, save_result
    from iobench.schedule import RunOptions

    choice, previous = decide_measure(rig, manifest, measure)
    if choice.action == REUSE:
        path = result_files(rig)[-1]
        _record_measure(rig, path, manifest)
        return Measured(path, previous, REUSE, choice.why)
    targets = targets_from_rig(rig)
    presets, why = _presets_for(settings.presets, len(targets))
    opts = RunOptions(presets=presets, lanes=tuple(settings.lanes), seconds=settings.seconds, repeat=settings.repeat)
    try:
        result = _bench(rig, choice, previous, targets, opts, report, cancel)
    except (Interrupted, KeyboardInterrupt):
        raise Interrupted("stopped while measuring; nothing half-measured is kept: run the same command again to "
                          "measure") from None
    path = save_result(rig, result)
    _record_measure(rig, path, manifest)
    return Measured(path, result, RUN, choice.why + why, choice.names)


def _presets_for(presets: Sequence[str], drives: int) -> tuple[tuple[str, ...], str]:
    """The presets to measure `drives` drives with, and what was left out and why (appended to the
    step's reason): the split presets cut reads over at most the shapes engine's sources, so a rig
    of more members (colibri reads up to five mirrors) is measured with the others."""
    from iobench.schedule import SPLIT_PRESETS
    from iobench.shapes import split_limit

    engine, limit = split_limit()
    if drives <= limit or not any(p in SPLIT_PRESETS for p in presets):
        return tuple(presets), ""
    kept = tuple(p for p in presets if p not in SPLIT_PRESETS) or ("seq",)
    left = "/".join(p for p in presets if p in SPLIT_PRESETS)
    return kept, (f"; {'/'.join(kept)} only: {left} cut each read over at most {limit} drives as {engine} does, "
                  f"and the rig has {drives}")


def _bench(rig: Rig, choice: MeasureChoice, previous, targets, opts, report, cancel):
    from iobench.bench import run_bench

    if choice.names == tuple(m.name for m in rig.members):
        return run_bench(targets, opts, previous=previous, report=report, cancel=cancel)
    # The drives are the same (their identity says so): what they share and how they do together is
    # carried over; the members whose files are new are measured alone.
    part = run_bench([t for t in targets if t.name in choice.names], replace(opts, together=False, topology=False),
                     previous=previous, report=report, cancel=cancel)
    return replace(part, drives=tuple(part.drive(m.name) if m.name in choice.names else previous.drive(m.name)
                                      for m in rig.members),
                   groups=previous.groups, together=previous.together, topology=previous.topology,
                   settings={**previous.settings, "remeasured": list(choice.names), "others_from": previous.created})


def _record_measure(rig: Rig, path: str, manifest) -> None:
    save_step(rig, "measure", {"bench": os.path.basename(path), "members": identities(rig, manifest)})


# ---- solve ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Solved:
    path: str
    plan: object                     # planner.plan.Plan
    action: str
    why: str
    notices: tuple[str, ...] = ()


def solve_inputs(rig: Rig, manifest, bench_path: str, engine: str, cache_experts: int | None) -> dict:
    return ({"rig": file_digest(rig.rig_file), "model": manifest.digest() if manifest is not None else "",
                   "bench": os.path.basename(bench_path), "engine": engine, "cache_experts": cache_experts})


def decide_solve(rig: Rig, inputs: dict, redo: bool = False) -> tuple[str, str, str]:
    """(action, why, the plan to reuse) of the solve step."""
    key = key_of(inputs)
    rec = load_state(rig).get("solve") or {}
    if redo:
        return RUN, "asked to solve again", ""
    if rec.get("key") == key and os.path.isfile(rec.get("plan", "")):
        return REUSE, (f"{os.path.basename(rec['plan'])} was solved on the same measurement, rig.toml, model and "
                       "engine"), rec["plan"]
    if rec.get("key") and not os.path.isfile(rec.get("plan", "")):
        return RUN, "the last plan's file is gone", ""
    return RUN, (f"{changed(rec, inputs)} changed since the last plan" if rec.get("key")
                 else "no plan of this chain yet"), ""


def solve_step(rig: Rig, manifest, bench_path: str, engine: str, cache_experts: int | None = None,
               redo: bool = False) -> Solved:
    from planner.plans import load_plan
    from planner.rigmodel import solve_rig

    inputs = solve_inputs(rig, manifest, bench_path, engine, cache_experts)
    action, why, path = decide_solve(rig, inputs, redo)
    if action == REUSE:
        return Solved(path, load_plan(path), REUSE, why)
    solved = solve_rig(rig.root, bench_path, engine, cache_experts=cache_experts)
    save_step(rig, "solve", {"key": key_of(inputs), "inputs": inputs, "plan": solved.path})
    return Solved(solved.path, solved.plan, RUN, why, tuple(solved.notices))


# ---- export -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Exported:
    profile: str                          # the profile's .env (or its first file)
    files: tuple[str, ...]
    fallbacks: tuple[tuple[str, str], ...]    # (drive, its N-1 profile)
    skipped: tuple[tuple[str, str], ...]      # (drive, why no N-1 profile)
    action: str
    why: str


def export_inputs(rig: Rig, plan_path: str, engine: str, name: str, cache: int | None, allow_unverified: bool) -> dict:
    return ({"rig": file_digest(rig.rig_file), "plan": plan_path, "engine": engine, "name": name, "cache": cache,
                   "allow_unverified": allow_unverified})


def decide_export(rig: Rig, inputs: dict, redo: bool = False) -> tuple[str, str, dict]:
    key = key_of(inputs)
    rec = load_state(rig).get("export") or {}
    if redo:
        return RUN, "asked to export again", {}
    if rec.get("key") == key:
        gone = [f for f in rec.get("files", []) + [p for _, p in rec.get("fallbacks", [])] if not os.path.isfile(f)]
        if not gone:
            return REUSE, f"{os.path.basename(rec['profile'])} and its N-1 profiles were exported from this plan", rec
        return RUN, f"{os.path.basename(gone[0])} is gone", {}
    return RUN, f"{changed(rec, inputs)} changed since the last export" if rec.get("key") else "no profile of this chain yet", {}


def export_step(rig: Rig, solved: Solved, engine: str, name: str, cache_experts: int | None = None,
                allow_unverified: bool = False, redo: bool = False, report: Reporter = None) -> Exported:
    """The profile of the plan for `engine` and its N-1 profiles (rig/profiles/NAME*); the cache is
    the one the plan was priced with unless one is given."""
    from engine_bridge.profiles.export import export_profile

    cache = cache_experts if cache_experts is not None else solved.plan.priced_cache
    inputs = export_inputs(rig, solved.path, engine, name, cache, allow_unverified)
    action, why, rec = decide_export(rig, inputs, redo)
    if action == REUSE:
        return Exported(rec["profile"], tuple(rec["files"]), tuple(tuple(x) for x in rec.get("fallbacks", ())),
                        tuple(tuple(x) for x in rec.get("skipped", ())), REUSE, why)
    res = export_profile(rig_root=rig.root, plan_path=solved.path, fmt=engine, name=name, cache_experts=cache,
                         allow_unverified=allow_unverified, report=report)
    profile = next((f for f in res.files if f.endswith(".env")), res.files[0])
    save_step(rig, "export", {"key": key_of(inputs), "inputs": inputs, "profile": profile, "files": list(res.files),
                              "fallbacks": [list(x) for x in res.fallbacks], "skipped": [list(x) for x in res.skipped]})
    return Exported(profile, tuple(res.files), tuple(res.fallbacks), tuple(res.skipped), RUN, why)


# ---- measure + solve + export: one implementation for tune-rig and fleet -------------------------

@dataclass(frozen=True)
class Planned:
    measured: Measured
    solved: Solved
    exported: Exported


def plan_rig(rig: Rig, manifest, engine: str, *, profile: str, bench: BenchSettings = BenchSettings(),
             measure: str = "auto", cache_experts: int | None = None, allow_unverified: bool = False,
             redo: bool = False, say: Say = _quiet, report: Reporter = None,
             cancel: threading.Event | None = None) -> Planned:
    """Measure (or reuse), solve (or reuse), export (or reuse) — `say` gets each step's line as it
    is decided. A step that runs makes the ones after it run (their inputs are new)."""
    measured = measure_rig(rig, manifest, bench, measure, report=report, cancel=cancel)
    say("measure", measured.action, measured.why)
    check_cancel(cancel, "measure")
    solved = solve_step(rig, manifest, measured.path, engine, cache_experts, redo=redo)
    say("solve", solved.action, solved.why)
    check_cancel(cancel, "solve")
    exported = export_step(rig, solved, engine, profile, cache_experts, allow_unverified, redo=redo, report=report)
    say("export", exported.action, exported.why)
    return Planned(measured, solved, exported)
