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
from contextlib import ExitStack
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from core import rig as rigmod
from core.errors import EXIT_MISMATCH, EXIT_WRITE, Interrupted, UsageError
from core.events import Notice, Progress, Reporter, emit
from core.units import plural
from core.constants import RIG_LOCK
from core.fsutil import FileIdentity, folder_lock, fsync_dir, require_file
from core.platform import available_memory
from core.tiers import is_memory, ram_note
from core.units import format_bytes

from .constants import PIECE_SIZE
from core.drives import drive_label
from .fanout import DestWriter, check_source, copy_pass
from .hashing import check_piece_size
from .journal import Journal
from .manifest import Manifest, ModelManifest, bad_pieces
from .manifests import save_manifest
from models.modelset import FILE, SPLIT, ModelSet
from models.parsecheck import check_parses, file_format
from .records import record_verdicts
from .stamps import VERIFIED, stamp_state, write_stamp
from .syncfacts import SOURCE_FIX, check_free_space, drive_key, plan_destinations, source_model, trusted_manifests
from models.modelset import check_outside_members
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
from .verdict import BROKEN, Verdict
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
              pace: Pace | None = None, parse_as: str | None = None) -> DestResult:
    """One file at one destination. `rename`: move REL.partial over REL now (a split set's first
    member waits for the others: `_publish`). `parse_as` (gguf / safetensors): a copy read back
    identical must also parse as that format; one that does not is still the source's bytes, so
    it is renamed into place, but not stamped, and the result says so (exit 1)."""
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
        checked = verify or p.action == ADOPT
        parsed = check_parses(path, parse_as) if checked and parse_as else None
        broken = parsed is not None and not parsed.ok
        if p.action != ADOPT:
            st = os.stat(source)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        stamped = write_stamp(path, manifest, rig, tag_file=True) if checked and not broken else None
        if p.action != ADOPT:      # after the stamp (a read-only mode would refuse its attribute)
            os.chmod(path, st.st_mode & PERMISSIONS)      # the source's mode: 0600 shards stay 0600
        if p.action != ADOPT and rename:
            stamped = _rename_into_place(p, manifest, rig, stamped)
        return DestResult(p.dest_dir, p.target, p.action, "copied" if p.action != ADOPT else "identical",
                          bytes_written=written, bytes_to_write=written,
                          seconds=time.monotonic() - (started if started is not None else t),
                          verified=stamped is not None, stamped=stamped, parses=parsed.ok if parsed else None,
                          error=f"identical to the source, but does not parse as {parsed.format}: {parsed.detail} (the "
                                "source has the same bytes: get the model again)" if broken else "",
                          exit_code=EXIT_MISMATCH if broken else 0)
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


@dataclasses.dataclass
class _Job:
    """One sync run: what was found and planned, and what has happened so far."""

    rig: rigmod.Rig
    model: ModelSet
    idents: dict[str, FileIdentity]            # each source file's identity before the copy
    manifests: dict[str, Manifest | None]      # trusted per file (None: computed by the copy)
    plans: list[SetPlan]
    piece_size: int
    holds: dict[str, tuple[str, ...]]          # --partial: the files each destination holds
    choices: list
    t0: float
    results: dict[str, list[DestResult]] = dataclasses.field(default_factory=dict)
    failed: set[str] = dataclasses.field(default_factory=set)     # destinations with a failed file: not published
    stopped: set[str] = dataclasses.field(default_factory=set)    # ... with a failed write: no more files written
    read_total: int = 0
    source_verified: dict[str, bool] = dataclasses.field(default_factory=dict)

    @property
    def sizes(self) -> dict[str, int]:
        return {rel: i.size for rel, i in self.idents.items()}

    @property
    def total(self) -> int:
        return sum(i.size for i in self.idents.values())


