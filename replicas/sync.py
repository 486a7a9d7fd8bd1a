"""Copying the model to several drives at once (DESIGN §3).

One cold read of the source fans each block out to every destination in parallel; each
destination is written as NAME.partial (preallocated) with a journal of durable pieces; after
the last piece: fsync, cold read-back against the manifest, stamp, atomic rename, directory
fsync. The source is opened read-only and its identity is checked before, during and after.
Nothing that exists and is not ours is overwritten without --replace; a failure leaves the
source, every verified replica and every durable piece as they were.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import blake3

from core import rig as rigmod
from core.errors import (
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_WRITE,
    Interrupted,
    MismatchError,
    MissingError,
    UsageError,
    WriteError,
)
from core.events import Notice, Progress, Reporter, emit
from core.fsutil import FileIdentity, allocated_bytes, free_bytes, fsync_dir
from core.units import format_bytes

from .coldio import align_up, aligned_buffer, open_cold
from .constants import (
    ALIGNMENT,
    HEADROOM_FRACTION,
    HEADROOM_MAX,
    HEADROOM_MIN,
    IO_BLOCK,
    JOURNAL_SUFFIX,
    PARTIAL_SUFFIX,
    PIECE_SIZE,
    READ_AHEAD,
    WRITE_DEPTH,
)
from .drives import drive_label, drive_of
from .hashing import PieceHasher, check_piece_size
from .journal import Journal, journal_header, read_journal
from .manifest import Manifest, PieceRange, bad_pieces, piece_count
from .manifests import load_manifest, save_manifest
from .platform import drop_cached, open_for_direct_write
from .stamps import VERIFIED, stamp_state, write_stamp
from .verify import hash_pieces, runs_of

# What happens to one destination.
COPY, RESUME, NOOP, ADOPT, REPLACE = "copy", "resume", "noop", "adopt", "replace"


@dataclass(frozen=True)
class DestPlan:
    dest_dir: str
    target: str
    action: str                     # copy / resume / noop / adopt (verify an existing file) / replace
    durable: frozenset = frozenset()  # pieces already durable in the partial (resume)
    reason: str = ""

    @property
    def partial(self) -> str:
        return self.target + PARTIAL_SUFFIX

    @property
    def journal(self) -> str:
        return self.target + JOURNAL_SUFFIX

    @property
    def writes(self) -> bool:
        return self.action in (COPY, RESUME, REPLACE)


@dataclass(frozen=True)
class DestResult:
    dest_dir: str
    target: str
    action: str
    outcome: str                    # identical / copied / failed / planned
    bytes_written: int = 0
    bytes_to_write: int = 0
    seconds: float = 0.0
    verified: bool = False
    stamped: str | None = None
    bad: tuple[PieceRange, ...] = ()
    error: str = ""
    exit_code: int = EXIT_OK


@dataclass(frozen=True)
class SyncResult:
    source: str
    size: int
    blake3: str
    piece_size: int
    dests: tuple[DestResult, ...]
    source_bytes_read: int
    seconds: float
    dry_run: bool = False

    @property
    def exit_code(self) -> int:
        codes = [d.exit_code for d in self.dests if d.exit_code]
        return max(codes, key=lambda c: (c == EXIT_MISMATCH, c)) if codes else EXIT_OK


def headroom(size: int) -> int:
    """Free space kept beyond the file's own bytes (file-system metadata, other writers)."""
    return int(min(HEADROOM_MAX, max(HEADROOM_MIN, size * HEADROOM_FRACTION)))


# ---------------------------------------------------------------------------------------------
# Planning: decide what each destination needs before a byte is written.

def _trusted_manifest(rig: rigmod.Rig, source: str) -> Manifest | None:
    m = load_manifest(rig, required=False)
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
            clash = None
            if key == src_key:
                clash = f"the source {source}"
            elif key in seen_keys:
                clash = f"destination {seen_keys[key]}"
            else:
                for path, k in member_keys.items():
                    if k == key and path != os.path.realpath(target):
                        clash = f"replica {path}"
            if clash:
                raise UsageError(f"destination {d} is on the same physical drive as {clash} ({key}); a replica there adds no bandwidth — use --allow-same-device to copy anyway")
        seen_keys[key] = d
        plans.append(_plan_one(source, src_ident, d, target, rig, manifest, piece_size, replace_existing, report))
    return plans


