"""Read buffers of the split reader: how big a read's buffer must be, a caller's buffer checked,
and a pool of released buffers (a fresh buffer's page faults cost more than a tmpfs read on a
small VM, so buffers are reused)."""

from __future__ import annotations

import threading

from core.errors import UsageError
from core import platform
from core.coldio import align_down, align_up, aligned_buffer, buffer_footprint
from core.constants import ALIGNMENT

POOL_BYTES = 512 << 20         # released read buffers kept for reuse, bytes


def span(offset: int, length: int) -> int:
    """Bytes of the aligned buffer a read of (offset, length) needs: its covering aligned range."""
    return align_up(offset + length) - align_down(offset)


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


class BufferPool:
    """Released read buffers kept by size class for reuse, up to `limit` bytes of memory in all
    (a buffer in huge pages counts whole pages: `buffer_footprint`)."""

    GRAIN = 1 << 20

    def __init__(self, limit: int = POOL_BYTES):
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
                self.held -= buffer_footprint(size)
                return bucket.pop()
        # not faulted in here: the engine's thread (a submit) or the watchdog (a hedge, the lock
        # held) asks for it, and the lanes' reads fault its pages in where they land, in parallel
        # with the engine's compute (docs/reader.md "How a read goes")
        return aligned_buffer(size, fault=False)

    def put(self, buf) -> None:
        size = len(buf)
        with self.lock:
            if self.held + buffer_footprint(size) <= self.limit:
                self.free.setdefault(size, []).append(buf)
                self.held += buffer_footprint(size)