def sync(source: str, dest_dirs: list[str], rig_root: str, *, piece_size: int = PIECE_SIZE, dry_run: bool = False,
         verify: bool = True, replace_existing: bool = False, allow_same_device: bool = False,
         report: Reporter = None, cancel: threading.Event | None = None,
         max_rate: float | None = None, clock: Clock | None = None, partial: str | None = None) -> SyncResult:
    """Copy the model at `source` into every directory of `dest_dirs` (see the module's docstring).
    `max_rate` (bytes/s) paces each drive's reads and writes, by `clock` (the wall clock).
    `partial` (SIZE, PCT% or auto): each destination becomes a partial replica holding the shards
    `partials.choose_members` picks within that budget; files it keeps are not copied again, and
    copies of ours it no longer holds are removed (docs/replicas.md, "Partial replicas")."""
    with ExitStack() as locks:      # each destination: one writer at a time (held until the rename)
        return _sync(source, dest_dirs, rig_root, piece_size=piece_size, dry_run=dry_run, verify=verify,
                     replace_existing=replace_existing, allow_same_device=allow_same_device, report=report,
                     cancel=cancel, max_rate=max_rate, clock=clock, partial=partial, locks=locks)


def _sync(source, dest_dirs, rig_root, *, piece_size, dry_run, verify, replace_existing, allow_same_device, report,
          cancel, max_rate, clock, partial, locks: ExitStack) -> SyncResult:
    job = _plan(source, dest_dirs, rig_root, piece_size=piece_size, replace_existing=replace_existing,
                allow_same_device=allow_same_device, partial=partial, report=report, locks=None if dry_run else locks)
    _announce(job, report)
    if dry_run:
        return _dry_run(job)
    check_free_space(job.plans, job.sizes, report)
    pacers = Pacers(max_rate, clock, cancel)
    # one pacer per physical drive, shared by everything that touches it (--max-rate)
    paces = {p: pacers.for_drive(drive_key(p)) for p in [job.model.path] + [sp.dest_dir for sp in job.plans]}
    before = 0
    for k, rel in enumerate(job.model.files):
        _copy_file(job, k, rel, before, paces, verify=verify, report=report, cancel=cancel)
        before += job.sizes[rel]
    dests, published = _publish_all(job, report)
    _record(rig_root, job.model, job.manifests, job.plans, dests, published, job.source_verified, job.idents, job.holds)
    return _result(job.model, _model_manifest(job.model, job.manifests), job.piece_size, tuple(dests), job.read_total,
                   time.monotonic() - job.t0, partial=job.choices)


def _plan(source: str, dest_dirs: list[str], rig_root: str, *, piece_size: int, replace_existing: bool,
          allow_same_device: bool, partial: str | None, report: Reporter, locks: ExitStack | None = None) -> _Job:
    """Read the facts (the source model, its files' identities, the trusted manifests, each
    destination) and decide what each destination needs (`syncfacts.plan_destinations`). `locks`:
    each destination folder is locked into it first (a second sync into one destination shared its
    staging folder and journals: it failed half-way and left the first one's replica stale)."""
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
        if locks is not None and os.path.isdir(d):
            locks.enter_context(folder_lock(d, f"destination {d}: another `replicas sync` (or repair) is writing into it; "
                                               "wait for it to finish, then run this again"))
    model = source_model(source, rig)
    check_outside_members(rig_root, model, rig, f"the rig folder {rig_root}")
    for path in model.paths:
        require_file(path, "source", SOURCE_FIX)
    idents = {rel: FileIdentity.of(path) for rel, path in zip(model.files, model.paths)}
    manifests = trusted_manifests(rig, model)
    kept = next((m.piece_size for m in manifests.values() if m is not None), None)
    if kept is not None and kept != piece_size:
        emit(report, Notice(model.path, f"the manifest uses piece size {format_bytes(kept)}; keeping it"))
        piece_size = kept
    choices = []
    if partial:
        from .partials import choose_members    # the routing history and the engines: only for --partial

        choices = choose_members(model, dest_dirs, rig, partial, report)
    holds = {c.dest: c.holds for c in choices}
    plans = plan_destinations(model, dest_dirs, rig, manifests, idents, piece_size=piece_size,
                              replace_existing=replace_existing, allow_same_device=allow_same_device, report=report,
                              holds=holds)
    return _Job(rig, model, idents, manifests, plans, piece_size, holds, choices, t0,
                results={sp.target: [] for sp in plans})


