"""Copying the model — one file or a set of files — to several drives at once (DESIGN §3, §10).

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

This module gathers the facts from the disk and carries out the plan; what the facts mean
(no-op, adopt, resume, fresh copy, refusal; space; pieces; how files add up) is decided in
`syncplan`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from core import rig as rigmod
from core.errors import EXIT_MISMATCH, EXIT_WRITE, Interrupted, MissingError, UsageError
from core.events import Notice, Progress, Reporter, emit
from core.fsutil import FileIdentity, allocated_bytes, free_bytes, fsync_dir, require_file
from core.units import format_bytes
from engines.registry import DEFAULT_ENGINE, get_engine

from .constants import PARTIAL_SUFFIX, PIECE_SIZE
from .drives import drive_label, drive_of
from .fanout import DestWriter, check_source, copy_pass
from .formats import RAW, SPLIT_NAME, sniff
from .hashing import check_piece_size
from .journal import Journal, journal_header, read_journal
from .manifest import Manifest, ModelManifest, bad_pieces
from .manifests import load_manifest, save_manifest
from .modelset import DIR, FILE, SPLIT, ModelSet, discover, from_rig, one_file
from .records import load_verdicts, record_verdicts
from .stamps import VERIFIED, stamp_state, write_stamp
from .syncplan import (
    ADOPT,
    NOOP,
    RESTART_REASON,
    DestPlan,
    DestResult,
    ExistingTarget,
    PartialState,
    SetPlan,
    SyncResult,
    bytes_to_write,
    check_space,
    combine_results,
    copy_block,
    drive_clash,
    extra_files,
    partial_plan,
    set_space_needed,
    target_plan,
    too_many_sources,
    write_error_text,
)
from .throttle import Clock, Pace, Pacers
from .verdict import Verdict, standing_mismatch
from .verify import hash_pieces

__all__ = ["sync", "source_model", "plan_destinations", "check_free_space", "DestPlan", "SetPlan", "DestResult",
           "SyncResult"]

SOURCE_FIX = "give the model's file, a member of its split set, or its directory"


# ---------------------------------------------------------------------------------------------
# The model to copy, and what is already trusted about it.

def source_model(source: str, rig: rigmod.Rig) -> ModelSet:
    """The model SOURCE names (a file, any member of a split set, a directory). A file whose
    bytes are no known format is copied as opaque bytes (raw), as sync always did; a rig that
    has a model allows only that model (SOURCE is it or a replica of it) and its file list."""
    rig_model = from_rig(rig)
    raw = rig_model is not None and rig_model.format == RAW
    if not os.path.lexists(source):
        raise MissingError(f"source {source}: no such file or directory; {SOURCE_FIX}")
    if os.path.isfile(source):
        require_file(source, "source", SOURCE_FIX)
        found = one_file(source, RAW) if raw or sniff(source) is None else discover(source)
    else:
        found = discover(source, RAW if raw else None)
    if rig_model is None:
        return found
    if os.path.realpath(found.path) not in {os.path.realpath(m.path) for m in rig.members}:
        raise UsageError(f"the rig at {rig.root} holds model {rig.model.path}; sync from it (or a replica), "
                         f"or use another --rig for {source}")
    return rig_model.at(found.path) if rig.format else found


def _trusted_manifests(rig: rigmod.Rig, model: ModelSet) -> dict[str, Manifest | None]:
    """Per file, the rig's manifest of it when the source file's stamp still vouches for it."""
    saved = load_manifest(rig, required=False)
    trusted: dict[str, Manifest | None] = {}
    for rel, path in zip(model.files, model.paths):
        try:
            m = saved.file(rel) if saved is not None else None
        except KeyError:
            m = None
        trusted[rel] = m if m is not None and stamp_state(path, m, rig) == VERIFIED else None
    return trusted


# ---------------------------------------------------------------------------------------------
# Planning: the facts about each destination, read before a byte is written.

def plan_destinations(model: ModelSet, dest_dirs: list[str], rig: rigmod.Rig, manifests: dict[str, Manifest | None],
                      idents: dict[str, FileIdentity], *, piece_size: int, replace_existing: bool,
                      allow_same_device: bool, report: Reporter = None) -> list[SetPlan]:
    try:
        src_key = drive_of(model.path).key
    except OSError:
        src_key = None
    member_keys = {}
    for m in rig.members:
        if os.path.realpath(m.path) != os.path.realpath(model.path) and os.path.exists(m.path):
            member_keys[os.path.realpath(m.path)] = drive_of(m.path).key
    plans, seen_keys, seen_targets = [], {}, set()
    for d in dest_dirs:
        if not os.path.exists(d):
            raise MissingError(f"destination {d}: no such directory (drive not mounted?); mount it or fix the path")
        if not os.path.isdir(d):
            raise UsageError(f"destination {d}: not a directory; give the directory to copy into")
        if not os.access(d, os.W_OK | os.X_OK):
            raise UsageError(f"destination {d}: not writable; check its permissions or mount options")
        final = model.in_dir(d)
        if os.path.realpath(final.path) == os.path.realpath(model.path):
            raise UsageError(f"destination {d} is the source's own directory; choose another drive")
        if os.path.realpath(final.path) in seen_targets:
            raise UsageError(f"destination {d} is given twice")
        seen_targets.add(os.path.realpath(final.path))
        key = drive_of(d).key
        if not allow_same_device:
            clash = drive_clash(key, src_key, seen_keys, member_keys, os.path.realpath(final.path), model.path)
            if clash:
                raise UsageError(f"destination {d} is on the same physical drive as {clash} ({key}); a replica there "
                                 "adds no bandwidth — use --allow-same-device to copy anyway")
        seen_keys[key] = d
        plans.append(_plan_set(model, final, d, rig, manifests, idents, piece_size, replace_existing, report))
    return plans


def _plan_set(model, final, d, rig, manifests, idents, piece_size, replace_existing, report) -> SetPlan:
    staging, work = "", final
    if model.layout == DIR:
        if os.path.lexists(final.path):
            if os.path.islink(final.path) or not os.path.isdir(final.path):
                raise UsageError(f"{final.path} exists and is not a directory; move it away")
        else:
            # A new directory model is built under a temporary name (DESIGN §10).
            staging = final.path + PARTIAL_SUFFIX
            if os.path.lexists(staging) and (os.path.islink(staging) or not os.path.isdir(staging)):
                raise UsageError(f"{staging} exists and is not a directory; it was not made by replicas — move it away")
            work = model.at(staging)
    files = []
    for rel, source in zip(model.files, model.paths):
        target = work.abs(rel)
        files.append(_plan_one(source, idents[rel], os.path.dirname(target), target, rig, manifests[rel], piece_size,
                               replace_existing, report))
    return SetPlan(d, final.path, tuple(files), model.files, staging, extra_files(model.files, _tree(model, work)))


def _tree(model: ModelSet, work: ModelSet) -> list[str]:
    """What is in a destination's model tree now: every file under a directory model; the split
    set's name pattern among a split set's siblings; nothing for one file (its directory is the
    drive's, not the model's)."""
    if model.layout == DIR:
        found = []
        for dirpath, dirnames, filenames in os.walk(work.root):
            for n in filenames + [x for x in dirnames if os.path.islink(os.path.join(dirpath, x))]:
                found.append(os.path.relpath(os.path.join(dirpath, n), work.root).replace(os.sep, "/"))
        return found
    if model.layout == SPLIT:
        prefix = SPLIT_NAME.match(model.files[0])["prefix"]
        try:
            names = os.listdir(work.root)
        except OSError:
            return []
        return [n for n in names if (m := SPLIT_NAME.match(n.removesuffix(".partial.journal").removesuffix(".partial")))
                and m["prefix"] == prefix]
    return []


def _existing(target: str, manifest: Manifest | None, rig: rigmod.Rig) -> ExistingTarget | None:
    if not os.path.lexists(target):
        return None
    regular = os.path.isfile(target) and not os.path.islink(target)
    if not regular:
        return ExistingTarget(regular=False, size=0, verified=False)
    # A stamp older than a mismatch verify found is not trusted: the file is read again.
    verified = (manifest is not None and stamp_state(target, manifest, rig) == VERIFIED
                and not standing_mismatch(load_verdicts(rig).get(target), manifest))
    return ExistingTarget(regular=True, size=os.path.getsize(target), verified=verified)


def _plan_one(source, src_ident, d, target, rig, manifest, piece_size, replace_existing, report) -> DestPlan:
    plan = target_plan(d, target, _existing(target, manifest, rig), src_ident.size, replace_existing)
    if not plan.writes or not os.path.exists(plan.partial):
        return plan
    header, durable = read_journal(plan.journal)
    plan = partial_plan(plan, PartialState(ours=header is not None,
                                           same_source=header == journal_header(source, src_ident, piece_size),
                                           durable=frozenset(durable)))
    if plan.reason == RESTART_REASON:
        emit(report, Notice(target, "source or piece size changed since the interrupted copy: starting over"))
    return plan


def free_space(path: str) -> int | None:
    """Free bytes where `path` lives; None when its file system reports no size at all
    (statvfs f_blocks == 0: ramfs, some network and FUSE mounts)."""
    if os.statvfs(path).f_blocks == 0:
        return None
    return free_bytes(path)


def _drive_key(path: str) -> str:
    try:
        return drive_of(path).key
    except OSError:
        return "path:" + path


def check_free_space(plans: list[SetPlan], sizes: dict[str, int], report: Reporter = None) -> None:
    """WriteError unless every file system holding writing destinations has room for every file
    still to write there (with headroom), before a byte is written; one notice per file system
    whose free space is unknown."""
    by_fs: dict[int, list[SetPlan]] = {}
    for sp in plans:
        if sp.writes:
            by_fs.setdefault(os.stat(sp.dest_dir).st_dev, []).append(sp)
    for group in by_fs.values():
        need = sum(set_space_needed((sizes[rel], allocated_bytes(p.partial)) for rel, p in zip(sp.rels, sp.files)
                                    if p.writes) for sp in group)
        notice = check_space([sp.dest_dir for sp in group], need, free_space(group[0].dest_dir))
        if notice:
            emit(report, Notice(", ".join(sp.dest_dir for sp in group), notice))


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
                                      error=f"{p.target} exists and differs from the source ({len(bad)} pieces); pass --replace to overwrite it",
                                      exit_code=EXIT_MISMATCH)
                j = Journal(p.journal, {}, fresh=False)
                j.withdraw([b.index for b in bad])
                j.close()
                return DestResult(p.dest_dir, p.target, p.action, "failed", bytes_written=written, bad=tuple(bad),
                                  error=f"read-back found {len(bad)} bad pieces; they will be rewritten on the next run", exit_code=EXIT_MISMATCH)
        if p.action != ADOPT:
            st = os.stat(source)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        stamped = write_stamp(path, manifest, rig, tag_file=True) if (verify or p.action == ADOPT) else None
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

def sync(source: str, dest_dirs: list[str], rig_root: str, *, piece_size: int = PIECE_SIZE, dry_run: bool = False,
         verify: bool = True, replace_existing: bool = False, allow_same_device: bool = False,
         report: Reporter = None, cancel: threading.Event | None = None,
         max_rate: float | None = None, clock: Clock | None = None) -> SyncResult:
    """Copy the model at `source` into every directory of `dest_dirs` (see the module's docstring).
    `max_rate` (bytes/s) paces each drive's reads and writes, by `clock` (the wall clock)."""
    t0 = time.monotonic()
    check_piece_size(piece_size)
    if not dest_dirs:
        raise UsageError("give at least one destination directory")
    rig = rigmod.load_rig(rig_root, must_exist=False)
    model = source_model(source, rig)
    for path in model.paths:
        require_file(path, "source", SOURCE_FIX)
    idents = {rel: FileIdentity.of(path) for rel, path in zip(model.files, model.paths)}
    sizes = {rel: i.size for rel, i in idents.items()}
    total = sum(sizes.values())
    manifests = _trusted_manifests(rig, model)
    kept = next((m.piece_size for m in manifests.values() if m is not None), None)
    if kept is not None and kept != piece_size:
        emit(report, Notice(model.path, f"the manifest uses piece size {format_bytes(kept)}; keeping it"))
        piece_size = kept
    plans = plan_destinations(model, dest_dirs, rig, manifests, idents, piece_size=piece_size,
                              replace_existing=replace_existing, allow_same_device=allow_same_device, report=report)
    for sp in plans:
        for p in sp.files:
            if p.reason:
                emit(report, Notice(p.target, p.reason))
        if sp.extra:
            emit(report, Notice(sp.target, f"{len(sp.extra)} file(s) here that the model does not have, kept: "
                                           f"{', '.join(sp.extra[:5])}{' …' if len(sp.extra) > 5 else ''}"))
    engine = get_engine(DEFAULT_ENGINE)
    copies = {os.path.realpath(m.path) for m in rig.members} | {os.path.realpath(model.path)} | \
        {os.path.realpath(sp.target) for sp in plans}
    warning = too_many_sources(len(copies), engine.name, engine.max_sources)
    if warning:
        emit(report, Notice(model.path, warning))
    if dry_run:
        dests = tuple(combine_results(sp.dest_dir, sp.target, [
            DestResult(p.dest_dir, p.target, p.action, "planned", bytes_to_write=bytes_to_write(p, sizes[rel], piece_size),
                       file=rel) for rel, p in zip(sp.rels, sp.files)], sp.extra, dry_run=True) for sp in plans)
        known = None if None in manifests.values() else _model_manifest(model, manifests)
        return _result(model, known, piece_size, dests, 0, time.monotonic() - t0, dry_run=True)
    check_free_space(plans, sizes, report)
    block = copy_block(piece_size)
    pacers = Pacers(max_rate, clock, cancel)
    src_pace = pacers.for_drive(_drive_key(model.path))
    dest_pace = {sp.target: pacers.for_drive(_drive_key(sp.dest_dir)) for sp in plans}

    results: dict[str, list[DestResult]] = {sp.target: [] for sp in plans}
    failed: set[str] = set()
    read_total, source_verified, before = 0, {}, 0
    for k, rel in enumerate(model.files):
        src_path, ident, size, manifest = model.abs(rel), idents[rel], sizes[rel], manifests[rel]
        active = [sp for sp in plans if sp.target not in failed]
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
        before += size

    dests, published = [], set()
    for sp in plans:
        files = results[sp.target]
        for rel, p in list(zip(sp.rels, sp.files))[len(files):]:   # after a failed file: not attempted
            files.append(DestResult(p.dest_dir, model.in_dir(sp.dest_dir).abs(rel), p.action, "skipped",
                                    error="not copied: an earlier file failed here", file=rel))
        error = _publish(sp, model, files, manifests, rig) if sp.target not in failed else ""
        r = combine_results(sp.dest_dir, sp.target, files, sp.extra, seconds=max((f.seconds for f in files), default=0.0))
        if error:
            r = dataclasses.replace(r, outcome="failed", error=error, exit_code=EXIT_WRITE)
        elif sp.target not in failed:
            published.add(sp.target)
        dests.append(r)

    _record(rig_root, model, manifests, plans, dests, published, source_verified, idents)
    return _result(model, _model_manifest(model, manifests), piece_size, tuple(dests), read_total, time.monotonic() - t0)


def _model_manifest(model: ModelSet, manifests: dict[str, Manifest]) -> ModelManifest:
    return ModelManifest(files=tuple(dataclasses.replace(manifests[rel], name=rel) for rel in model.files),
                         layout=model.layout, format=model.format)


def _result(model: ModelSet, mm: ModelManifest | None, piece_size: int, dests, read: int, seconds: float,
            dry_run: bool = False) -> SyncResult:
    digest = mm.digest() if mm else ""
    blake = (mm.files[0].blake3 if model.layout == FILE else digest) if mm else ""
    return SyncResult(model.path, sum(f.size for f in mm.files) if mm else _size(model), blake, piece_size, dests, read,
                      seconds, dry_run=dry_run, digest=digest, layout=model.layout, format=model.format, files=model.files)


def _size(model: ModelSet) -> int:
    return sum(os.path.getsize(p) for p in model.paths)


def _record(rig_root, model, manifests, plans, dests, published, source_verified, idents) -> None:
    """Record what is now true in the rig: the model, the replicas, the manifest, the verdicts."""
    rig = rigmod.load_rig(rig_root, must_exist=False)
    if rig.model is None:
        rig = rigmod.with_model(rig, model.path, drive_label(model.path), model.layout, model.format, model.files)
    else:   # a rig written before multi-file models gets its layout
        rig = rigmod.with_model(rig, rig.model.path, rig.model.name, model.layout, model.format, model.files)
    for sp, r in zip(plans, dests):
        if r.outcome in ("copied", "identical"):
            rig = rigmod.with_replica(rig, sp.target, drive_label(sp.target))
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
