"""The split reader: every expert read split across the primary and its replicas (DESIGN §5).

A read `(offset, length)` is split with the planner's `split_read` (the engine's rule, never
arithmetic of our own) using the prefill (base) or the decode weights; each piece goes to its
source's persistent lanes (threads: `os.preadv` releases the GIL), and the read completes at the
barrier, when its last piece lands. Ranges need not be 4 KiB-aligned: a piece's aligned interior
is read straight into the read's aligned buffer and its unaligned edges through one covering
page each, so cold (O_DIRECT) reads work on any GGUF and every piece yields exact bytes.

Beyond the engine: a piece that fails (OSError) or comes back short is re-read from another
healthy source, the failing source is marked degraded and gets no further pieces (its share goes
to the others by their weights); a source whose file vanishes or shrinks mid-run is degraded the
same way. Every such event is kept in `stats()` and passed to `report` (called from lane threads:
keep it quick and thread-safe). Only when no source can deliver a piece does a read raise
`MissingError`.
"""

from __future__ import annotations

import ctypes
import os
import queue
import stat as stat_mod
import threading
import time
from array import array
from typing import Callable, Sequence

from core.errors import MissingError, UsageError
from engines.registry import DEFAULT_ENGINE
from engines.split import check_weights
from replicas.coldio import ColdReader, align_down, align_up, aligned_buffer
from replicas.constants import ALIGNMENT

from .readstats import ReaderEvent, ReaderStats, SourceStats, format_stats, healthy_split, last_landing, latency_summary

PHASES = ("prefill", "decode")
HEALTH_INTERVAL_S = 1.0        # how often submit() re-stats the source files (vanished/truncated)
POOL_BYTES = 512 << 20         # released read buffers kept for reuse, bytes

__all__ = ["SplitReader", "ReadTicket", "CachedReader", "ReaderStats", "SourceStats", "ReaderEvent", "format_stats"]


class CachedReader(ColdReader):
    """The `ColdReader` seam without the cold part: plain buffered reads that may be served by
    the page cache (how = 'cached'). For measuring the reader's own ceiling (`cold=False`) on
    tmpfs or cached files; never for drive measurements."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.how = "cached"
        self.size = os.fstat(self.fd).st_size


def span(offset: int, length: int) -> int:
    """Bytes of the aligned buffer a read of (offset, length) needs: its covering aligned range."""
    return align_up(offset + length) - align_down(offset)


def _check_buffer(buffer, offset: int, length: int):
    mv = memoryview(buffer)
    if mv.readonly or not mv.c_contiguous:
        raise UsageError("split reader: buffer must be writable and contiguous (use replicas.coldio.aligned_buffer)")
    need = span(offset, length)
    if mv.nbytes < need:
        raise UsageError(f"split reader: buffer of {mv.nbytes} bytes is too small for read ({offset}, {length}); "
                         f"it needs {need} (span(offset, length))")
    anchor = ctypes.c_char.from_buffer(mv.cast("B"))
    addr = ctypes.addressof(anchor)
    del anchor
    if addr % ALIGNMENT:
        raise UsageError("split reader: buffer is not page-aligned (O_DIRECT needs it); use replicas.coldio.aligned_buffer")
    return buffer


class _BufferPool:
    """Released read buffers kept by size class for reuse, up to `limit` bytes in all."""

    GRAIN = 1 << 20

    def __init__(self, limit: int):
        self.limit = limit
        self.free: dict[int, list] = {}
        self.held = 0
        self.lock = threading.Lock()

    @classmethod
    def size_class(cls, nbytes: int) -> int:
        if nbytes >= cls.GRAIN:
            return align_up(nbytes, cls.GRAIN)
        return max(ALIGNMENT, 1 << (nbytes - 1).bit_length())

    def get(self, nbytes: int):
        size = self.size_class(nbytes)
        with self.lock:
            bucket = self.free.get(size)
            if bucket:
                self.held -= size
                return bucket.pop()
        return aligned_buffer(size)

    def put(self, buf) -> None:
        size = len(buf)
        with self.lock:
            if self.held + size <= self.limit:
                self.free.setdefault(size, []).append(buf)
                self.held += size


class _Short(Exception):
    """A piece came back with fewer bytes than the file must hold there."""


class ReadTicket:
    """One read in flight: `result()` waits for its barrier and returns exactly its bytes."""

    __slots__ = ("offset", "length", "phase", "_buf", "_base", "_remaining", "_landings", "_done", "_error", "_pool")

    def __init__(self, offset: int, length: int, phase: str, buf, base: int, pieces: int, pool=None):
        self.offset, self.length, self.phase = offset, length, phase
        self._buf, self._base, self._pool = buf, base, pool
        self._remaining = pieces
        self._landings: list[tuple[int, int]] = []
        self._done = threading.Event()
        self._error: BaseException | None = None
        if pieces == 0:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> memoryview:
        if not self._done.wait(timeout):
            raise TimeoutError(f"read ({self.offset}, {self.length}) still in flight after {timeout}s")
        if self._error is not None:
            raise self._error
        if self._buf is None:
            raise UsageError(f"read ({self.offset}, {self.length}): result() after release()")
        lo = self.offset - self._base
        return memoryview(self._buf)[lo:lo + self.length]

    def release(self) -> None:
        """Give the reader's buffer back for reuse by a later read (a fresh buffer's page faults
        cost more than a tmpfs read on a small VM). Views from `result()` must not be used after.
        A no-op for a caller's own buffer; waits for the read to finish first."""
        self._done.wait()
        buf, pool = self._buf, self._pool
        self._buf, self._pool = None, None
        if pool is not None and buf is not None:
            pool.put(buf)