def _announce(job: _Job, report: Reporter) -> None:
    """Say what the plan means before a byte is written: each file's reason, extra files kept, a
    RAM destination, more copies than the engine reads, a path the engine would refuse."""
    # The engines' modules (and numpy under them) load here, not when any `replicas` command starts.
    from engines.registry import engine_for_model, get_engine, path_refusals

    model, plans = job.model, job.plans
    for sp in plans:
        for p in sp.files:
            if p.reason:
                emit(report, Notice(p.target, p.reason))
        if sp.extra:
            emit(report, Notice(sp.target, f"{len(sp.extra)} file(s) here that the model does not have, kept: "
                                           f"{', '.join(sp.extra[:5])}{' …' if len(sp.extra) > 5 else ''}"))
    for sp in plans:
        if is_memory(sp.dest_dir):
            emit(report, Notice(sp.target, "in RAM (tmpfs): " + ram_note(job.total, available_memory()), warning=True))
    engine = get_engine(engine_for_model(model.format, model.layout, model.files))   # the engine that reads this model
    copies = {os.path.realpath(m.path) for m in job.rig.members} | {os.path.realpath(model.path)} | \
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


def _dry_run(job: _Job) -> SyncResult:
    sizes = job.sizes
    dests = tuple(combine_results(sp.dest_dir, sp.target, [
        DestResult(p.dest_dir, p.target, p.action, "planned", bytes_to_write=bytes_to_write(p, sizes[rel], job.piece_size),
                   file=rel) for rel, p in zip(sp.rels, sp.files)], sp.extra, dry_run=True) for sp in job.plans)
    known = None if None in job.manifests.values() else _model_manifest(job.model, job.manifests)
    return _result(job.model, known, job.piece_size, dests, 0, time.monotonic() - job.t0, dry_run=True,
                   partial=job.choices)


def _copy_file(job: _Job, k: int, rel: str, before: int, paces: dict[str, Pace | None], *, verify: bool, report: Reporter,
               cancel: threading.Event | None) -> None:
    """The k-th file of the model: one cold read of the source fanned out to every destination
    that needs it, then each copy read back, stamped and renamed (destinations in parallel).
    `before`: bytes of the model's files before this one (progress is per destination, over the
    whole model). `paces`: each drive's pacer, by the source's path and each destination folder."""
    model, total, block = job.model, job.total, copy_block(job.piece_size)
    src_path, ident, size = model.abs(rel), job.idents[rel], job.sizes[rel]
    active = [sp for sp in job.plans if sp.target not in job.stopped]
    file_results: dict[str, DestResult] = {}
    writers: list[DestWriter] = []
    for sp in active:
        p = sp.files[k]
        if p.writes:
            try:
                os.makedirs(os.path.dirname(p.partial), exist_ok=True)
                writers.append(DestWriter(p, src_path, ident, size, job.piece_size, block, report, paces[sp.dest_dir],
                                          task=sp.target, done_before=before, total=total))
            except OSError as e:
                file_results[sp.target] = DestResult(p.dest_dir, p.target, p.action, "failed",
                                                     error=write_error_text(e), exit_code=EXIT_WRITE)
    manifest = job.manifests[rel]
    try:
        if writers or manifest is None:
            manifest, read = copy_pass(src_path, ident, writers, manifest, size, job.piece_size, block, report, cancel,
                                       paces[model.path])
            job.source_verified[rel] = read == size
            job.read_total += read
    finally:
        for w in writers:
            w.finish()
    # Once more after every byte is durable: a source that changed at the last moment must not
    # have its old bytes renamed into place as a replica of the new file.
    check_source(src_path, ident, None)
    if job.manifests[rel] is None:          # computed by this pass: named by its place in the model
        manifest = dataclasses.replace(manifest, name=rel)
    job.manifests[rel] = manifest

    # Read back, parse, stamp, rename: destinations in parallel, one reader each.
    by_target = {w.plan.target: w for w in writers}
    todo = [sp for sp in active if sp.target not in file_results]
    parse_as = file_format(model.format, model.layout, rel)

    def finish_file(sp: SetPlan) -> DestResult:
        p = sp.files[k]
        return _finalize(p, by_target.get(p.target), src_path, manifest, job.rig, verify=verify,
                         rename=not (model.layout == SPLIT and k == 0), started=job.t0 if p.target in by_target else None,
                         report=_progress_over(report, sp.target, before, total), cancel=cancel,
                         pace=paces[sp.dest_dir], parse_as=parse_as)

    with ThreadPoolExecutor(max_workers=max(1, len(todo)), thread_name_prefix="finalize") as pool:
        for sp, r in zip(todo, pool.map(finish_file, todo)):
            file_results[sp.target] = r
    for sp in active:
        r = dataclasses.replace(file_results[sp.target], file=rel, target=model.in_dir(sp.dest_dir).abs(rel))
        job.results[sp.target].append(r)
        if r.outcome == "failed":
            job.failed.add(sp.target)
            if r.exit_code == EXIT_WRITE:   # the drive is full or failing; a differing file is not
                job.stopped.add(sp.target)


