"""Copying the model — one file or a set of files — to several drives at once (docs/replicas.md).

Files in the model's order; per file, one cold read of the source file fans each block out to
every destination that needs it (`fanout`); each destination's copy is REL.partial
(preallocated) with a journal of durable pieces; after its last piece: fsync, cold read-back
against that file's manifest, stamp, atomic rename, directory fsync. A model is never
half-visible under its final name:

- one file: renamed over NAME when verified;
- a split GGUF set: each member is renamed into place when verified, except the first (the one
  engines open), renamed last, after every other member at that destination verified;
- a directory: built in DEST/NAME.partial/ (each file renamed inside it when verified), renamed
  to DEST/NAME once every file is; a directory already there under its final name (an earlier
  replica) is worked in place, file by file.

The source is opened read-only and each file's identity is checked before, during and after.
Nothing that exists and is not ours is overwritten without --replace, and files a destination
holds that the model does not have are reported and kept; a failure leaves the source, every
verified replica and every durable piece as they were.

The facts are read from the disk in `syncfacts`; what they mean (no-op, adopt, resume, fresh
copy, refusal; space; pieces; how files add up) is decided in `syncplan`; this module carries
the plan out.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from core import rig as rigmod
from core.errors import EXIT_MISMATCH, EXIT_WRITE, Interrupted, UsageError
from core.events import Notice, Progress, Reporter, emit
from core.units import plural
from core.fsutil import FileIdentity, fsync_dir, require_file
from core.platform import available_memory
from core.tiers import is_memory, ram_note
from core.units import format_bytes
from engines.registry import engine_for_model, get_engine, path_refusals

from .constants import PIECE_SIZE
from core.drives import drive_label
from .fanout import DestWriter, check_source, copy_pass
from .hashing import check_piece_size
from .journal import Journal
from .manifest import Manifest, ModelManifest, bad_pieces
from .manifests import save_manifest
from models.modelset import FILE, SPLIT, ModelSet
from .records import record_verdicts
from .stamps import VERIFIED, stamp_state, write_stamp
from .partials import choose_members
from .syncfacts import SOURCE_FIX, check_free_space, drive_key, plan_destinations, source_model, trusted_manifests
from .syncplan import (
    ADOPT,
    NOOP,
    SKIP,
    DestPlan,
    DestResult,
    SetPlan,
    SyncResult,
    bytes_to_write,
    combine_results,
    copy_block,
    too_many_sources,
    write_error_text,
)
from .throttle import Clock, Pace, Pacers
from .verdict import Verdict
from .verify import hash_pieces

__all__ = ["sync", "source_model", "plan_destinations", "check_free_space", "DestPlan", "SetPlan", "DestResult",
           "SyncResult"]

# ---------------------------------------------------------------------------------------------
# After each file's copy: read back, stamp, rename.

def _progress_over(report: Reporter, task: str, done_before: int, total: int) -> Reporter:
    """A reporter that shows one file's progress as its destination's over the whole model."""
    if report is None:
        return None

    def over(ev):
        if isinstance(ev, Progress):
            ev = Progress(task, ev.phase, done_before + ev.done, total)
        emit(report, ev)
    return over


def _finalize(p: DestPlan, w: DestWriter | None, source: str, manifest: Manifest, rig: rigmod.Rig, *, verify: bool,
              rename: bool, started: float | None, report: Reporter, cancel: threading.Event | None,
              pace: Pace | None = None) -> DestResult:
    """One file at one destination. `rename`: move REL.partial over REL now (a split set's first
    member waits for the others: `_publish`)."""
    t = time.monotonic()
    if p.action == NOOP:
        return DestResult(p.dest_dir, p.target, p.action, "identical", verified=True)
    if p.action == SKIP:
        return DestResult(p.dest_dir, p.target, p.action, "not held")
    if w is not None and w.error is not None:
        return DestResult(p.dest_dir, p.target, p.action, "failed", bytes_written=w.bytes_written,
                          error=write_error_text(w.error) + "; durable pieces are kept, re-run to resume", exit_code=EXIT_WRITE)
    written = w.bytes_written if w else 0
    path = p.target if p.action == ADOPT else p.partial
    try:
        if verify or p.action == ADOPT:
            hashes, _ = hash_pieces(path, manifest, task=p.target, report=report, cancel=cancel, pace=pace)
            bad = bad_pieces(manifest, hashes, os.path.getsize(path))
            if bad:
                if p.action == ADOPT:
                    return DestResult(p.dest_dir, p.target, p.action, "failed", bad=tuple(bad),
                                      error=f"{p.target} exists and differs from the source ({plural(len(bad), 'piece')}); "
                                            f"pass --replace to overwrite it",
                                      exit_code=EXIT_MISMATCH)
                j = Journal(p.journal, {}, fresh=False)
                j.withdraw([b.index for b in bad])
                j.close()
                return DestResult(p.dest_dir, p.target, p.action, "failed", bytes_written=written, bad=tuple(bad),
                                  error=f"read-back found {plural(len(bad), 'bad piece')}; they will be rewritten on the "
                                        f"next run", exit_code=EXIT_MISMATCH)
        if p.action != ADOPT:
            st = os.stat(source)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        stamped = write_stamp(path, manifest, rig, tag_file=True) if (verify or p.action == ADOPT) else None
        if p.action != ADOPT:      # after the stamp (a read-only mode would refuse its attribute)
            os.chmod(path, st.st_mode & PERMISSIONS)      # the source's mode: 0600 shards stay 0600
        if p.action != ADOPT and rename:
            stamped = _rename_into_place(p, manifest, rig, stamped)
        return DestResult(p.dest_dir, p.target, p.action, "copied" if p.action != ADOPT else "identical",
                          bytes_written=written, bytes_to_write=written,
                          seconds=time.monotonic() - (started if started is not None else t),
                          verified=stamped is not None, stamped=stamped)
    except Interrupted:
        raise
    except OSError as e:
        return DestResult(p.dest_dir, p.target, p.action, "failed", error=write_error_text(e), exit_code=EXIT_WRITE)


PERMISSIONS = 0o777      # a copy keeps its source's read/write/execute bits (never setuid and the like)


def _rename_into_place(p: DestPlan, manifest: Manifest, rig: rigmod.Rig, stamped: str | None) -> str | None:
    os.replace(p.partial, p.target)
    fsync_dir(p.dest_dir)
    if stamped == "sidecar":  # the sidecar is keyed by path: re-record under the final name
        stamped = write_stamp(p.target, manifest, rig, tag_file=True)
    os.unlink(p.journal)
    fsync_dir(p.dest_dir)
    return stamped


def _publish(sp: SetPlan, model: ModelSet, results: list[DestResult], manifests: dict[str, Manifest],
             rig: rigmod.Rig) -> str:
    """Make a destination's model visible under its final name once every file is verified: a
    split set's first member, or the directory built under NAME.partial. Returns an error ("" ok)."""
    try:
        if model.layout == SPLIT and sp.files[0].writes:
            first = sp.files[0]
            _rename_into_place(first, manifests[sp.rels[0]], rig, results[0].stamped)
        if sp.staging:
            if os.path.lexists(sp.target):
                return f"{sp.target} appeared during the copy; the verified copy stays in {sp.staging} — move one away and re-run"
            os.rename(sp.staging, sp.target)
            fsync_dir(sp.dest_dir)
            final = model.in_dir(sp.dest_dir)
            for rel, r in zip(sp.rels, results):
                # xattr stamps move with the files; sidecar records are keyed by path
                if r.verified and stamp_state(final.abs(rel), manifests[rel], rig) != VERIFIED:
                    write_stamp(final.abs(rel), manifests[rel], rig, tag_file=True)
        return ""
    except OSError as e:
        return write_error_text(e)


