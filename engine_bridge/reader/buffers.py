"""Read buffers of the split reader: how big a read's buffer must be, a caller's buffer checked,
and a pool of released buffers (a fresh buffer's page faults cost more than a tmpfs read on a
small VM, so buffers are reused)."""

from __future__ import annotations

import threading

import numpy as np

from core.errors import UsageError
from core import platform
from core.coldio import align_down, align_up, aligned_buffer, buffer_footprint
from core.constants import ALIGNMENT

POOL_BYTES = 512 << 20         # released read buffers kept for reuse, bytes, at most
POOL_RAM_SHARE = 8             # ... and at most this share (1/N) of the RAM the process may fill


def span(offset: int, length: int) -> int:
    """Bytes of the aligned buffer a read of (offset, length) needs: its covering aligned range."""
    return align_up(offset + length) - align_down(offset)


def copy_bytes(dst, dst_at: int, src, src_at: int, n: int) -> None:
    """dst[dst_at:dst_at+n] = src[src_at:src_at+n], without holding the GIL. A lane copies a read
    into a fresh buffer at its barrier when a late attempt may still write into the old one; a fresh
    buffer is faulted in by that copy (~0.7 GB/s on this VM, docs/reader.md "How a read goes"), and
    a memoryview copy held the GIL for all of it — 50–80 ms of a 26.7 MB prefill read in which no
    other thread of the process ran Python, the engine's own included (docs/reader.md "Round 12").
    numpy's copy of raw bytes lets them run."""
    if n > 0:
        np.frombuffer(dst, np.uint8, n, dst_at)[:] = np.frombuffer(src, np.uint8, n, src_at)


def check_buffer(buffer, offset: int, length: int):
    """A caller's buffer for read (offset, length): writable, contiguous, page-aligned, large enough."""
    mv = memoryview(buffer)
    if mv.readonly or not mv.c_contiguous:
        raise UsageError("split reader: buffer must be writable and contiguous (use core.coldio.aligned_buffer)")
    need = span(offset, length)
    if mv.nbytes < need:
        raise UsageError(f"split reader: buffer of {mv.nbytes} bytes is too small for read ({offset}, {length}); "
                         f"it needs {need} (span(offset, length))")
    if platform.buffer_address(mv) % ALIGNMENT:
        raise UsageError("split reader: buffer is not page-aligned (O_DIRECT needs it); use core.coldio.aligned_buffer")
    return buffer


def pool_limit(ram: int | None = None) -> int:
    """Bytes of released buffers a pool keeps: POOL_BYTES, but no more than 1/POOL_RAM_SHARE of
    the RAM this process may fill (`ram`; default the limit it runs under, `core.ram.ram_limit`:
    a memory cgroup's, else the machine's). Idle buffers count against a memory budget like any
    other memory: under `make demo`'s (821 MiB) a full pool of 512 MiB beside the reads in flight
    and the engine's own memory got the embedded engine killed by the OOM killer (docs/reader.md,
    "How a read goes")."""
    if ram is None:
        from core.ram import ram_limit

        ram = ram_limit().bytes
    return min(POOL_BYTES, ram // POOL_RAM_SHARE) if ram > 0 else POOL_BYTES


class BufferPool:
    """Released read buffers kept by size class for reuse, up to `limit` bytes of memory in all
    (a buffer in huge pages counts whole pages: `buffer_footprint`; default `pool_limit()`).

    A released buffer that does not fit makes room by dropping idle buffers of the size classes
    asked for least recently, all of them asked for before its own (`_make_room`): a prefill's
    few large reads filled most of a small pool (two 26 MiB buffers of a 69 MiB pool under a RAM
    budget), and the decode's buffers that no longer fit were all fresh ones, each a 2 MiB huge
    page the kernel zeroed as the read pinned it — 300–460 a run, up to 41 % of the run's CPU
    samples in `clear_page_erms` (docs/reader.md "Round 22")."""

    GRAIN = 1 << 20

    def __init__(self, limit: int | None = None):
        self.limit = pool_limit() if limit is None else limit
        self.free: dict[int, list] = {}
        self.held = 0
        self.asked: dict[int, int] = {}     # size class -> `gets` when it was last asked for
        self.gets = 0
        self.lock = threading.Lock()

    @classmethod
    def size_class(cls, nbytes: int) -> int:
        if nbytes >= cls.GRAIN:
            return align_up(nbytes, cls.GRAIN)
        return max(ALIGNMENT, 1 << (nbytes - 1).bit_length())

    def get(self, nbytes: int):
        size = self.size_class(nbytes)
        with self.lock:
            self.gets += 1
            self.asked[size] = self.gets
            bucket = self.free.get(size)
            if bucket:
                self.held -= buffer_footprint(size)
                return bucket.pop()
        # not faulted in here: the engine's thread (a submit) or the watchdog (a hedge, the lock
        # held) asks for it, and the lanes' reads fault its pages in where they land, in parallel
        # with the engine's compute (docs/reader.md "How a read goes")
        return aligned_buffer(size, fault=False)

    def put(self, buf) -> None:
        size = len(buf)
        need = buffer_footprint(size)
        dropped: list = []
        with self.lock:
            if self.held + need > self.limit:
                dropped = self._make_room(size, need)
            if self.held + need <= self.limit:
                self.free.setdefault(size, []).append(buf)
                self.held += need
        dropped.clear()                 # their memory unmapped here, outside the lock

    def _make_room(self, size: int, need: int) -> list:
        """Take out idle buffers of the classes asked for before class `size` was, the least recently
        asked first, until `need` more bytes fit (the lock held), and return them; none when taking
        all of them would not make room (the released buffer is dropped instead, as before)."""
        mine = self.asked.get(size, 0)
        stale = sorted((self.asked.get(c, 0), c) for c, bucket in self.free.items() if bucket and c != size
                       and self.asked.get(c, 0) < mine)
        if self.held - sum(len(self.free[c]) * buffer_footprint(c) for _, c in stale) + need > self.limit:
            return []
        out = []
        for _, c in stale:
            bucket = self.free[c]
            while bucket and self.held + need > self.limit:
                out.append(bucket.pop())
                self.held -= buffer_footprint(c)
        return out
