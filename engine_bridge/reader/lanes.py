"""The split reader's lanes: persistent threads per source that read pieces into a read's buffer.

Each source has a queue and `lanes` threads serving it (`os.preadv` releases the GIL, so lanes
overlap on 2 cores). A piece's aligned interior is read straight into the read's page-aligned
buffer; its unaligned edges through one covering page of the lane's scratch, so neighbouring
pieces never touch each other's bytes and O_DIRECT works on any range. A piece that fails or
comes back short is re-read from the source `SourceHealth` names; a read completes at its
barrier, when its last piece lands, and the lanes count who landed last and by how much.
"""

from __future__ import annotations

import queue
import threading
import time
from array import array
from dataclasses import dataclass
from typing import Sequence

from core.errors import MissingError, UsageError
from replicas.coldio import ColdReader, align_down, align_up, aligned_buffer

from .readstats import last_landing, latency_summary
from .sources import ShortRead, SourceHealth


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


@dataclass(frozen=True)
class LaneCounters:
    """What the lanes delivered, per source (primary first) and in all."""

    bytes: tuple[int, ...]           # exact piece bytes delivered
    reads: tuple[int, ...]           # pieces delivered
    failover_bytes: tuple[int, ...]  # bytes re-read for another, failed source
    lands_last: tuple[int, ...]      # reads whose last-landing piece was this source's
    gap_ns: tuple[int, ...]          # summed lag of those last pieces behind the second-to-last, ns
    lat_ns: tuple[dict, ...]         # piece service time percentiles, ns
    reads_done: int                  # whole reads (barriers) completed
    bytes_done: int                  # bytes returned to callers


def read_piece(reader: ColdReader, ticket: ReadTicket, off: int, ln: int, scratch) -> None:
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
            raise ShortRead()
        buf[off - base:end - base] = scratch[off - start:end - start]
        return
    if off < lo:
        if reader.read_into(scratch[:a], lo - a) < a:
            raise ShortRead()
        buf[off - base:lo - base] = scratch[off - (lo - a):a]
    if reader.read_into(buf[lo - base:hi - base], lo) < hi - lo:
        raise ShortRead()
    if hi < end:
        if reader.read_into(scratch[:a], hi) < end - hi:
            raise ShortRead()
        buf[hi - base:end - base] = scratch[:end - hi]


class Lanes:
    """`lanes` threads per source serving pieces put on its queue; counters of what they did."""

    def __init__(self, readers: Sequence[ColdReader], health: SourceHealth, lanes: int):
        n = len(readers)
        self.readers, self.health, self.lanes = tuple(readers), health, lanes
        self._lock = threading.Lock()
        self._bytes = [0] * n
        self._reads = [0] * n
        self._failover_bytes = [0] * n
        self._lands_last = [0] * n
        self._gap_ns = [0] * n
        self._lat = [array("q") for _ in range(n)]
        self._reads_done = 0
        self._bytes_done = 0
        self._queues = [queue.SimpleQueue() for _ in range(n)]
        self._threads = []
        for s in range(n):
            for k in range(lanes):
                t = threading.Thread(target=self._lane, args=(s,), name=f"split-reader-s{s}-l{k}", daemon=True)
                t.start()
                self._threads.append(t)

    def put(self, src: int, ticket: ReadTicket, off: int, ln: int) -> None:
        """Queue piece [off, off+ln) of `ticket` on source `src`."""
        self._queues[src].put((ticket, off, ln))

    def counters(self) -> LaneCounters:
        with self._lock:
            lat = [array("q", a) for a in self._lat]
            snap = (tuple(self._bytes), tuple(self._reads), tuple(self._failover_bytes), tuple(self._lands_last),
                    tuple(self._gap_ns), self._reads_done, self._bytes_done)
        b, r, fb, ll, gap, rd, bd = snap
        return LaneCounters(b, r, fb, ll, gap, tuple(latency_summary(a) for a in lat), rd, bd)

    def close(self) -> None:
        """Stop every lane after the pieces already queued, and wait for them."""
        for q in self._queues:
            for _ in range(self.lanes):
                q.put(None)
        for t in self._threads:
            t.join()

    def _lane(self, src: int) -> None:
        q = self._queues[src]
        scratch = memoryview(aligned_buffer(2 * self.readers[src].alignment))
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
        health = self.health
        tried: list[int] = []
        s = src
        while True:
            t0 = time.monotonic_ns()
            try:
                read_piece(self.readers[s], ticket, off, ln, scratch)
            except (OSError, ShortRead) as e:
                tried.append(s)
                health.piece_failed(s, off, ln, e)
                nxt = health.failover_source(tried)
                if nxt is None:
                    err = MissingError(f"split reader: no source could read ({off}, {ln}) of read "
                                       f"({ticket.offset}, {ticket.length}); tried "
                                       + ", ".join(health.paths[i] for i in tried) + "; check the drives")
                    health.event("all_failed", s, str(err), off, ln)
                    self._land(ticket, s, time.monotonic_ns(), error=err)
                    return
                health.event("failover", nxt, f"piece ({off}, {ln}) of source {s} re-read from source {nxt}", off, ln)
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
