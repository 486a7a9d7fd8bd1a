"""The copy itself: one cold read of the source fanned out to every destination (docs/replicas.md).

`copy_pass` reads the source once (the pieces anyone needs, or all of it when the manifest is
still to be computed), hashes each block on the reading thread and hands it to one
`DestWriter` per destination. A writer keeps a few block writes in flight on its NAME.partial
and a syncer thread that fdatasyncs and journals each piece once all its blocks have landed.
What to read and how pieces add up is decided in `syncplan`; this module only moves bytes.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from core.errors import Interrupted, MissingError
from core.events import Progress, Reporter, emit
from core.fsutil import FileIdentity, allocated_bytes

from core.coldio import align_up, aligned_buffer, open_cold
from core.constants import ALIGNMENT, READ_AHEAD

from .constants import WRITE_DEPTH
from .hashing import PieceHasher
from .journal import Journal, journal_header
from .manifest import Manifest, piece_count
from core.platform import drop_cached, open_for_direct_write
from .syncplan import (
    RESUME,
    DestPlan,
    blocks_per_piece,
    blocks_to_read,
    identity_change,
    piece_bytes,
    piece_differs,
    pieces_to_read,
    source_changed,
)
from .throttle import Pace

SOURCE_CHECK_S = 0.5    # s between identity checks of the source while it is read


class DestWriter:
    """One destination: up to WRITE_DEPTH block writes in flight (direct I/O wants a queue), and a
    syncer thread that fdatasyncs and journals each piece once all its blocks have landed."""

    def __init__(self, plan: DestPlan, source: str, src_ident: FileIdentity, size: int, piece_size: int, block: int,
                 report: Reporter, pace: Pace | None = None, *, task: str | None = None, done_before: int = 0,
                 total: int | None = None):
        self.plan, self.size, self.piece_size, self.report = plan, size, piece_size, report
        self.pace = pace            # this destination drive's --max-rate pacer
        # Progress is the destination's over the whole model: `done_before` bytes of the files
        # before this one, out of `total` (the model's bytes), under the destination's name.
        self.task, self.done_before, self.total = task or plan.target, done_before, total or size
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
        self.durable_bytes = piece_bytes(plan.durable, size, piece_size)
        self.bytes_written = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._outstanding = blocks_per_piece(self.need, size, piece_size, block)
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
            if self.pace is not None:
                self.pace(len(view))
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
                    self.durable_bytes += piece_bytes((i for i, _ in items), self.size, self.piece_size)
                    emit(self.report, Progress(self.task, "copy", self.done_before + self.durable_bytes, self.total))
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


def check_source(source: str, ident: FileIdentity, fd: int | None) -> None:
    """Raise the one 'source changed' MismatchError when the open file (fd) or the name now has
    another size, mtime or inode than `ident`; MissingError when the name is gone."""
    now = [FileIdentity.of_fd(fd)] if fd is not None else []
    try:
        now.append(FileIdentity.of(source))
    except FileNotFoundError:
        raise MissingError(f"source {source} disappeared during the copy; nothing was renamed, re-run when it is back") from None
    for cur in now:
        how = identity_change(ident, cur)
        if how:
            raise source_changed(source, how)


def copy_pass(source: str, src_ident: FileIdentity, writers: list[DestWriter], manifest: Manifest | None,
              size: int, piece_size: int, block: int, report: Reporter,
              cancel: threading.Event | None, pace: Pace | None = None) -> tuple[Manifest | None, int]:
    """Read the source once (the pieces anyone needs, or all of it to compute the manifest),
    fanning every block out to the writers. Returns (manifest, bytes read).

    READ_AHEAD reads stay in flight on the source; each block is hashed on this thread while
    the writers write it; a buffer returns to the pool when its last writer is done, so the
    slowest destination paces the stream (backpressure) without stalling the others' queues.

    A source that changes while it is read is refused the same way whichever check sees it
    first (the identity checks, a piece that no longer hashes to the trusted manifest, a read
    that stops short): `source_changed`, a MismatchError. `pace` paces the source drive's
    reads (--max-rate).
    """
    n = piece_count(size, piece_size)
    need_read = pieces_to_read(n, manifest is not None, [w.need for w in writers])
    buffers = _Buffers(READ_AHEAD + WRITE_DEPTH * 2 + 2, block)
    hasher = PieceHasher(piece_size, 0, whole=(manifest is None))
    piece_hashes: dict[int, str] = {}
    read = 0
    last_check = time.monotonic()
    inflight: deque = deque()

    def process(off: int, length: int, buf, fut) -> None:
        nonlocal read, last_check
        got = fut.result()
        if got < length:
            buffers.put(buf)
            check_source(source, src_ident, reader.fd)       # a file that shrank changed
            raise MissingError(f"source {source}: read stopped at byte {off + got} of {size} while its size, mtime and "
                               "inode stayed the same (its drive failed?); nothing was renamed — check the drive and re-run")
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
            hasher.restart(off)
        done = hasher.update(view)
        if off + length == size:
            done += hasher.finish()
        if not targets:
            buffers.put(buf)
        read += length
        for i in done:
            piece_hashes[i] = hasher.pieces[i]
            if manifest is not None and hasher.pieces[i] != manifest.pieces[i]:
                # New bytes come with a new mtime: say so when the identity shows it, and
                # report the piece otherwise — the same refusal either way.
                check_source(source, src_ident, reader.fd)
                raise source_changed(source, piece_differs(manifest.piece(i)))
            for w in writers:
                if i in w.need:
                    w.piece_hashed(i, hasher.pieces[i])
        if not writers:
            emit(report, Progress(source, "hash", read, size))
        now = time.monotonic()
        if now - last_check > SOURCE_CHECK_S:
            last_check = now
            check_source(source, src_ident, reader.fd)

    with open_cold(source) as reader, ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="source") as pool:
        check_source(source, src_ident, reader.fd)
        try:
            for off, length in blocks_to_read(need_read, size, piece_size, block):
                if cancel is not None and cancel.is_set():
                    break
                while inflight and buffers.empty():
                    process(*inflight.popleft())
                buf = buffers.get()
                if pace is not None:
                    pace(length)
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
    check_source(source, src_ident, None)
    if manifest is None:
        manifest = Manifest(size=size, blake3=hasher.whole.hexdigest(), piece_size=piece_size,
                            pieces=tuple(piece_hashes[i] for i in range(n)), name=os.path.basename(source))
    return manifest, read
