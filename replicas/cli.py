"""`replicas`: keep byte-identical copies of a model on several drives, and prove it."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import List, Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from core import rig as rigmod
from core.cli import JsonOption, RigOption, err, make_app, out, print_json, run
from core.errors import Interrupted, MissingError, UsageError
from core.events import Notice
from core.units import format_bytes, format_rate, parse_size

from .drives import drive_label
from .hashing import hash_file
from .manifest import manifest_to_dict
from .manifests import load_manifest
from .repair import repair_member
from .status import member_status
from .sync import sync as sync_files
from .verify import verify_members

app = make_app("replicas", "Keep byte-identical replicas of a model file on several drives, and prove they are identical.")


@contextmanager
def live_progress(enabled: bool = True):
    """Render progress events on stderr, one bar per task (destination / member); Ctrl-C sets
    the cancel flag so durable work is journaled before the command exits."""
    cancel = threading.Event()
    bars = Progress(TextColumn("{task.description}"), TextColumn("[dim]{task.fields[phase]}"), BarColumn(),
                    DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(), console=err,
                    transient=False, disable=not enabled or not err.is_terminal and not os.environ.get("REPLICAS_PROGRESS"))
    tasks: dict[tuple[str, str], int] = {}
    lock = threading.Lock()

    def report(ev):
        if isinstance(ev, Notice):
            err.print(f"[dim]{ev.task}:[/] {ev.message}")
            return
        key = (ev.task, ev.phase)
        with lock:
            if key not in tasks:
                tasks[key] = bars.add_task(ev.task, total=ev.total, phase=ev.phase)
            bars.update(tasks[key], completed=ev.done, total=ev.total)

    previous = signal.getsignal(signal.SIGINT)

    def on_int(signum, frame):
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        err.print("[yellow]interrupting: finishing durable pieces (Ctrl-C again to abort now)[/]")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_int)
    try:
        with bars:
            yield report, cancel
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)


def _rig(rig_opt):
    return rigmod.load_rig(rigmod.rig_dir(rig_opt))


def _piece_json(b):
    return {"index": b.index, "offset": b.offset, "length": b.length}


@app.command()
def init(rig: Optional[str] = RigOption,
         model: str = typer.Option(..., "--model", metavar="PATH", help="The model file (the engine's -m, the primary)."),
         name: Optional[str] = typer.Option(None, "--name", help="Drive label for the model (default: its mount point's name).")):
    """Create rig.toml naming the model (the primary); replicas are added by `replicas sync`."""
    root = rigmod.rig_dir(rig)
    if not os.path.exists(model):
        raise MissingError(f"{model}: no such file; give the model file with --model")
    if not os.path.isfile(model):
        raise UsageError(f"{model}: not a regular file; give the model file with --model")
    current = rigmod.load_rig(root, must_exist=False)
    updated = rigmod.with_model(current, model, name or drive_label(model))
    rigmod.save_rig(updated)
    err.print(f"rig at {root}: model {updated.model.path} on drive '{updated.model.name}'")


@app.command("hash")
def hash_cmd(path: str = typer.Argument(..., help="File to hash."),
             piece_size: str = typer.Option("64M", "--piece-size", help="Piece size (binary units: 64M = 64 MiB)."),
             json_out: bool = JsonOption):
    """Print the file's BLAKE3 as b3sum does (`<hex>  <path>`), read cold; --json adds size and piece hashes."""
    if not os.path.exists(path):
        raise MissingError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: not a regular file")
    with live_progress() as (report, cancel):
        m = hash_file(path, parse_size(piece_size, "--piece-size"), report=report, cancel=cancel)
    if json_out:
        print_json({**manifest_to_dict(m), "path": path})
    else:
        typer.echo(f"{m.blake3}  {path}")