# ---------------------------------------------------------------------------------------------
# The whole job.

def gone_ram_dirs(rig: rigmod.Rig) -> list[str]:
    """The folders to copy into again to restore the rig's RAM members that are gone (tmpfs
    emptied at reboot): each such replica's parent folder, where sync put it under the model's name."""
    return [os.path.dirname(m.path.rstrip(os.sep)) for m in rig.replicas
            if not os.path.exists(m.path) and is_memory(m.path)]


def sync(source: str, dest_dirs: list[str], rig_root: str, *, piece_size: int = PIECE_SIZE, dry_run: bool = False,
         verify: bool = True, replace_existing: bool = False, allow_same_device: bool = False,
         report: Reporter = None, cancel: threading.Event | None = None,
         max_rate: float | None = None, clock: Clock | None = None, partial: str | None = None) -> SyncResult:
    """Copy the model at `source` into every directory of `dest_dirs` (see the module's docstring).
    `max_rate` (bytes/s) paces each drive's reads and writes, by `clock` (the wall clock).
    `partial` (SIZE, PCT% or auto): each destination becomes a partial replica holding the shards
    `partials.choose_members` picks within that budget; files it keeps are not copied again, and
    copies of ours it no longer holds are removed (docs/replicas.md, "Partial replicas")."""
    t0 = time.monotonic()
    check_piece_size(piece_size)
    rig = rigmod.load_rig(rig_root, must_exist=False)
    if not dest_dirs:
        dest_dirs = gone_ram_dirs(rig)
        if not dest_dirs:
            raise UsageError("give at least one destination directory (no RAM member of the rig is gone to restore)")
    for d in dest_dirs:
        # a RAM member's folder goes with the rest of tmpfs at reboot: make it again (a missing
        # folder on a drive still means the drive is not mounted, and stays an error)
        if not os.path.exists(d) and is_memory(d):
            os.makedirs(d, exist_ok=True)
    model = source_model(source, rig)
    for path in model.paths:
        require_file(path, "source", SOURCE_FIX)
    idents = {rel: FileIdentity.of(path) for rel, path in zip(model.files, model.paths)}
    sizes = {rel: i.size for rel, i in idents.items()}
    total = sum(sizes.values())
    manifests = trusted_manifests(rig, model)
    kept = next((m.piece_size for m in manifests.values() if m is not None), None)
    if kept is not None and kept != piece_size:
        emit(report, Notice(model.path, f"the manifest uses piece size {format_bytes(kept)}; keeping it"))
        piece_size = kept
    choices = choose_members(model, dest_dirs, rig, partial, report) if partial else []
    holds = {c.dest: c.holds for c in choices}
    plans = plan_destinations(model, dest_dirs, rig, manifests, idents, piece_size=piece_size,
                              replace_existing=replace_existing, allow_same_device=allow_same_device, report=report,
                              holds=holds)
    for sp in plans:
        for p in sp.files:
            if p.reason:
                emit(report, Notice(p.target, p.reason))
        if sp.extra:
            emit(report, Notice(sp.target, f"{len(sp.extra)} file(s) here that the model does not have, kept: "
                                           f"{', '.join(sp.extra[:5])}{' …' if len(sp.extra) > 5 else ''}"))
    for sp in plans:
        if is_memory(sp.dest_dir):
            emit(report, Notice(sp.target, "in RAM (tmpfs): " + ram_note(total, available_memory()), warning=True))
    engine = get_engine(engine_for_model(model.format, model.layout, model.files))   # the engine that reads this model
    copies = {os.path.realpath(m.path) for m in rig.members} | {os.path.realpath(model.path)} | \
        {os.path.realpath(sp.target) for sp in plans}
    warning = too_many_sources(len(copies), engine.name, engine.max_sources)
    if warning:
        emit(report, Notice(model.path, warning))
    for sp in plans:         # a copy an engine cannot be pointed at: said now, not at export
        for name, chars in path_refusals(sp.target, model.format, model.layout, model.files):
            emit(report, Notice(sp.target, f"warning: {name} refuses a source path containing "
                                           f"{' or '.join(repr(c) for c in chars)} (its list separators), so a profile "
                                           f"using this copy would be refused at export; rename the folder to use it there",
                                warning=True))
    if dry_run:
        dests = tuple(combine_results(sp.dest_dir, sp.target, [
            DestResult(p.dest_dir, p.target, p.action, "planned", bytes_to_write=bytes_to_write(p, sizes[rel], piece_size),
                       file=rel) for rel, p in zip(sp.rels, sp.files)], sp.extra, dry_run=True) for sp in plans)
        known = None if None in manifests.values() else _model_manifest(model, manifests)
        return _result(model, known, piece_size, dests, 0, time.monotonic() - t0, dry_run=True, partial=choices)
    check_free_space(plans, sizes, report)
    block = copy_block(piece_size)
    pacers = Pacers(max_rate, clock, cancel)
    src_pace = pacers.for_drive(drive_key(model.path))
    dest_pace = {sp.target: pacers.for_drive(drive_key(sp.dest_dir)) for sp in plans}

    results: dict[str, list[DestResult]] = {sp.target: [] for sp in plans}
    failed: set[str] = set()        # destinations with a file that failed: not published
    stopped: set[str] = set()       # ... with a write that failed: no more files are written there
    read_total, source_verified, before = 0, {}, 0
    for k, rel in enumerate(model.files):
        src_path, ident, size, manifest = model.abs(rel), idents[rel], sizes[rel], manifests[rel]
        active = [sp for sp in plans if sp.target not in stopped]
        file_results: dict[str, DestResult] = {}
        writers: list[DestWriter] = []
        for sp in active:
            p = sp.files[k]
            if p.writes:
                try:
                    os.makedirs(os.path.dirname(p.partial), exist_ok=True)
                    writers.append(DestWriter(p, src_path, ident, size, piece_size, block, report, dest_pace[sp.target],
                                              task=sp.target, done_before=before, total=total))
                except OSError as e:
                    file_results[sp.target] = DestResult(p.dest_dir, p.target, p.action, "failed",
                                                         error=write_error_text(e), exit_code=EXIT_WRITE)
        read = 0
        try:
            if writers or manifest is None:
                manifest, read = copy_pass(src_path, ident, writers, manifest, size, piece_size, block, report, cancel,
                                           src_pace)
                source_verified[rel] = read == size
        finally:
            for w in writers:
                w.finish()
        read_total += read
        # Once more after every byte is durable: a source that changed at the last moment must not
        # have its old bytes renamed into place as a replica of the new file.
        check_source(src_path, ident, None)
        if manifests[rel] is None:          # computed by this pass: named by its place in the model
            manifest = dataclasses.replace(manifest, name=rel)
        manifests[rel] = manifest

        # Read back, stamp, rename: destinations in parallel, one reader each.
        by_target = {w.plan.target: w for w in writers}
        todo = [sp for sp in active if sp.target not in file_results]

        def finish_file(sp: SetPlan, rel=rel, k=k, manifest=manifest, src_path=src_path, before=before) -> DestResult:
            p = sp.files[k]
            return _finalize(p, by_target.get(p.target), src_path, manifest, rig, verify=verify,
                             rename=not (model.layout == SPLIT and k == 0), started=t0 if p.target in by_target else None,
                             report=_progress_over(report, sp.target, before, total), cancel=cancel,
                             pace=dest_pace[sp.target])

        with ThreadPoolExecutor(max_workers=max(1, len(todo)), thread_name_prefix="finalize") as pool:
            for sp, r in zip(todo, pool.map(finish_file, todo)):
                file_results[sp.target] = r
        for sp in active:
            r = dataclasses.replace(file_results[sp.target], file=rel, target=model.in_dir(sp.dest_dir).abs(rel))
            results[sp.target].append(r)
            if r.outcome == "failed":
                failed.add(sp.target)
                if r.exit_code == EXIT_WRITE:   # the drive is full or failing; a differing file is not
                    stopped.add(sp.target)
        before += size

    dests, published = [], set()
    for sp in plans:
        files = results[sp.target]
        for rel, p in list(zip(sp.rels, sp.files))[len(files):]:   # after a failed file: not attempted
            files.append(DestResult(p.dest_dir, model.in_dir(sp.dest_dir).abs(rel), p.action, "skipped",
                                    error="not copied: a write failed here earlier", file=rel))
        error = _publish(sp, model, files, manifests, rig) if sp.target not in failed else ""
        dropped = _drop_unheld(sp, model, manifests, rig, holds[sp.dest_dir], report) \
            if sp.dest_dir in holds and sp.target not in failed and not error else ()
        r = combine_results(sp.dest_dir, sp.target, files, sp.extra, seconds=max((f.seconds for f in files), default=0.0),
                            dropped=dropped)
        if error:
            r = dataclasses.replace(r, outcome="failed", error=error, exit_code=EXIT_WRITE)
        elif sp.target not in failed:
            published.add(sp.target)
        dests.append(r)

    _record(rig_root, model, manifests, plans, dests, published, source_verified, idents, holds)
    return _result(model, _model_manifest(model, manifests), piece_size, tuple(dests), read_total, time.monotonic() - t0,
                   partial=choices)