def _publish_all(job: _Job, report: Reporter) -> tuple[list[DestResult], set[str]]:
    """Each destination's result, its model made visible under its final name when every file
    verified (`_publish`), and a partial replica that shrank cleared of what it no longer holds.
    Returns (results, the targets published)."""
    model = job.model
    dests, published = [], set()
    for sp in job.plans:
        files = job.results[sp.target]
        for rel, p in list(zip(sp.rels, sp.files))[len(files):]:   # after a failed file: not attempted
            files.append(DestResult(p.dest_dir, model.in_dir(sp.dest_dir).abs(rel), p.action, "skipped",
                                    error="not copied: a write failed here earlier", file=rel))
        error = _publish(sp, model, files, job.manifests, job.rig) if sp.target not in job.failed else ""
        dropped = _drop_unheld(sp, model, job.manifests, job.rig, job.holds[sp.dest_dir], report) \
            if sp.dest_dir in job.holds and sp.target not in job.failed and not error else ()
        r = combine_results(sp.dest_dir, sp.target, files, sp.extra, seconds=max((f.seconds for f in files), default=0.0),
                            dropped=dropped)
        if error:
            r = dataclasses.replace(r, outcome="failed", error=error, exit_code=EXIT_WRITE)
        elif sp.target not in job.failed:
            published.add(sp.target)
        dests.append(r)
    return dests, published


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
    """Record what is now true in the rig: the model, the replicas, the manifest, the verdicts
    (under the rig's lock: two syncs into one rig each read, change and write rig.toml)."""
    os.makedirs(rig_root, exist_ok=True)
    with folder_lock(os.path.join(rig_root, RIG_LOCK), "", wait=True):
        _record_locked(rig_root, model, manifests, plans, dests, published, source_verified, idents, holds)


def _record_locked(rig_root, model, manifests, plans, dests, published, source_verified, idents, holds=None) -> None:
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
    broken = {}         # files whose copy does not parse: the source's bytes do not either
    for sp, r in zip(plans, dests):
        waits = {sp.rels[0]} if model.layout == SPLIT else set(sp.rels) if sp.staging else set()
        for f in r.files:
            if f.parses is False:
                broken[f.file] = Verdict(BROKEN, now, manifests[f.file].digest(), "sync", detail=f.error)
                proven[f.target] = broken[f.file]
            elif f.verified and f.action != NOOP and (f.file not in waits or sp.target in published):
                proven[f.target] = Verdict("verified", now, manifests[f.file].digest(), "sync")
    if os.path.realpath(model.path) == os.path.realpath(rig.model.path):
        for rel, path in zip(model.files, model.paths):
            if rel in broken:
                proven[path] = broken[rel]
            elif source_verified.get(rel):
                write_stamp(path, manifests[rel], rig, tag_file=False, identity=idents[rel])
                proven[path] = Verdict("verified", now, manifests[rel].digest(), "sync")
    record_verdicts(rig, proven)