@app.command()
def sync(source: str = typer.Argument(..., help="The model file to copy (read-only)."),
         dest_dirs: List[str] = typer.Argument(..., metavar="DEST_DIR...", help="Directories (one per drive) to copy into, under the same name."),
         rig: Optional[str] = RigOption,
         piece_size: str = typer.Option("64M", "--piece-size", help="Manifest piece size (binary units)."),
         dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be copied, write nothing."),
         no_verify: bool = typer.Option(False, "--no-verify", help="Skip the cold read-back (the replica stays unverified)."),
         replace: bool = typer.Option(False, "--replace", help="Overwrite an existing different file at a destination (atomically, after the copy verifies)."),
         allow_same_device: bool = typer.Option(False, "--allow-same-device", help="Allow a destination on the same physical drive as another member."),
         json_out: bool = JsonOption):
    """Copy SOURCE into every DEST_DIR at once: one read fanned out, resumable, verified, stamped.

    Interrupted copies resume where the durable pieces end. Records the model and replicas in
    rig.toml and the content identity in manifest.json.
    """
    with live_progress() as (report, cancel):
        res = sync_files(source, dest_dirs, rigmod.rig_dir(rig), piece_size=parse_size(piece_size, "--piece-size"),
                         dry_run=dry_run, verify=not no_verify, replace_existing=replace,
                         allow_same_device=allow_same_device, report=report, cancel=cancel)
    if json_out:
        print_json({"schema": 1, "kind": "sync", "source": res.source, "size": res.size, "blake3": res.blake3,
                    "piece_size": res.piece_size, "dry_run": res.dry_run, "source_bytes_read": res.source_bytes_read,
                    "seconds": round(res.seconds, 3), "exit_code": res.exit_code,
                    "destinations": [{**{k: v for k, v in dataclasses.asdict(d).items() if k != "bad"},
                                      "bad": [_piece_json(b) for b in d.bad]} for d in res.dests]})
    else:
        t = Table(title=f"sync {res.source} ({format_bytes(res.size)})" + (" — dry run" if res.dry_run else ""))
        for col in ("destination", "action", "outcome", "written", "rate", "stamp", "note"):
            t.add_column(col)
        for d in res.dests:
            rate = format_rate(d.bytes_written / d.seconds) if d.seconds and d.bytes_written else ""
            written = format_bytes(d.bytes_to_write if res.dry_run else d.bytes_written)
            t.add_row(d.target, d.action, d.outcome, written, rate, d.stamped or "", d.error)
        out.print(t)
        for d in res.dests:
            for b in d.bad[:20]:
                err.print(f"{d.target}: bad piece {b.index} at byte {b.offset}, {b.length} bytes")
    if res.exit_code:
        raise typer.Exit(res.exit_code)


@app.command()
def verify(paths: Optional[List[str]] = typer.Argument(None, metavar="[PATH...]", help="Members to check (default: all)."),
           rig: Optional[str] = RigOption,
           full: bool = typer.Option(False, "--full", help="Re-read every byte cold, whatever the stamps say."),
           sample: Optional[float] = typer.Option(None, "--sample", metavar="PCT", min=0.0, max=100.0,
                                                  help="Check a random PCT%% of the pieces of each member (cold)."),
           seed: Optional[int] = typer.Option(None, "--seed", help="Seed for --sample (printed when omitted)."),
           json_out: bool = JsonOption):
    """Prove members identical to the manifest.

    Quick (default) trusts a stamp while size, mtime_ns, inode and device all still match, and
    re-reads the rest; --full re-reads everything; --sample PCT checks a random subset of pieces.
    Exit 0 all identical, 1 a mismatch, 3 a member missing or unreadable, 2 bad usage.
    """
    if full and sample is not None:
        raise UsageError("--full and --sample exclude each other")
    r = _rig(rig)
    manifest = load_manifest(r)
    members = [r.member(p) for p in paths] if paths else list(r.members)
    if not members:
        raise UsageError(f"the rig at {r.root} has no members; run `replicas sync` first")
    mode = "full" if full else "sample" if sample is not None else "quick"
    with live_progress() as (report, cancel):
        rep = verify_members(members, manifest, r, mode=mode, sample=sample, seed=seed, report=report, cancel=cancel)
    if cancel.is_set():
        raise Interrupted("verification interrupted; nothing was stamped for unfinished members")
    if json_out:
        print_json({"schema": 1, "kind": "verify", "manifest_blake3": manifest.blake3, "mode": mode,
                    "sample_seed": rep.sample_seed, "seconds": round(rep.seconds, 3), "exit_code": rep.exit_code,
                    "members": [{**{k: v for k, v in dataclasses.asdict(m).items() if k != "bad"},
                                 "bad": [_piece_json(b) for b in m.bad]} for m in rep.members]})
    else:
        t = Table(title=f"verify ({mode}) against {manifest.blake3[:16]}…")
        for col in ("member", "path", "state", "how", "read", "rate", "note"):
            t.add_column(col)
        for m in rep.members:
            rate = format_rate(m.bytes_read / m.seconds) if m.bytes_read and m.seconds else ""
            note = m.detail or (f"{len(m.bad)} bad pieces" if m.bad else "") or (f"stamped ({m.stamped})" if m.stamped else "")
            style = {"identical": "green", "mismatch": "red"}.get(m.state, "yellow")
            t.add_row(m.name, m.path, f"[{style}]{m.state}[/]", m.how, format_bytes(m.bytes_read), rate, note)
        out.print(t)
        if rep.sample_seed is not None:
            err.print(f"sample seed {rep.sample_seed} (repeat with --seed {rep.sample_seed})")
        for m in rep.members:
            for b in m.bad:
                err.print(f"{m.path}: bad piece {b.index} at byte {b.offset}, {b.length} bytes")
    if rep.exit_code:
        raise typer.Exit(rep.exit_code)