def _model_manifest(model: ModelSet, manifests: dict[str, Manifest]) -> ModelManifest:
    return ModelManifest(files=tuple(dataclasses.replace(manifests[rel], name=rel) for rel in model.files),
                         layout=model.layout, format=model.format)


def _result(model: ModelSet, mm: ModelManifest | None, piece_size: int, dests, read: int, seconds: float,
            dry_run: bool = False, partial=()) -> SyncResult:
    digest = mm.digest() if mm else ""
    blake = (mm.files[0].blake3 if model.layout == FILE else digest) if mm else ""
    return SyncResult(model.path, sum(f.size for f in mm.files) if mm else _size(model), blake, piece_size, dests, read,
                      seconds, dry_run=dry_run, digest=digest, layout=model.layout, format=model.format, files=model.files,
                      partial=tuple(partial))


def _drop_unheld(sp: SetPlan, model: ModelSet, manifests: dict[str, Manifest], rig: rigmod.Rig,
                 holds: tuple[str, ...], report: Reporter) -> tuple[str, ...]:
    """A partial replica that shrank: remove the model files there it no longer holds, but only
    a copy the tool verified and stamped (its bytes are the primary's, so nothing unique is lost);
    anything else is kept and named. Returns the relative paths removed."""
    final = model.in_dir(sp.dest_dir)
    if not any(os.path.realpath(m.path) == os.path.realpath(final.path) for m in rig.replicas):
        return ()                   # not a member yet: whatever is there was not put there by us
    dropped = []
    for rel in model.files:
        path = final.abs(rel)
        if rel in holds or not os.path.isfile(path) or os.path.islink(path):
            continue
        if stamp_state(path, manifests[rel], rig) == VERIFIED:
            os.unlink(path)
            dropped.append(rel)
        else:
            emit(report, Notice(path, "no longer held by this partial replica, but not a verified copy of ours: kept"))
    if dropped:
        fsync_dir(os.path.dirname(final.abs(dropped[0])))
        record_verdicts(rig, {final.abs(rel): None for rel in dropped})
    return tuple(dropped)


