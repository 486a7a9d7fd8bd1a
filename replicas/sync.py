"""Copying the model to several drives at once (DESIGN §3).

One cold read of the source fans each block out to every destination in parallel (`fanout`);
each destination is written as NAME.partial (preallocated) with a journal of durable pieces;
after the last piece: fsync, cold read-back against the manifest, stamp, atomic rename,
directory fsync. The source is opened read-only and its identity is checked before, during and
after. Nothing that exists and is not ours is overwritten without --replace; a failure leaves
the source, every verified replica and every durable piece as they were.

This module gathers the facts from the disk and carries out the plan; what the facts mean
(no-op, adopt, resume, fresh copy, refusal; space; pieces) is decided in `syncplan`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from core import rig as rigmod
from core.errors import EXIT_MISMATCH, EXIT_WRITE, Interrupted, MissingError, UsageError
from core.events import Notice, Reporter, emit
from core.fsutil import FileIdentity, allocated_bytes, free_bytes, fsync_dir, require_file
from core.units import format_bytes
from engines.registry import DEFAULT_ENGINE, get_engine

from .constants import PIECE_SIZE
from .drives import drive_label, drive_of
from .fanout import DestWriter, check_source, copy_pass
from .hashing import check_piece_size
from .journal import Journal, journal_header, read_journal
from .manifest import Manifest, ModelManifest, bad_pieces
from .manifests import load_manifest, save_manifest
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
    SyncResult,
    bytes_to_write,
    check_space,
    copy_block,
    drive_clash,
    partial_plan,
    space_needed,
    target_plan,
    too_many_sources,
    write_error_text,
)
from .throttle import Clock, Pace, Pacers
from .verdict import Verdict, standing_mismatch
from .verify import hash_pieces

__all__ = ["sync", "plan_destinations", "check_free_space", "DestPlan", "DestResult", "SyncResult"]


# ---------------------------------------------------------------------------------------------
# Planning: the facts about each destination, read before a byte is written.

def _trusted_manifest(rig: rigmod.Rig, source: str) -> Manifest | None:
    model = load_manifest(rig, required=False)
    m = model.files[0] if model is not None and len(model.files) == 1 else None
    if m and stamp_state(source, m, rig) == VERIFIED:
        return m
    return None


def plan_destinations(source: str, dest_dirs: list[str], rig: rigmod.Rig, manifest: Manifest | None, *,
                      piece_size: int, replace_existing: bool, allow_same_device: bool,
                      report: Reporter = None) -> list[DestPlan]:
    src_ident = FileIdentity.of(source)
    name = os.path.basename(source)
    try:
        src_key = drive_of(source).key
    except OSError:
        src_key = None
    member_keys = {}
    for m in rig.members:
        if os.path.realpath(m.path) != os.path.realpath(source) and os.path.exists(m.path):
            member_keys[os.path.realpath(m.path)] = drive_of(m.path).key
    plans, seen_keys, seen_targets = [], {}, set()
    for d in dest_dirs:
        if not os.path.exists(d):
            raise MissingError(f"destination {d}: no such directory (drive not mounted?); mount it or fix the path")
        if not os.path.isdir(d):
            raise UsageError(f"destination {d}: not a directory; give the directory to copy into")
        if not os.access(d, os.W_OK | os.X_OK):
            raise UsageError(f"destination {d}: not writable; check its permissions or mount options")
        target = os.path.join(os.path.abspath(d), name)
        if os.path.realpath(target) == os.path.realpath(source):
            raise UsageError(f"destination {d} is the source's own directory; choose another drive")
        if os.path.realpath(target) in seen_targets:
            raise UsageError(f"destination {d} is given twice")
        seen_targets.add(os.path.realpath(target))
        key = drive_of(d).key
        if not allow_same_device:
            clash = drive_clash(key, src_key, seen_keys, member_keys, os.path.realpath(target), source)
            if clash:
                raise UsageError(f"destination {d} is on the same physical drive as {clash} ({key}); a replica there "
                                 "adds no bandwidth — use --allow-same-device to copy anyway")
        seen_keys[key] = d
        plans.append(_plan_one(source, src_ident, d, target, rig, manifest, piece_size, replace_existing, report))
    return plans


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


def check_free_space(plans: list[DestPlan], size: int, piece_size: int, report: Reporter = None) -> None:
    """WriteError unless every file system holding writing destinations has room (with headroom);
    one notice per file system whose free space is unknown."""
    by_fs: dict[int, list[DestPlan]] = {}
    for p in plans:
        if p.writes:
            by_fs.setdefault(os.stat(p.dest_dir).st_dev, []).append(p)
    for group in by_fs.values():
        need = space_needed(size, [allocated_bytes(p.partial) for p in group])
        notice = check_space([p.dest_dir for p in group], need, free_space(group[0].dest_dir))
        if notice:
            emit(report, Notice(", ".join(p.dest_dir for p in group), notice))


# ---------------------------------------------------------------------------------------------
# After the copy: read back, stamp, rename.

def _finalize(p: DestPlan, w: DestWriter | None, source: str, manifest: Manifest, rig: rigmod.Rig, *, verify: bool,
              started: float | None, report: Reporter, cancel: threading.Event | None,
              pace: Pace | None = None) -> DestResult:
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
        if p.action != ADOPT:
            os.replace(path, p.target)
            fsync_dir(p.dest_dir)
            if stamped == "sidecar":  # the sidecar is keyed by path: re-record under the final name
                stamped = write_stamp(p.target, manifest, rig, tag_file=True)
            os.unlink(p.journal)
            fsync_dir(p.dest_dir)
        return DestResult(p.dest_dir, p.target, p.action, "copied" if p.action != ADOPT else "identical",
                          bytes_written=written, bytes_to_write=written,
                          seconds=time.monotonic() - (started if started is not None else t),
                          verified=stamped is not None, stamped=stamped)
    except Interrupted:
        raise
    except OSError as e:
        return DestResult(p.dest_dir, p.target, p.action, "failed", error=write_error_text(e), exit_code=EXIT_WRITE)


# ---------------------------------------------------------------------------------------------
# The whole job.

def sync(source: str, dest_dirs: list[str], rig_root: str, *, piece_size: int = PIECE_SIZE, dry_run: bool = False,
         verify: bool = True, replace_existing: bool = False, allow_same_device: bool = False,
         report: Reporter = None, cancel: threading.Event | None = None,
         max_rate: float | None = None, clock: Clock | None = None) -> SyncResult:
    """Copy `source` into every directory of `dest_dirs` (see the module's docstring).
    `max_rate` (bytes/s) paces each drive's reads and writes, by `clock` (the wall clock)."""
    t0 = time.monotonic()
    check_piece_size(piece_size)
    if not dest_dirs:
        raise UsageError("give at least one destination directory")
    require_file(source, "source", "give the model file to copy")
    source = os.path.abspath(source)
    rig = rigmod.load_rig(rig_root, must_exist=False)
    if rig.model is not None and os.path.realpath(source) not in {os.path.realpath(m.path) for m in rig.members}:
        raise UsageError(f"the rig at {rig_root} holds model {rig.model.path}; sync from it (or a replica), or use another --rig for {source}")
    src_ident = FileIdentity.of(source)
    size = src_ident.size
    manifest = _trusted_manifest(rig, source)
    if manifest is not None and manifest.piece_size != piece_size:
        emit(report, Notice(source, f"the manifest uses piece size {format_bytes(manifest.piece_size)}; keeping it"))
        piece_size = manifest.piece_size
    plans = plan_destinations(source, dest_dirs, rig, manifest, piece_size=piece_size,
                              replace_existing=replace_existing, allow_same_device=allow_same_device, report=report)
    for p in plans:
        if p.reason:
            emit(report, Notice(p.target, p.reason))
    engine = get_engine(DEFAULT_ENGINE)
    copies = {os.path.realpath(m.path) for m in rig.members} | {os.path.realpath(source)} | \
        {os.path.realpath(p.target) for p in plans}
    warning = too_many_sources(len(copies), engine.name, engine.max_sources)
    if warning:
        emit(report, Notice(source, warning))
    if dry_run:
        return SyncResult(source, size, manifest.blake3 if manifest else "", piece_size,
                          tuple(DestResult(p.dest_dir, p.target, p.action, "planned",
                                           bytes_to_write=bytes_to_write(p, size, piece_size))
                                for p in plans), 0, time.monotonic() - t0, dry_run=True)
    check_free_space(plans, size, piece_size, report)
    block = copy_block(piece_size)
    pacers = Pacers(max_rate, clock, cancel)
    src_pace = pacers.for_drive(_drive_key(source))
    dest_pace = {p.target: pacers.for_drive(_drive_key(p.dest_dir)) for p in plans}

    results: dict[str, DestResult] = {}
    writers: list[DestWriter] = []
    for p in plans:
        if p.writes:
            try:
                writers.append(DestWriter(p, source, src_ident, size, piece_size, block, report, dest_pace[p.target]))
            except OSError as e:
                results[p.target] = DestResult(p.dest_dir, p.target, p.action, "failed", error=write_error_text(e), exit_code=EXIT_WRITE)
    read = 0
    source_verified = False
    try:
        if writers or manifest is None:
            manifest, read = copy_pass(source, src_ident, writers, manifest, size, piece_size, block, report, cancel,
                                       src_pace)
            source_verified = read == size
    finally:
        for w in writers:
            w.finish()
    # Once more after every byte is durable: a source that changed at the last moment must not
    # have its old bytes renamed into place as a replica of the new file.
    check_source(source, src_ident, None)

    # Read back, stamp, rename: destinations in parallel, one reader each.
    by_target = {w.plan.target: w for w in writers}
    todo = [p for p in plans if p.target not in results]
    with ThreadPoolExecutor(max_workers=max(1, len(todo)), thread_name_prefix="finalize") as pool:
        done = pool.map(lambda p: _finalize(p, by_target.get(p.target), source, manifest, rig, verify=verify,
                                            started=t0 if p.target in by_target else None, report=report, cancel=cancel,
                                            pace=dest_pace[p.target]),
                        todo)
        for p, r in zip(todo, done):
            results[p.target] = r

    # Record what is now true in the rig.
    rig = rigmod.load_rig(rig_root, must_exist=False)
    if rig.model is None:
        rig = rigmod.with_model(rig, source, drive_label(source))
    for p in plans:
        r = results[p.target]
        if r.outcome in ("copied", "identical"):
            rig = rigmod.with_replica(rig, p.target, drive_label(p.target))
    rigmod.save_rig(rig)
    save_manifest(rig, ModelManifest(files=(dataclasses.replace(manifest, name=os.path.basename(source)),)))
    # What sync proved replaces what `status` remembers (a replica copied again after a mismatch).
    now = time.time()
    proven = {p.target: Verdict("verified", now, manifest.digest(), "sync")
              for p in plans if results[p.target].verified and p.action != NOOP}
    if source_verified and os.path.realpath(source) == os.path.realpath(rig.model.path):
        write_stamp(source, manifest, rig, tag_file=False, identity=src_ident)
        proven[rig.model.path] = Verdict("verified", now, manifest.digest(), "sync")
    record_verdicts(rig, proven)
    return SyncResult(source, size, manifest.blake3, piece_size, tuple(results[p.target] for p in plans),
                      read, time.monotonic() - t0)