@app.command()
def repair(path: str = typer.Argument(..., help="The replica to repair."),
           rig: Optional[str] = RigOption,
           from_: Optional[str] = typer.Option(None, "--from", metavar="PATH", help="Member to copy good pieces from (default: any member whose piece verifies)."),
           json_out: bool = JsonOption):
    """Re-copy only the bad pieces of a replica from a member whose pieces verify, then verify again."""
    r = _rig(rig)
    manifest = load_manifest(r)
    target = r.member(path)
    donors = [r.member(from_)] if from_ else [m for m in r.members if m.path != target.path]
    if any(d.path == target.path for d in donors):
        raise UsageError("--from names the replica being repaired; give another member")
    with live_progress() as (report, cancel):
        res = repair_member(target, donors, manifest, r, report=report, cancel=cancel)
    if json_out:
        print_json({"schema": 1, "kind": "repair", "path": res.path, "donor": res.donor, "bytes_copied": res.bytes_copied,
                    "repaired": [_piece_json(b) for b in res.repaired], "after": res.after.state,
                    "seconds": round(res.seconds, 3)})
    else:
        if not res.repaired and res.after.state == "identical":
            out.print(f"{res.path}: already identical; nothing to repair")
        else:
            out.print(f"{res.path}: re-copied {len(res.repaired)} pieces ({format_bytes(res.bytes_copied)}) from {res.donor}; now {res.after.state}")
    if res.after.state != "identical":
        raise typer.Exit(1)


@app.command()
def status(rig: Optional[str] = RigOption, json_out: bool = JsonOption):
    """One row per member: path, drive, size, stamp state and last full verification (reads no data)."""
    r = _rig(rig)
    manifest = load_manifest(r, required=False)
    rows = member_status(r, manifest)
    if json_out:
        print_json({"schema": 1, "kind": "status", "rig": r.root, "manifest_blake3": manifest.blake3 if manifest else None,
                    "members": [dataclasses.asdict(x) for x in rows]})
        return
    t = Table(title=f"rig {r.root}" + (f" — model {format_bytes(manifest.size)}, BLAKE3 {manifest.blake3[:16]}…" if manifest else " — no manifest yet"))
    for col in ("name", "role", "path", "drive", "fs", "device", "size", "state", "last full verify"):
        t.add_column(col)
    for x in rows:
        style = {"verified": "green", "stale": "yellow", "missing": "red"}.get(x.state, "")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(x.last_verified)) if x.last_verified else "never"
        t.add_row(x.name, x.role, x.path, x.mount_point, x.fs_type, f"{x.device} ({x.disk})",
                  format_bytes(x.size) if x.size is not None else "—", f"[{style}]{x.state}[/]" if style else x.state, when)
    out.print(t)


def main() -> None:
    # A write past RLIMIT_FSIZE must be an error we report, not a signal that kills us mid-copy.
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    run(app, "replicas")


if __name__ == "__main__":
    main()