def _size(model: ModelSet) -> int:
    return sum(os.path.getsize(p) for p in model.paths)


def _record(rig_root, model, manifests, plans, dests, published, source_verified, idents, holds=None) -> None:
    """Record what is now true in the rig: the model, the replicas, the manifest, the verdicts."""
    rig = rigmod.load_rig(rig_root, must_exist=False)
    if rig.model is None:
        rig = rigmod.with_model(rig, model.path, drive_label(model.path), model.layout, model.format, model.files)
    else:   # a rig written before multi-file models gets its layout
        rig = rigmod.with_model(rig, rig.model.path, rig.model.name, model.layout, model.format, model.files)
    for sp, r in zip(plans, dests):
        if r.outcome in ("copied", "identical"):
            # a destination synced whole becomes (or stays) a full replica; --partial records its files
            rig = rigmod.with_replica(rig, sp.target, drive_label(sp.target), (holds or {}).get(sp.dest_dir),
                                      keep_holds=False)
    rigmod.save_rig(rig)
    save_manifest(rig, _model_manifest(model, manifests))
    # What sync proved replaces what `status` remembers (a replica copied again after a mismatch),
    # per file at its final name.
    now = time.time()
    proven = {}
    for sp, r in zip(plans, dests):
        waits = {sp.rels[0]} if model.layout == SPLIT else set(sp.rels) if sp.staging else set()
        for f in r.files:
            if f.verified and f.action != NOOP and (f.file not in waits or sp.target in published):
                proven[f.target] = Verdict("verified", now, manifests[f.file].digest(), "sync")
    if os.path.realpath(model.path) == os.path.realpath(rig.model.path):
        for rel, path in zip(model.files, model.paths):
            if source_verified.get(rel):
                write_stamp(path, manifests[rel], rig, tag_file=False, identity=idents[rel])
                proven[path] = Verdict("verified", now, manifests[rel].digest(), "sync")
    record_verdicts(rig, proven)