def _plan_one(source, src_ident, d, target, rig, manifest, piece_size, replace_existing, report) -> DestPlan:
    partial, journal = target + PARTIAL_SUFFIX, target + JOURNAL_SUFFIX
    action = COPY
    if os.path.lexists(target):
        if not os.path.isfile(target) or os.path.islink(target):
            raise UsageError(f"{target} exists and is not a regular file; move it away")
        if manifest and stamp_state(target, manifest, rig) == VERIFIED:
            return DestPlan(d, target, NOOP, reason="identical replica already there (stamp)")
        if replace_existing:
            action = REPLACE
        elif os.path.getsize(target) == src_ident.size:
            return DestPlan(d, target, ADOPT, reason="a file of the same size is there: verifying it")
        else:
            raise UsageError(f"{target} exists and differs from the source (size {os.path.getsize(target)} vs {src_ident.size}); pass --replace to overwrite it")
    if os.path.exists(partial):
        header, durable = read_journal(journal)
        if header is None:
            raise UsageError(f"{partial} exists but has no journal of ours; it was not written by replicas — remove it or move it away")
        if header != journal_header(source, src_ident, piece_size):
            emit(report, Notice(target, "source or piece size changed since the interrupted copy: starting over"))
            return DestPlan(d, target, action, reason="restart (source changed)")
        if durable:
            return DestPlan(d, target, RESUME if action == COPY else action, frozenset(durable),
                            reason=f"resuming: {len(durable)} pieces already durable")
    return DestPlan(d, target, action)


def check_free_space(plans: list[DestPlan], size: int, piece_size: int) -> None:
    by_fs: dict[int, list[DestPlan]] = {}
    for p in plans:
        if p.writes:
            by_fs.setdefault(os.stat(p.dest_dir).st_dev, []).append(p)
    for group in by_fs.values():
        need = 0
        for p in group:
            need += max(0, size - allocated_bytes(p.partial)) + headroom(size)
        have = free_bytes(group[0].dest_dir)
        if need > have:
            where = ", ".join(p.dest_dir for p in group)
            raise WriteError(f"not enough free space on {where}: needs {format_bytes(need)} (with headroom), has {format_bytes(have)}; free some space or choose another drive")


# ---------------------------------------------------------------------------------------------
# Writing.

