"""`replicas`: keep byte-identical copies of a model on several drives, and prove it."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from contextlib import contextmanager, nullcontext
from typing import List, Optional

import typer
from rich.markup import escape

from core import rig as rigmod
from core.cli import JsonOption, QuietOption, RigOption, err, finish, make_app, out, print_result, run
from core.errors import EXIT_MISMATCH, EXIT_MISSING, Interrupted, ReplicaTunerError, UsageError
from core.interrupt import cancel_on_interrupt
from core.events import Notice
from core.results import ErrorResult
from core.rig import Member
from core.constants import UPSTREAM_FILE
from core.units import format_bytes, format_rate, parse_size, plural

from .pacing import parse_rate

# Each command imports the modules only it needs, in its body: a command's start-up pays for
# itself alone (`replicas verify --full` of a model in RAM keeps b3sum's pace, docs/replicas.md
# "Hashing at the drives' pace").


app = make_app("replicas", "Keep byte-identical replicas of a model file on several drives, and prove they are identical.")


MaxRateOption = typer.Option(None, "--max-rate", metavar="RATE",
                             help="Pace each drive to at most RATE bytes per second, in decimal units "
                                  "(500M = 500 MB/s), so a drive that serves the model keeps serving.")


SYNC_STOPPED = "sync interrupted; durable pieces are kept: run the same command again to resume"


def _rate(text: Optional[str]) -> Optional[float]:
    return parse_rate(text, "--max-rate") if text is not None else None


def _bars():
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from core.ratecolumn import AverageRateColumn

    return Progress(TextColumn("{task.description}"), TextColumn("[dim]{task.fields[phase]}"), BarColumn(),
                    DownloadColumn(binary_units=True), AverageRateColumn(), TimeRemainingColumn(), console=err,
                    transient=False)


@contextmanager
def live_progress(enabled: bool = True):
    """Render progress events on stderr, one bar per task (destination / member); Ctrl-C sets
    the cancel flag so durable work is journaled before the command exits (the one Ctrl-C policy,
    `core.interrupt.cancel_on_interrupt`). Not `enabled` (--quiet): no bars and no notices, but
    warnings (a Notice marked `warning`) still print."""
    drawn = enabled and (err.is_terminal or bool(os.environ.get("REPLICAS_PROGRESS")))
    bars = _bars() if drawn else nullcontext()      # no bars: Rich's progress machinery is never loaded
    tasks: dict[tuple[str, str], int] = {}
    lock = threading.Lock()

    def report(ev):
        if isinstance(ev, Notice):
            if enabled or ev.warning:
                err.print(f"[dim]{escape(ev.task)}:[/] {escape(ev.message)}")
            return
        if not drawn:
            return
        key = (ev.task, ev.phase)
        with lock:
            if key not in tasks:
                tasks[key] = bars.add_task(ev.task, total=ev.total, phase=ev.phase)
            bars.update(tasks[key], completed=ev.done, total=ev.total)

    with cancel_on_interrupt(err.print, "[yellow]interrupting: finishing durable pieces (Ctrl-C again to abort now)[/]") \
            as cancel, bars:
        yield report, cancel


def _rig(rig_opt):
    return rigmod.load_rig(rigmod.rig_dir(rig_opt))


@app.command()
def init(rig: Optional[str] = RigOption,
         model: str = typer.Option(..., "--model", metavar="PATH",
                                   help="The model (the engine's -m, the primary): a GGUF or safetensors file, any "
                                        "file of a split GGUF set (the whole set is taken), or a model directory."),
         fmt: Optional[str] = typer.Option(None, "--format", metavar="FORMAT",
                                           help="gguf, safetensors, or raw to take any file or directory as opaque bytes "
                                                "(default: found from the files' first bytes)."),
         name: Optional[str] = typer.Option(None, "--name", help="Drive label for the model (default: its mount point's name)."),
         json_out: bool = JsonOption):
    """Create rig.toml naming the model (the primary) and every file of it; replicas are added by
    `replicas sync`."""
    from core.drives import drive_label
    from models.modelset import FILE, check_outside_members
    from . import views

    root = rigmod.rig_dir(rig)
    found = _discover(model, fmt, "pass --format raw to replicate it as opaque bytes")
    current = rigmod.load_rig(root, must_exist=False)
    check_outside_members(root, found, current, f"the rig folder {root}")
    if current.model and os.path.realpath(current.model.path) == os.path.realpath(found.path) and current.format \
            and (current.layout, tuple(current.files)) != (found.layout, found.files):
        raise UsageError(f"the rig at {root} lists other files for {found.path} ({len(current.files)} then, "
                         f"{len(found.files)} now); a changed model needs a new rig: pass another --rig")
    updated = rigmod.with_model(current, found.path, name or drive_label(found.path), found.layout, found.format,
                                found.files)
    rigmod.save_rig(updated)
    if json_out:
        print_result(views.InitView(root, updated.model.path, updated.model.name, found.layout, found.format, tuple(found.files)))
    what = "" if found.layout == FILE else f" ({found.layout}, {plural(len(found.files), 'file')})"
    err.print(f"rig at {root}: model {escape(updated.model.path)}{what}, {found.format}, on drive '{updated.model.name}'")


@app.command("hash")
def hash_cmd(paths: List[str] = typer.Argument(..., metavar="FILE", help="Files or models to hash (with --check: b3sum check "
                                                                         "files; - reads standard input)."),
             check: bool = typer.Option(False, "--check", "-c", help="Read b3sum check files and check every file they name, "
                                                                     "as `b3sum --check` does."),
             piece_size: str = typer.Option("64M", "--piece-size", help="Piece size for --json (binary units: 64M = 64 MiB)."),
             fmt: Optional[str] = typer.Option(None, "--format", metavar="FORMAT",
                                               help="For a directory: raw takes any files as the model (default: a "
                                                    "GGUF or safetensors model directory)."),
             json_out: bool = JsonOption):
    """Print each file's BLAKE3 as b3sum does (`<hex>  <name>`), read cold; --json adds size and
    piece hashes (a manifest another host can verify against with `verify --manifest`).

    A model directory or any file of a split GGUF set is hashed file by file (one line each) and
    its --json is the model's manifest (schema 2, every file and the model digest).
    With --check: `NAME: OK` or `NAME: FAILED` per line of the check files, failures counted on
    stderr; exit 1 when any failed. Exit 3 when a file to hash is missing or unreadable.
    """
    from .hashing import check_piece_size
    from . import views

    if check:
        _check_sums(paths, json_out)
        return
    size = check_piece_size(parse_size(piece_size, "--piece-size"))
    docs, failures = [], []
    with live_progress() as (report, cancel):
        for path in paths:
            try:
                docs.append(_hash_one(path, size, fmt, json_out, report, cancel))
            except Interrupted:
                raise
            except ReplicaTunerError as e:
                failures.append(e)
                typer.echo(f"replicas: error: {e}", err=True)
    if json_out:
        if failures and not docs:           # nothing hashed: the failure is the result
            worst = max(failures, key=lambda e: e.exit_code)
            print_result(ErrorResult(str(worst), worst.exit_code))
        else:
            print_result(views.ManifestView(docs[0]) if len(paths) == 1 else views.HashesView(tuple(docs)))
    finish(max((e.exit_code for e in failures), default=0))


def _hash_one(path: str, size: int, fmt: Optional[str], json_out: bool, report, cancel) -> dict:
    """Hash one argument: a plain file (its b3sum line; --json: its one-file manifest) or a model
    of several files (a line per file; --json: the model's manifest)."""
    from .hashing import hash_file, hash_whole
    from .b3sum import format_line
    from .manifest import ModelManifest, manifest_to_dict, model_manifest_to_dict
    from models.modelset import DIR

    model = _model_at(path, fmt)
    if model is None:
        if os.path.exists(path) and not os.path.isfile(path):
            raise UsageError(f"{path}: not a regular file")
        if not json_out:      # b3sum's line needs the whole-file hash only: each byte hashed once
            digest = hash_whole(path, report=report, cancel=cancel)
            typer.echo(format_line(digest, path))
            return {"blake3": digest, "path": path}
        m = hash_file(path, size, report=report, cancel=cancel)
        return {**manifest_to_dict(m), "path": path}
    shown = path if model.layout == DIR else os.path.dirname(path)
    files = []
    for rel, full in zip(model.files, model.paths):
        if not json_out:
            typer.echo(format_line(hash_whole(full, report=report, cancel=cancel),
                                   os.path.join(shown, *rel.split("/")) if shown else rel))
            continue
        files.append(dataclasses.replace(hash_file(full, size, report=report, cancel=cancel), name=rel))
    if not json_out:
        return {"path": model.path}
    return {**model_manifest_to_dict(ModelManifest(tuple(files), model.layout, model.format)), "path": model.path}


def _discover(path: str, fmt: Optional[str], raw_hint: str):
    """models.modelset.discover, with this command's way to take bytes that are no model format."""
    from models.modelset import NotAModel, discover

    try:
        return discover(path, fmt)
    except NotAModel as e:
        raise NotAModel(e.what, raw_hint) from None


def _model_at(path: str, fmt: Optional[str]):
    """The model of several files at `path` (a directory, or a file of a split GGUF set), else None."""
    from models.formats import GGUF, SPLIT_NAME, sniff
    from models.modelset import discover

    if os.path.isdir(path):
        return _discover(path, fmt, "pass --format raw to hash its files as they are")
    match = SPLIT_NAME.match(os.path.basename(path))
    if os.path.isfile(path) and match and int(match["count"]) > 1 and sniff(path) == GGUF:
        return discover(path)
    return None


def _check_sums(files: List[str], json_out: bool) -> None:
    from .b3sum import check_line, failures_warning
    from .checksums import check_files
    from . import views

    results = []
    for res in check_files(files):
        results.append(res)
        if not json_out:
            typer.echo(check_line(res.name, res.ok, res.reason))
    failed = sum(not r.ok for r in results)
    if json_out:
        print_result(views.CheckView(tuple(results)))
    if failed:
        typer.echo(failures_warning("replicas", failed), err=True)
    finish(EXIT_MISMATCH if failed else 0)


@app.command()
def sync(source: str = typer.Argument(..., metavar="SOURCE", help="The model to copy (read-only): its file, any member of "
                                                                  "its split GGUF set, or its directory."),
         dest_dirs: Optional[List[str]] = typer.Argument(None, metavar="DEST_DIR",
                                                         help="Directories (one per drive) to copy the model into, under its "
                                                              "own name (default: the folders of the rig's RAM members that "
                                                              "are gone, to restore them)."),
         rig: Optional[str] = RigOption,
         piece_size: str = typer.Option("64M", "--piece-size", help="Manifest piece size (binary units)."),
         dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be copied, write nothing."),
         no_verify: bool = typer.Option(False, "--no-verify", help="Skip the cold read-back (the replica stays unverified)."),
         replace: bool = typer.Option(False, "--replace", help="Overwrite an existing different file at a destination "
                                                               "(atomically, after the copy verifies)."),
         allow_same_device: bool = typer.Option(False, "--allow-same-device", help="Allow a destination on the same physical "
                                                                                   "drive as another member."),
         max_rate: Optional[str] = MaxRateOption,
         partial: Optional[str] = typer.Option(None, "--partial", metavar="SIZE",
                                               help="Make each DEST_DIR a partial replica of at most SIZE (64G, 25%, or "
                                                    "auto: its free space less a reserve): the shards carrying the most "
                                                    "cache-miss bytes, sized to its bandwidth share; run again to grow, "
                                                    "shrink or re-balance it."),
         quiet: bool = QuietOption,
         json_out: bool = JsonOption):
    """Copy the model at SOURCE into every DEST_DIR at once: one read of each file fanned out, resumable, verified, stamped.

    Files in order; interrupted copies resume where the durable pieces end. A split set's first
    file and a directory model appear under their final names only when every file verified.
    Records the model and replicas in rig.toml and the content identity in manifest.json. Warns
    when the rig will hold more copies than the target engine reads (allowed: plans choose which
    to use), and of the RAM a copy in tmpfs takes (it vanishes at reboot). With no DEST_DIR, copies
    again the rig's RAM members that are gone.
    """
    from rich.table import Table
    from .sync import sync as sync_files
    from . import views

    rate = _rate(max_rate)
    with live_progress(not quiet) as (report, cancel):
        try:
            res = sync_files(source, list(dest_dirs or ()), rigmod.rig_dir(rig),
                             piece_size=parse_size(piece_size, "--piece-size"),
                             dry_run=dry_run, verify=not no_verify, replace_existing=replace,
                             allow_same_device=allow_same_device, report=report, cancel=cancel, max_rate=rate,
                             partial=partial)
        except (Interrupted, KeyboardInterrupt):     # wherever it landed: the copy or its read-back
            raise Interrupted(SYNC_STOPPED) from None
    if not res.dry_run:
        _keep_snapshot_digests(rigmod.rig_dir(rig), quiet)
    if json_out:
        print_result(res)
    else:
        for line in views.partial_lines(res.partial):
            err.print(line, soft_wrap=True, highlight=False)
        t = Table(title=f"sync {res.source} ({format_bytes(res.size)})" + (" — dry run" if res.dry_run else ""))
        for col in ("destination", "action", "outcome", "written", "rate", "stamp", "note"):
            t.add_column(col)
        for d in res.dests:
            rate = format_rate(d.bytes_written / d.seconds) if d.seconds and d.bytes_written else ""
            written = format_bytes(d.bytes_to_write if res.dry_run else d.bytes_written)
            t.add_row(d.target, d.action, d.outcome, written, rate, d.stamped or "", d.error)
        out.print(t)
        for d in res.dests:
            for f in d.files or (d,):     # a set names each failing file, and its bad pieces by file
                if len(d.files) > 1 and f.outcome == "failed":
                    err.print(f"{f.target}: {f.error}", soft_wrap=True)
                for b in f.bad[:20]:
                    err.print(f"{f.target}: bad piece {b.index} at byte {b.offset}, {b.length} bytes", soft_wrap=True)
            if d.extra:
                err.print(f"{d.target}: kept {len(d.extra)} file(s) the model does not have: {', '.join(d.extra)}",
                          soft_wrap=True)
            if d.dropped:
                err.print(f"{d.target}: removed {len(d.dropped)} copy(ies) the partial replica no longer holds: "
                          f"{', '.join(d.dropped)}", soft_wrap=True)
    finish(res.exit_code)


def _keep_snapshot_digests(root: str, quiet: bool) -> None:
    """A model that is a Hugging Face cache snapshot names each file's published digest in its blob
    (docs/replicas.md, "Upstream digests"): recorded once into rig/upstream.json after the first
    sync that hashed it, so `verify --upstream` can tie every copy to the hub without another step."""
    from models.modelset import DIR, hf_repository
    from .manifests import load_manifest
    from .upstreams import record_upstream, save_upstream

    r = rigmod.load_rig(root, must_exist=False)
    if r.model is None or r.layout != DIR or hf_repository(r.model.path) is None \
            or os.path.lexists(os.path.join(root, UPSTREAM_FILE)):
        return
    manifest = load_manifest(r, required=False)
    if manifest is None:
        return
    try:
        path = save_upstream(r, record_upstream(r.model.path, manifest))
    except ReplicaTunerError:
        return                       # links without digest-named blobs: `replicas upstream` says why
    if not quiet:
        err.print(f"upstream digests of the Hugging Face snapshot recorded in {path} (`replicas verify --upstream {path}`)",
                  soft_wrap=True, highlight=False, markup=False)


@app.command()
def verify(paths: Optional[List[str]] = typer.Argument(None, metavar="PATH", help="Members to check (default: all); with "
                                                                                  "--manifest, any files."),
           rig: Optional[str] = RigOption,
           full: bool = typer.Option(False, "--full", help="Re-read every byte cold, whatever the stamps say."),
           resume: bool = typer.Option(False, "--resume", help="Continue an interrupted --full verification where each "
                                                               "member stopped (implies --full)."),
           sample: Optional[float] = typer.Option(None, "--sample", metavar="PCT", min=0.0, max=100.0,
                                                  help="Check a random PCT% of the pieces of each member (cold)."),
           seed: Optional[int] = typer.Option(None, "--seed", help="Seed for --sample (printed when omitted)."),
           manifest_file: Optional[str] = typer.Option(None, "--manifest", metavar="FILE",
                                                       help="Verify against this manifest (e.g. manifest.json from another host, "
                                                            "or `replicas hash --json`) instead of the rig's."),
           upstream: Optional[str] = typer.Option(None, "--upstream", metavar="FILE",
                                                  help="Also check each member against the model's published digests "
                                                       "(rig/upstream.json from `replicas upstream`), on verify's own reads "
                                                       "where it reads a file whole, else in a read of their own."),
           max_rate: Optional[str] = MaxRateOption,
           quiet: bool = QuietOption,
           json_out: bool = JsonOption):
    """Prove members identical to the manifest, every file of the model on each.

    Quick (default) trusts a file's stamp while its size, mtime_ns, inode and device all still
    match, and re-reads the rest; --full re-reads everything; --sample PCT checks a random subset
    of pieces. The verdict per file is kept in the rig (`replicas status` shows it); Ctrl-C during
    --full keeps each file's progress for --resume.
    Exit 0 all identical, 1 a mismatch, 3 a file missing or unreadable, 2 bad usage.
    """
    from .manifests import files_of_model, load_manifest_file
    from .verify import against, verify_members
    from . import views

    full = full or resume
    if full and sample is not None:
        raise UsageError("--full (or --resume) and --sample exclude each other")
    rate = _rate(max_rate)
    r = rigmod.load_rig(rigmod.rig_dir(rig), must_exist=not (manifest_file and paths))
    manifest, record = against(r, load_manifest_file(manifest_file) if manifest_file else None, manifest_file or "",
                               any_files=bool(paths))
    narrowed = files_of_model(manifest, paths) if manifest_file and paths else None
    if narrowed:          # files of a directory model, given one by one: each against its own entry
        root, manifest = narrowed
        members = [Member(root, os.path.basename(root), "file")]
    else:
        members = [_member_or_file(r, p, manifest_file is not None) for p in paths] if paths else list(r.members)
    if not members:
        raise UsageError(f"the rig at {r.root} has no members; run `replicas sync` first")
    mode = "full" if full else "sample" if sample is not None else "quick"
    published = tap = None
    if upstream:
        from .upstreams import UpstreamTap, load_upstream

        published = load_upstream(upstream)
        # The upstream digests ride on verify's own whole-file reads; files it does not read get their own pass.
        tap = UpstreamTap(members, manifest, published) if published else None
    # Whenever the Ctrl-C lands (in a read, between members, after the last piece, or a second
    # Ctrl-C that aborts at once), the message says how to go on.
    stopped = ("verification interrupted; the pieces done are kept: continue with `replicas verify --full --resume`"
               if mode == "full" and record else
               "verification interrupted; nothing was stamped for unfinished members: run it again")
    with live_progress(not quiet) as (report, cancel):
        try:
            rep = verify_members(members, manifest, r, mode=mode, sample=sample, seed=seed, report=report, cancel=cancel,
                                 max_rate=rate, resume=resume, record=record, tap=tap)
        except (Interrupted, KeyboardInterrupt):
            raise Interrupted(stopped) from None
    if cancel.is_set():
        raise Interrupted(stopped)
    ups = _check_upstream(published, tap, members, manifest, quiet) if published else {}
    if json_out:
        print_result(views.VerifyView(rep, manifest, manifest_file, mode, ups if upstream else None))
    else:
        out.print(views.verify_table(rep, manifest, manifest_file, mode))
        if rep.sample_seed is not None:
            err.print(f"sample seed {rep.sample_seed} (repeat with --seed {rep.sample_seed})")
        for line in views.verify_problems(rep):
            err.print(line, soft_wrap=True)
        for path, c in ups.items():
            err.print(f"{path}: upstream digests: {c.state}" + (f" ({c.checked} file(s) hashed)" if c.checked else ""),
                      soft_wrap=True, markup=False)
            for line in c.problems:
                err.print(line, soft_wrap=True, markup=False)
    code = rep.exit_code
    if any(c.state == "mismatch" for c in ups.values()):
        code = EXIT_MISMATCH
    elif any(c.state == "missing" for c in ups.values()) and not code:
        code = EXIT_MISSING
    finish(code)


def _check_upstream(upstream, tap, members, manifest, quiet: bool) -> dict:
    """Each member's copy against the upstream digests: those verify's reads took, and a pass of
    their own for the files verify did not read whole (a live stamp, a sample)."""
    from .upstreams import check_upstream

    out_ = {}
    with live_progress(not quiet) as (report, cancel):
        for m in members:
            out_[m.path] = check_upstream(m, manifest, upstream, report=report, cancel=cancel, known=tap.known(m.path))
    if cancel.is_set():
        raise Interrupted("upstream check interrupted")
    return out_


@app.command("upstream")
def upstream_cmd(source: str = typer.Argument(..., metavar="SOURCE",
                                              help="A Hugging Face cache snapshot folder, a sha256sum file or an OCI "
                                                   "image manifest."),
                 rig: Optional[str] = RigOption, json_out: bool = JsonOption):
    """Record the model's published digests (SHA-256 per file) in rig/upstream.json, from what you
    have: a Hugging Face snapshot (its blob names), a sha256sum file or an OCI manifest's layers.
    `replicas verify --upstream rig/upstream.json` and `fleet run` check copies against them."""
    from .manifests import load_manifest
    from .upstreams import record_upstream, save_upstream

    r = _rig(rig)
    up = record_upstream(source, load_manifest(r))
    path = save_upstream(r, up)
    if json_out:
        print_result(up)
    else:
        for f in up.files:
            out.print(f"{f.algorithm}  {f.digest}  {f.path}", markup=False, highlight=False, soft_wrap=True)
    err.print(f"wrote {path} ({len(up.files)} of {len(load_manifest(r).files)} file(s) have a published digest)",
              markup=False)


def _member_or_file(r, path: str, any_file: bool) -> Member:
    """A rig member by path or name; with --manifest, any other file too (checked, never stamped)."""
    from core.fsutil import describe_link

    try:
        return r.member(path)
    except UsageError:
        if not any_file:
            raise
    bad = describe_link(path)
    if bad:
        raise UsageError(f"{path}: {bad}; give the model's file or directory")
    return Member(os.path.abspath(path), os.path.basename(path) or path, "file")


@app.command()
def repair(path: str = typer.Argument(..., metavar="PATH", help="The replica to repair (its path or drive name)."),
           rig: Optional[str] = RigOption,
           from_: Optional[str] = typer.Option(None, "--from", metavar="PATH", help="Member to copy good pieces from "
                                                                                    "(default: any member whose piece "
                                                                                    "verifies)."),
           max_rate: Optional[str] = MaxRateOption,
           quiet: bool = QuietOption,
           json_out: bool = JsonOption):
    """Re-copy only the bad pieces of a replica's bad files from a member whose pieces verify (a
    missing file whole, through a temporary name), then verify again; the result replaces the
    verdicts `replicas status` shows."""
    from .manifests import load_manifest
    from .repair import repair_member
    from . import views

    rate = _rate(max_rate)
    r = _rig(rig)
    manifest = load_manifest(r)
    target = r.member(path)
    donors = [r.member(from_)] if from_ else [m for m in r.members if m.path != target.path]
    if any(d.path == target.path for d in donors):
        raise UsageError("--from names the replica being repaired; give another member")
    with live_progress(not quiet) as (report, cancel):
        res = repair_member(target, donors, manifest, r, report=report, cancel=cancel, max_rate=rate)
    if json_out:
        print_result(views.RepairView(res))
    else:
        line, still = views.repair_text(res)
        out.print(line)
        for text in still:
            err.print(text, soft_wrap=True)
    finish(EXIT_MISMATCH if res.after.state != "identical" else 0)


@app.command()
def resplit(source: str = typer.Argument(..., metavar="SOURCE", help="The GGUF model to re-split (read-only): a file "
                                                                     "or any file of a split set."),
            dest: str = typer.Argument(..., metavar="DIR", help="An existing folder for the new set (nothing in it "
                                                                "is ever replaced)."),
            prefix: Optional[str] = typer.Option(None, "--prefix", metavar="NAME", help="The set's file name prefix "
                                                                                          "(default: the source's)."),
            max_tensors: int = typer.Option(1, "--max-tensors", metavar="N", help="Tensors per file (1: one tensor "
                                                                                  "per file, the finest a drive can "
                                                                                  "be chosen for)."),
            quiet: bool = QuietOption,
            json_out: bool = JsonOption):
    """Write a GGUF model as a split set with N tensors per file, as `llama-gguf-split --split
    --split-max-tensors N` would (the same bytes): for an engine that reads a file through one
    mmap, a drive can be chosen per file. The set is a model of its own: make it a rig's model
    (`replicas init`) and copy it with `replicas sync` (docs/replicas.md, "One tensor per file")."""
    from .resplit import ResplitResult, resplit as resplit_model

    if max_tensors < 1:
        raise UsageError(f"--max-tensors {max_tensors}: at least 1")
    with live_progress(not quiet) as (report, cancel):
        res = resplit_model(source, dest, prefix=prefix, max_tensors=max_tensors, report=report, cancel=cancel)
    if json_out:
        print_result(ResplitResult(res))
    else:
        out.print(f"wrote {len(res['files'])} files ({format_bytes(res['bytes'])}, {res['tensors']} tensors) in "
                  f"{escape(res['dir'])}; the set's first file: {escape(res['path'])}", soft_wrap=True, highlight=False)


@app.command()
def status(rig: Optional[str] = RigOption, json_out: bool = JsonOption):
    """One row per member: path, drive, size, stamp state, what the last verification found and
    when the last full one was (reads no data); for a model of several files, a row under its
    member for each file that is not verified; then which members' drives share a disk,
    controller, bridge or hub (Linux sysfs). Exit 1 while a file's last verdict is a mismatch
    (until `replicas repair` or a clean `replicas verify`) or a file's size is not the manifest's;
    exit 3 while a file is missing — the codes `verify` gives."""
    from .manifests import load_manifest
    from .status import member_status, members_topology
    from .verdict import exit_code_of
    from . import views

    r = _rig(rig)
    manifest = load_manifest(r, required=False)
    rows = member_status(r, manifest)
    topology = members_topology(r)
    if json_out:
        print_result(views.StatusView(r.root, r.layout, r.format, manifest, rows, topology))
    else:
        out.print(views.status_table(r.root, manifest, rows))
        out.print(views.topology_text(topology), end="", highlight=False, markup=False)
    finish(exit_code_of(x.state for x in rows))


@app.command()
def forget(member: str = typer.Argument(..., metavar="PATH", help="The member to forget: its path or drive name."),
           rig: Optional[str] = RigOption):
    """Remove a member from the rig: its line in rig.toml and the rig's verdicts, progress and
    sidecar stamps about each of its files. Its files are never deleted or touched, so a member whose drive is
    gone can be forgotten without the drive. The model (primary) goes only once no replica is left."""
    from models.modelset import FILE
    from .forget import forget_member

    r = _rig(rig)
    m = forget_member(r, member)
    left = ("its file is left as it is" if r.layout == FILE or len(r.files) < 2      # said of the model's own kind
            else f"its {plural(len(r.files), 'file')} are left as they are")
    err.print(f"forgot {m.role} '{escape(m.name)}' ({escape(m.path)}); {left}")


def main() -> None:
    # A write past RLIMIT_FSIZE must be an error we report, not a signal that kills us mid-copy.
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    run(app, "replicas")


if __name__ == "__main__":
    main()