class SplitReader:
    """Reads byte ranges of one model file split across its sources (primary first, then replicas).

    paths: the primary then its replicas (byte-identical files on distinct inodes).
    weights: base (prefill) weights, one per source, integers 1..100.
    decode_weights: weights used when phase == 'decode' (default: the base weights).
    lanes: reader threads per source. cold: O_DIRECT / F_NOCACHE reads (False: page-cache reads,
    for the reader's ceiling). opener: makes the per-source reader (default ColdReader or
    CachedReader); tests inject failing readers through it.
    """

    def __init__(self, paths: Sequence[str], weights: Sequence[int], decode_weights: Sequence[int] | None = None, *,
                 lanes: int = 8, engine: str = DEFAULT_ENGINE, report: Callable | None = None, cold: bool = True,
                 opener: Callable[[str], ColdReader] | None = None, health_interval: float = HEALTH_INTERVAL_S,
                 pool_bytes: int = POOL_BYTES):
        paths = [os.fspath(p) for p in paths]
        if not paths:
            raise UsageError("split reader: give at least one source (the primary model file)")
        weights = check_weights(tuple(weights), engine)
        if len(weights) != len(paths):
            raise UsageError(f"split reader: {len(weights)} weights ({':'.join(map(str, weights))}) for {len(paths)} "
                             "sources; give one weight per source, primary first")
        decode = weights if decode_weights is None else check_weights(tuple(decode_weights), engine)
        if len(decode) != len(paths):
            raise UsageError(f"split reader: {len(decode)} decode weights ({':'.join(map(str, decode))}) for "
                             f"{len(paths)} sources; give exactly one per source (the engine silently ignores a wrong count)")
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise UsageError(f"split reader: lanes must be an integer >= 1, got {lanes!r}")
        self.paths = tuple(paths)
        self.weights, self.decode_weights = weights, decode
        self.engine, self.lanes, self.cold = engine, lanes, cold
        self._report = report
        self._health_interval = health_interval
        self._identity = self._check_sources(paths)
        self.size = self._identity[0][2]

        opener = opener or (ColdReader if cold else CachedReader)
        self._readers: list[ColdReader] = []
        try:
            for p in paths:
                self._readers.append(opener(p))
        except OSError as e:
            self._close_readers()
            raise MissingError(f"{e.filename or p}: cannot open for reading ({e.strerror or e}); check the drive is mounted and the file readable") from None
        self.how = tuple(r.how for r in self._readers)

        n = len(paths)
        self._lock = threading.Lock()
        self._degraded = [False] * n
        self._bytes = [0] * n
        self._reads = [0] * n
        self._failover_bytes = [0] * n
        self._lands_last = [0] * n
        self._gap_ns = [0] * n
        self._lat = [array("q") for _ in range(n)]
        self._src_events = [0] * n
        self._events: list[ReaderEvent] = []
        self._reads_done = 0
        self._bytes_done = 0
        self._last_health = time.monotonic()
        self._closed = False
        self._pool = _BufferPool(pool_bytes)
        self._queues = [queue.SimpleQueue() for _ in range(n)]
        self._threads = []
        for s in range(n):
            for k in range(lanes):
                t = threading.Thread(target=self._lane, args=(s,), name=f"split-reader-s{s}-l{k}", daemon=True)
                t.start()
                self._threads.append(t)

    # -- set-up -----------------------------------------------------------------------------

    @staticmethod
    def _check_sources(paths: Sequence[str]) -> list[tuple[int, int, int]]:
        """(device, inode, size) of each source; refuses what the engine would refuse."""
        seen: dict[tuple[int, int], str] = {}
        ident = []
        for i, p in enumerate(paths):
            try:
                st = os.stat(p)
            except FileNotFoundError:
                raise MissingError(f"{p}: not found; check the drive is mounted (source {i})") from None
            except OSError as e:
                raise MissingError(f"{p}: cannot stat ({e.strerror}); check the drive (source {i})") from None
            if not stat_mod.S_ISREG(st.st_mode):
                raise UsageError(f"{p}: not a regular file; a source must be the model file or a replica of it")
            if ident and st.st_size != ident[0][2]:
                raise UsageError(f"{p}: size {st.st_size} differs from the primary's {ident[0][2]} ({paths[0]}); "
                                 "a replica must be a byte-identical copy: re-copy it with `replicas sync`")
            key = (st.st_dev, st.st_ino)
            if key in seen:
                raise UsageError(f"{p}: same file as {seen[key]} (one inode); give each source once, "
                                 "each replica a distinct copy")
            seen[key] = p
            ident.append((st.st_dev, st.st_ino, st.st_size))
        return ident

    # -- reads ------------------------------------------------------------------------------

    def submit(self, offset: int, length: int, phase: str = "prefill", buffer=None) -> ReadTicket:
        """Start one read; its pieces go to the lanes at once. `ticket.result()` waits for it.

        buffer: optional page-aligned writable buffer (from `aligned_buffer`) of at least
        `span(offset, length)` bytes to read into, so a caller with its own staging buffers avoids
        allocating (and faulting in) a fresh one per read; the bytes land at
        `offset - align_down(offset)` in it. Default: a buffer of the reader's, which
        `ticket.release()` hands back for reuse once the caller is done with the bytes.
        """
        if self._closed:
            raise UsageError("split reader: read after close()")
        if phase not in PHASES:
            raise UsageError(f"split reader: phase {phase!r} is not one of {', '.join(PHASES)}")
        if offset < 0 or length < 0 or offset + length > self.size:
            raise UsageError(f"split reader: read ({offset}, {length}) is outside the file (size {self.size})")
        if self._health_interval is not None and time.monotonic() - self._last_health >= self._health_interval:
            self.check_sources()
        with self._lock:
            healthy = [i for i, d in enumerate(self._degraded) if not d]
        if not healthy:
            raise MissingError(f"split reader: every source is degraded ({', '.join(self.paths)}); "
                               "check the drives and re-run")
        weights = self.decode_weights if phase == "decode" else self.weights
        pieces = healthy_split(offset, length, weights, healthy, self.engine)
        base = align_down(offset)
        if buffer is None:
            buf, pool = self._pool.get(span(offset, length)), self._pool
        else:
            buf, pool = _check_buffer(buffer, offset, length), None
        ticket = ReadTicket(offset, length, phase, buf, base, len(pieces), pool)
        for s, po, pl in pieces:
            self._queues[s].put((ticket, po, pl))
        return ticket

    def read(self, offset: int, length: int, phase: str = "prefill", buffer=None) -> memoryview:
        """Exactly the bytes [offset, offset+length), read split across the sources."""
        return self.submit(offset, length, phase, buffer).result()

    def read_many(self, ranges: Sequence[tuple[int, int]], phase: str = "prefill",
                  buffers: Sequence | None = None) -> list[memoryview]:
        """Several reads in flight together; each completes at its own barrier."""
        if buffers is not None and len(buffers) < len(ranges):
            raise UsageError(f"split reader: {len(buffers)} buffers for {len(ranges)} reads")
        tickets = [self.submit(o, n, phase, None if buffers is None else buffers[i]) for i, (o, n) in enumerate(ranges)]
        return [t.result() for t in tickets]

    # -- lanes ------------------------------------------------------------------------------

    def _lane(self, src: int) -> None:
        q = self._queues[src]
        scratch = memoryview(aligned_buffer(2 * self._readers[src].alignment))
        while True:
            task = q.get()
            if task is None:
                return
            ticket, off, ln = task
            try:
                self._serve(src, ticket, off, ln, scratch)
            except BaseException as e:  # a bug must reach the caller, not kill the lane silently
                self._land(ticket, src, time.monotonic_ns(), error=e)

    def _serve(self, src: int, ticket: ReadTicket, off: int, ln: int, scratch) -> None:
        tried: list[int] = []
        s = src
        while True:
            t0 = time.monotonic_ns()
            try:
                self._read_piece(self._readers[s], ticket, off, ln, scratch)
            except (OSError, _Short) as e:
                tried.append(s)
                self._piece_failed(s, off, ln, e)
                nxt = self._failover_source(tried)
                if nxt is None:
                    err = MissingError(f"split reader: no source could read ({off}, {ln}) of read "
                                       f"({ticket.offset}, {ticket.length}); tried "
                                       + ", ".join(self.paths[i] for i in tried) + "; check the drives")
                    self._event("all_failed", s, str(err), off, ln)
                    self._land(ticket, s, time.monotonic_ns(), error=err)
                    return
                self._event("failover", nxt, f"piece ({off}, {ln}) of source {s} re-read from source {nxt}", off, ln)
                s = nxt
                continue
            t1 = time.monotonic_ns()
            with self._lock:
                self._bytes[s] += ln
                self._reads[s] += 1
                self._lat[s].append(t1 - t0)
                if s != src:
                    self._failover_bytes[s] += ln
            self._land(ticket, s, t1)
            return

    @staticmethod
    def _read_piece(reader: ColdReader, ticket: ReadTicket, off: int, ln: int, scratch) -> None:
        """Exact bytes [off, off+ln) into the ticket's buffer: the aligned interior directly,
        unaligned edges through a covering page of `scratch` (never touching a neighbour's bytes)."""
        a = reader.alignment
        buf = memoryview(ticket._buf)
        base = ticket._base
        end = off + ln
        lo, hi = align_up(off, a), align_down(end, a)
        if lo >= hi:  # no whole aligned page inside the piece: one or two covering pages
            start = align_down(off, a)
            span = align_up(end, a) - start
            if reader.read_into(scratch[:span], start) < end - start:
                raise _Short()
            buf[off - base:end - base] = scratch[off - start:end - start]
            return
        if off < lo:
            if reader.read_into(scratch[:a], lo - a) < a:
                raise _Short()
            buf[off - base:lo - base] = scratch[off - (lo - a):a]
        if reader.read_into(buf[lo - base:hi - base], lo) < hi - lo:
            raise _Short()
        if hi < end:
            if reader.read_into(scratch[:a], hi) < end - hi:
                raise _Short()
            buf[hi - base:end - base] = scratch[:end - hi]

    def _land(self, ticket: ReadTicket, src: int, t_ns: int, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None and ticket._error is None:
                ticket._error = error
            else:
                ticket._landings.append((src, t_ns))
            ticket._remaining -= 1
            if ticket._remaining:
                return
            if ticket._error is None:
                ll = last_landing(ticket._landings)
                if ll is not None:
                    self._lands_last[ll[0]] += 1
                    self._gap_ns[ll[0]] += ll[1]
                self._reads_done += 1
                self._bytes_done += ticket.length
        ticket._done.set()

    # -- health -----------------------------------------------------------------------------

    def _event(self, kind: str, src: int, message: str, off: int = 0, ln: int = 0) -> None:
        ev = ReaderEvent(kind, src, self.paths[src], message, off, ln, time.monotonic_ns())
        with self._lock:
            self._events.append(ev)
            self._src_events[src] += 1
        if self._report is not None:
            self._report(ev)

    def _degrade(self, src: int, why: str) -> None:
        with self._lock:
            if self._degraded[src]:
                return
            self._degraded[src] = True
            left = [i for i, d in enumerate(self._degraded) if not d]
        plan = ":".join(str(self.weights[i]) for i in left) if left else "none"
        self._event("degraded", src, f"source {src} degraded ({why}); reads go to sources {left or 'none'} "
                                     f"with weights {plan}")

    def _piece_failed(self, src: int, off: int, ln: int, e: BaseException) -> None:
        if isinstance(e, _Short):
            kind, why = "short_read", f"piece ({off}, {ln}) came back short (file truncated?)"
        else:
            kind, why = "read_failed", f"piece ({off}, {ln}) failed: {getattr(e, 'strerror', None) or e}"
        self._event(kind, src, why, off, ln)
        self._degrade(src, why)

    def _failover_source(self, tried: Sequence[int]) -> int | None:
        """The healthy source not yet tried with the largest base weight (ties to the lower index)."""
        with self._lock:
            cands = [i for i, d in enumerate(self._degraded) if not d and i not in tried]
        if not cands:
            return None
        return max(cands, key=lambda i: (self.weights[i], -i))

    def check_sources(self) -> list[int]:
        """Re-stat every healthy source; degrade one whose file vanished, was replaced or shrank.
        Returns the indices degraded by this check. (submit() calls it every HEALTH_INTERVAL_S.)"""
        self._last_health = time.monotonic()
        lost = []
        for i, p in enumerate(self.paths):
            if self._degraded[i]:
                continue
            dev, ino, size = self._identity[i]
            try:
                st = os.stat(p)
                why = None
                if (st.st_dev, st.st_ino) != (dev, ino):
                    why = "file replaced by another inode"
                elif st.st_size < size:
                    why = f"file truncated to {st.st_size} of {size} bytes"
            except OSError as e:
                why = f"file gone ({e.strerror})"
            if why:
                self._event("vanished", i, f"{p}: {why}")
                self._degrade(i, why)
                lost.append(i)
        return lost

    # -- results ----------------------------------------------------------------------------

    def stats(self) -> ReaderStats:
        with self._lock:
            srcs = tuple(SourceStats(
                index=i, path=self.paths[i], weight=self.weights[i], decode_weight=self.decode_weights[i],
                bytes=self._bytes[i], reads=self._reads[i], lands_last=self._lands_last[i], gap_ns=self._gap_ns[i],
                lat_ns=latency_summary(self._lat[i]), degraded=self._degraded[i], events=self._src_events[i],
                failover_bytes=self._failover_bytes[i]) for i in range(len(self.paths)))
            return ReaderStats(sources=srcs, events=tuple(self._events), reads=self._reads_done,
                               bytes=self._bytes_done)

    def format_stats(self) -> str:
        return format_stats(self.stats())

    @property
    def degraded(self) -> tuple[bool, ...]:
        with self._lock:
            return tuple(self._degraded)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for q in self._queues:
            for _ in range(self.lanes):
                q.put(None)
        for t in self._threads:
            t.join()
        self._close_readers()

    def _close_readers(self) -> None:
        for r in self._readers:
            try:
                r.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