class _Writer:
    """One destination: up to WRITE_DEPTH block writes in flight (direct I/O wants a queue), and a
    syncer thread that fdatasyncs and journals each piece once all its blocks have landed."""

    def __init__(self, plan: DestPlan, source: str, src_ident, size: int, piece_size: int, block: int,
                 report: Reporter):
        self.plan, self.size, self.piece_size, self.report = plan, size, piece_size, report
        fresh = plan.action != RESUME
        self.journal = Journal(plan.journal, journal_header(source, src_ident, piece_size), fresh=fresh)
        # Direct writes: the 500 GB stream must not evict the page cache or pile up dirty
        # pages, and the read-back must not be answered from memory.
        self.fd, self.aligned = open_for_direct_write(
            plan.partial, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if fresh else 0))
        if allocated_bytes(plan.partial) < size or os.fstat(self.fd).st_size != size:
            try:
                os.posix_fallocate(self.fd, 0, size)
            except OSError as e:
                if e.errno not in (95, 22):  # file system without fallocate: plain writes still work
                    raise
                os.ftruncate(self.fd, size)
        self.need = set(range(piece_count(size, piece_size))) - set(plan.durable)
        self.durable_bytes = sum(min(piece_size, size - i * piece_size) for i in plan.durable)
        self.bytes_written = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._outstanding = {i: -(-min(piece_size, size - i * piece_size) // block) for i in self.need}
        self._hashes: dict[int, str] = {}
        self.pool = ThreadPoolExecutor(max_workers=WRITE_DEPTH, thread_name_prefix="write")
        self.sync_q: queue.Queue = queue.Queue()
        self.syncer = threading.Thread(target=self._sync_loop, name="fdatasync", daemon=True)
        self.syncer.start()

    def submit(self, offset: int, view: memoryview, piece: int, release) -> None:
        """Write one block (of one piece) in the background; `release()` once it is done with the buffer."""
        def done(_):
            release()
            self._landed(piece)

        self.pool.submit(self._write, offset, view).add_done_callback(done)

    def _write(self, offset: int, view: memoryview) -> None:
        if self.error is not None:
            return
        try:
            data = view
            if self.aligned and len(view) % ALIGNMENT:
                # The file's last block: direct I/O writes whole sectors, so write the padded
                # block (the read buffer is aligned and long enough) and cut the file back at
                # the end.
                data = memoryview(view.obj)[:align_up(len(view))]
                data[len(view):] = bytes(len(data) - len(view))
            done = 0
            while done < len(data):
                done += os.pwrite(self.fd, data[done:], offset + done)
            with self._lock:
                self.bytes_written += len(view)
        except BaseException as e:  # noqa: BLE001 - recorded, reported per destination
            self.error = e

    def _landed(self, piece: int) -> None:
        with self._lock:
            self._outstanding[piece] -= 1
            ready = self._outstanding[piece] == 0 and piece in self._hashes
        if ready:
            self.sync_q.put((piece, self._hashes[piece]))

    def piece_hashed(self, piece: int, digest: str) -> None:
        with self._lock:
            self._hashes[piece] = digest
            ready = self._outstanding[piece] == 0
        if ready:
            self.sync_q.put((piece, digest))

    def _sync_loop(self) -> None:
        while True:
            items = [self.sync_q.get()]
            while True:
                try:
                    items.append(self.sync_q.get_nowait())
                except queue.Empty:
                    break
            stop = any(it is None for it in items)
            items = [it for it in items if it is not None]
            if items and self.error is None:
                try:
                    os.fdatasync(self.fd)
                    self.journal.durable(items)
                    for i, _ in items:
                        drop_cached(self.fd, i * self.piece_size, self.piece_size)
                        self.durable_bytes += min(self.piece_size, self.size - i * self.piece_size)
                    emit(self.report, Progress(self.plan.target, "copy", self.durable_bytes, self.size))
                except BaseException as e:  # noqa: BLE001
                    self.error = e
            if stop:
                return

    def finish(self) -> None:
        """Drain writes and syncs; fsync the file. Errors stay in self.error."""
        self.pool.shutdown(wait=True)
        self.sync_q.put(None)
        self.syncer.join()
        if self.error is None:
            try:
                if os.fstat(self.fd).st_size > self.size:
                    os.ftruncate(self.fd, self.size)
                os.fsync(self.fd)
            except OSError as e:
                self.error = e
        os.close(self.fd)
        self.journal.close()


def copy_block(piece_size: int) -> int:
    """The I/O size of the copy: the largest aligned divisor of the piece size up to IO_BLOCK,
    so every block belongs to exactly one piece."""
    if piece_size <= IO_BLOCK:
        return piece_size
    units = piece_size // ALIGNMENT
    for d in range(IO_BLOCK // ALIGNMENT, 0, -1):
        if units % d == 0:
            return d * ALIGNMENT
    return ALIGNMENT


class _Buffers:
    """A fixed set of aligned block buffers shared by the reader and the writers."""

    def __init__(self, count: int, size: int):
        self.free: queue.Queue = queue.Queue()
        for _ in range(count):
            self.free.put(aligned_buffer(size))

    def get(self):
        return self.free.get()

    def put(self, buf) -> None:
        self.free.put(buf)

    def empty(self) -> bool:
        return self.free.empty()


def _error_text(e: BaseException) -> str:
    if isinstance(e, OSError):
        hint = {28: "the drive is full", 27: "the file is larger than this process or file system may write (RLIMIT_FSIZE / FAT32?)",
                30: "the file system is read-only", 5: "the drive reported an I/O error", 13: "permission denied"}.get(e.errno, "")
        return f"write failed: {e.strerror or e}" + (f" ({hint})" if hint else "")
    return str(e)


def _copy_pass(source: str, src_ident: FileIdentity, writers: list[_Writer], manifest: Manifest | None,
               size: int, piece_size: int, block: int, report: Reporter,
               cancel: threading.Event | None) -> tuple[Manifest | None, int]:
    """Read the source once (the pieces anyone needs, or all of it to compute the manifest),
    fanning every block out to the writers. Returns (manifest, bytes read).

    READ_AHEAD reads stay in flight on the source; each block is hashed on this thread while
    the writers write it; a buffer returns to the pool when its last writer is done, so the
    slowest destination paces the stream (backpressure) without stalling the others' queues.
    """
    n = piece_count(size, piece_size)
    need_read = set(range(n)) if manifest is None else set().union(*(w.need for w in writers)) if writers else set()
    buffers = _Buffers(READ_AHEAD + WRITE_DEPTH * 2 + 2, block)
    hasher = PieceHasher(piece_size, 0, whole=(manifest is None))
    piece_hashes: dict[int, str] = {}
    read = 0
    last_check = time.monotonic()
    inflight: deque = deque()

    def blocks():
        for lo, hi in runs_of(sorted(need_read)):
            for off in range(lo * piece_size, min(hi * piece_size, size), block):
                yield off, min(block, size - off)

    def process(off: int, length: int, buf, fut) -> None:
        nonlocal read, last_check
        got = fut.result()
        if got < length:
            buffers.put(buf)
            raise MissingError(f"source {source}: read stopped at byte {off + got} of {size} (file shrank or drive failed)")
        view = memoryview(buf)[:length]
        piece = off // piece_size
        targets = [w for w in writers if w.error is None and piece in w.need]
        left = [len(targets)]
        lock = threading.Lock()

        def release():
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                buffers.put(buf)

        for w in targets:
            w.submit(off, view, piece, release)
        if hasher.pos != off:      # a gap (pieces nobody needs): start hashing afresh there
            hasher.pos, hasher.piece = off, blake3.blake3()
        done = hasher.update(view)
        if off + length == size:
            done += hasher.finish()
        if not targets:
            buffers.put(buf)
        read += length
        for i in done:
            piece_hashes[i] = hasher.pieces[i]
            if manifest is not None and hasher.pieces[i] != manifest.pieces[i]:
                raise MismatchError(f"source {source}: piece {i} (bytes {i * piece_size}+{manifest.piece(i).length}) no longer matches the manifest; the model changed or its drive returns bad data — run `replicas verify --full`")
            for w in writers:
                if i in w.need:
                    w.piece_hashed(i, hasher.pieces[i])
        if not writers:
            emit(report, Progress(source, "hash", read, size))
        now = time.monotonic()
        if now - last_check > 0.5:
            last_check = now
            _check_source(source, src_ident, reader.fd)

    with open_cold(source) as reader, ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="source") as pool:
        _check_source(source, src_ident, reader.fd)
        try:
            for off, length in blocks():
                if cancel is not None and cancel.is_set():
                    break
                while inflight and buffers.empty():
                    process(*inflight.popleft())
                buf = buffers.get()
                inflight.append((off, length, buf, pool.submit(reader.read_into, memoryview(buf)[:align_up(length)], off)))
                if len(inflight) >= READ_AHEAD:
                    process(*inflight.popleft())
            while inflight and not (cancel is not None and cancel.is_set()):
                process(*inflight.popleft())
        finally:
            for *_, fut in inflight:
                try:
                    fut.result()
                except OSError:
                    pass
        if cancel is not None and cancel.is_set():
            raise Interrupted("sync interrupted; durable pieces are kept: run the same command again to resume")
    _check_source(source, src_ident, None)
    if manifest is None:
        manifest = Manifest(size=size, blake3=hasher.whole.hexdigest(), piece_size=piece_size,
                            pieces=tuple(piece_hashes[i] for i in range(n)), name=os.path.basename(source))
    return manifest, read


def _check_source(source: str, ident: FileIdentity, fd: int | None) -> None:
    now = [FileIdentity.of_fd(fd)] if fd is not None else []
    try:
        now.append(FileIdentity.of(source))
    except FileNotFoundError:
        raise MissingError(f"source {source} disappeared during the copy; nothing was renamed, re-run when it is back") from None
    for cur in now:
        if (cur.size, cur.mtime_ns, cur.inode) != (ident.size, ident.mtime_ns, ident.inode):
            raise MismatchError(f"source {source} changed during the copy (size, mtime or inode); no replica was renamed into place — re-run to copy the new contents")


# ---------------------------------------------------------------------------------------------
# The whole job.

def sync(source: str, dest_dirs: list[str], rig_root: str, *, piece_size: int = PIECE_SIZE, dry_run: bool = False,
         verify: bool = True, replace_existing: bool = False, allow_same_device: bool = False,
         report: Reporter = None, cancel: threading.Event | None = None) -> SyncResult:
    t0 = time.monotonic()
    check_piece_size(piece_size)
    if not dest_dirs:
        raise UsageError("give at least one destination directory")
    if not os.path.exists(source):
        raise MissingError(f"source {source}: no such file")
    if not os.path.isfile(source):
        raise UsageError(f"source {source}: not a regular file")
    if not os.access(source, os.R_OK):
        raise MissingError(f"source {source}: not readable (permission denied)")
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
    if dry_run:
        return SyncResult(source, size, manifest.blake3 if manifest else "", piece_size,
                          tuple(DestResult(p.dest_dir, p.target, p.action, "planned",
                                           bytes_to_write=size - sum(min(piece_size, size - i * piece_size) for i in p.durable) if p.writes else 0)
                                for p in plans), 0, time.monotonic() - t0, dry_run=True)
    check_free_space(plans, size, piece_size)
    block = copy_block(piece_size)

    results: dict[str, DestResult] = {}
    writers: list[_Writer] = []
    for p in plans:
        if p.writes:
            try:
                writers.append(_Writer(p, source, src_ident, size, piece_size, block, report))
            except OSError as e:
                results[p.target] = DestResult(p.dest_dir, p.target, p.action, "failed", error=_error_text(e), exit_code=EXIT_WRITE)
    read = 0
    source_verified = False
    try:
        if writers or manifest is None:
            manifest, read = _copy_pass(source, src_ident, writers, manifest, size, piece_size, block, report, cancel)
            source_verified = read == size
    finally:
        for w in writers:
            w.finish()
    # Once more after every byte is durable: a source that changed at the last moment must not
    # have its old bytes renamed into place as a replica of the new file.
    _check_source(source, src_ident, None)
    starts = {w.plan.target: t0 for w in writers}

    # Read back, stamp, rename: destinations in parallel, one reader each.
    def finalize(p: DestPlan, w: _Writer | None) -> DestResult:
        t = time.monotonic()
        if p.action == NOOP:
            return DestResult(p.dest_dir, p.target, p.action, "identical", verified=True)
        if w is not None and w.error is not None:
            return DestResult(p.dest_dir, p.target, p.action, "failed", bytes_written=w.bytes_written,
                              error=_error_text(w.error) + "; durable pieces are kept, re-run to resume", exit_code=EXIT_WRITE)
        path = p.target if p.action == ADOPT else p.partial
        try:
            if verify or p.action == ADOPT:
                hashes, _ = hash_pieces(path, manifest, task=p.target, report=report, cancel=cancel)
                bad = bad_pieces(manifest, hashes, os.path.getsize(path))
                if bad:
                    if p.action == ADOPT:
                        return DestResult(p.dest_dir, p.target, p.action, "failed", bad=tuple(bad),
                                          error=f"{p.target} exists and differs from the source ({len(bad)} pieces); pass --replace to overwrite it",
                                          exit_code=EXIT_MISMATCH)
                    j = Journal(p.journal, {}, fresh=False)
                    j.withdraw([b.index for b in bad])
                    j.close()
                    return DestResult(p.dest_dir, p.target, p.action, "failed", bytes_written=w.bytes_written if w else 0, bad=tuple(bad),
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
                              bytes_written=w.bytes_written if w else 0, bytes_to_write=w.bytes_written if w else 0,
                              seconds=time.monotonic() - starts.get(p.target, t), verified=stamped is not None, stamped=stamped)
        except Interrupted:
            raise
        except OSError as e:
            return DestResult(p.dest_dir, p.target, p.action, "failed", error=_error_text(e), exit_code=EXIT_WRITE)

    by_target = {w.plan.target: w for w in writers}
    todo = [p for p in plans if p.target not in results]
    with ThreadPoolExecutor(max_workers=max(1, len(todo)), thread_name_prefix="finalize") as pool:
        for p, r in zip(todo, pool.map(lambda p: finalize(p, by_target.get(p.target)), todo)):
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
    save_manifest(rig, manifest)
    if source_verified and os.path.realpath(source) == os.path.realpath(rig.model.path):
        write_stamp(source, manifest, rig, tag_file=False, identity=src_ident)
    return SyncResult(source, size, manifest.blake3, piece_size, tuple(results[p.target] for p in plans),
                      read, time.monotonic() - t0)
