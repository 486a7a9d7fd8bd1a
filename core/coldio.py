"""Cold reads: bytes from the drive, not the page cache (docs/replicas.md).

A `ColdReader` is the narrow seam every reader in the project goes through: `read_into(buffer,
offset)` plus a few facts (`direct`, `alignment`, `how`, `size`); `CachedReader` is the same seam
over plain buffered reads. Buffers come from `aligned_buffer` (private anonymous memory,
page-aligned, as O_DIRECT wants; large ones in huge pages, so a read's device requests do not
vary). Offsets and lengths handed to `read_into` must be multiples of `alignment`; `read_range`
serves any range through the covering aligned one. Every reader passes the same contract tests
(tests/core/test_coldio_contract.py).
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import deque
from typing import Callable, Iterator

from . import platform
from .tiers import is_memory
from .constants import ALIGNMENT, HUGE_BUFFER_MIN, HUGE_PAGE, IO_BLOCK, MAPPED_BLOCK, READ_AHEAD

_PRIVATE_ANON = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0))


def align_down(n: int, a: int = ALIGNMENT) -> int:
    return n - n % a


def align_up(n: int, a: int = ALIGNMENT) -> int:
    return -(-n // a) * a


def aligned_buffer(nbytes: int, fault: bool = True) -> memoryview:
    """A page-aligned, zero-filled buffer of at least nbytes (rounded up to ALIGNMENT) of private
    anonymous memory: a memoryview of an mmap, freed when the last view of it goes.

    A buffer of HUGE_BUFFER_MIN bytes or more starts on a HUGE_PAGE boundary and asks the OS for
    transparent huge pages (Linux madvise), faulted in at once, so its memory is physically
    contiguous. That makes the device requests a read becomes the same every time: the block
    layer merges contiguous pages into large segments and cuts a read only at the queue's
    max_sectors_kb, while over scattered 4 KiB pages it cuts at max_segments pages; and 4 KiB
    pages lie together only by chance, so a loop device cut a 9.5 MiB read into 8 requests into
    one buffer and 19 into the next (`iobench.iounit`). Where the OS gives no huge pages (macOS,
    THP set to never, memory too fragmented) the buffer is plain pages; `huge_backed` tells.

    `fault=False` leaves the faulting to whoever writes the buffer first (a read into it: the
    kernel faults the huge pages in as it pins them), so a thread that only hands buffers out
    does not pay for them (the split reader's pool, docs/reader.md "How a read goes").
    """
    size = max(ALIGNMENT, align_up(nbytes))
    if not _asks_huge(size):
        return memoryview(mmap.mmap(-1, size, flags=_PRIVATE_ANON))
    span = align_up(size, HUGE_PAGE)
    m = mmap.mmap(-1, span + HUGE_PAGE, flags=_PRIVATE_ANON)
    start = -platform.buffer_address(m) % HUGE_PAGE
    try:
        m.madvise(mmap.MADV_HUGEPAGE, start, span)
    except OSError:            # THP not built in: plain pages
        pass
    view = memoryview(m)[start:start + size]
    if fault:
        view[::ALIGNMENT] = bytes(len(range(0, size, ALIGNMENT)))     # fault every page in now, not in the first read
    return view


def buffer_footprint(nbytes: int) -> int:
    """Bytes of memory an `aligned_buffer(nbytes)` holds once faulted in: its length, rounded up
    to whole huge pages when it asks for them (a 300 KiB buffer holds one 2 MiB page)."""
    size = max(ALIGNMENT, align_up(nbytes))
    return align_up(size, HUGE_PAGE) if _asks_huge(size) else size


def _asks_huge(size: int) -> bool:
    """A buffer of `size` bytes asks for huge pages (where the OS has a way to ask)."""
    return size >= HUGE_BUFFER_MIN and hasattr(mmap, "MADV_HUGEPAGE")


def huge_backed(buffer) -> bool | None:
    """For a buffer from `aligned_buffer`: True when it lies in huge pages (a read into it is cut
    only at max_sectors_kb), False when not, None when the OS cannot say (no /proc/self/smaps).
    The OS counts huge pages per mapping, and the kernel may merge neighbouring buffers' mappings
    into one: then this answers for them together."""
    view = memoryview(buffer)
    huge = platform.anon_huge_bytes(platform.buffer_address(view))
    return None if huge is None else huge >= align_up(view.nbytes, HUGE_PAGE)


def drop_pages(buffer) -> bool:
    """Give the memory behind a buffer from `aligned_buffer` back to the OS now, keeping the buffer
    usable: what it held is gone, and its pages are faulted in afresh when it is next written
    (madvise MADV_DONTNEED). Pages a read still in flight has pinned (O_DIRECT) stay the kernel's
    until that read returns, then go too: a buffer that only a late read still writes into holds
    that read's pages, not all of its own. True if the OS took the advice; False for other memory
    (a bytearray, a caller's buffer) or where it has no such advice."""
    view = memoryview(buffer)
    owner = view.obj
    if not isinstance(owner, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or view.nbytes == 0:
        return False
    start = platform.buffer_address(view) - platform.buffer_address(owner)
    try:
        owner.madvise(mmap.MADV_DONTNEED, start, view.nbytes)
    except (OSError, ValueError):
        return False
    return True


class ColdReader:
    """One read-only file opened for cold reads.

    how: 'o_direct' (Linux), 'f_nocache' (macOS) or 'fadvise' (file system without O_DIRECT:
    clean cached pages of each range are dropped before it is read). `size` is the file's size
    in bytes when it was opened. Opening raises OSError (FileNotFoundError, PermissionError).
    """

    alignment = ALIGNMENT

    def __init__(self, path: str):
        self.path = path
        self.fd, self.how = self._open(path)
        self.size = os.fstat(self.fd).st_size
        self._in_memory: bool | None = None

    def _open(self, path: str) -> tuple[int, str]:
        return platform.open_direct(path)

    @property
    def direct(self) -> bool:
        """True when reads bypass the page cache (O_DIRECT, F_NOCACHE)."""
        return self.how in ("o_direct", "f_nocache")

    @property
    def in_memory(self) -> bool:
        """True when the file lies in RAM (tmpfs, ramfs: there is no drive, so nothing is cold;
        newer kernels' tmpfs takes O_DIRECT, which is then only a copy) and this reader reads it
        plainly: `read_sequential` then serves views of a read-only map of the file instead of
        copying it into buffers (what reads fastest there; b3sum does the same). A reader that
        serves its own `read_into` (a test double) is never mapped."""
        if self._in_memory is None:
            self._in_memory = type(self).read_into is ColdReader.read_into and is_memory(self.path)
        return self._in_memory

    def read_into(self, buffer, offset: int) -> int:
        """Fill `buffer` (aligned, length a multiple of alignment) from `offset`; returns bytes
        read, fewer only at end of file (0 at or past it). Raises OSError on an I/O error or
        once the reader is closed."""
        view = memoryview(buffer)
        want = len(view)
        if self.how == "fadvise":
            platform.drop_cached(self.fd, offset, want)
        done = 0
        while done < want:
            n = os.preadv(self.fd, [view[done:]], offset + done)
            if n == 0:
                break
            done += n
            if self.how == "o_direct" and done % self.alignment:
                break  # a short direct read ends at end of file
        return done

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CachedReader(ColdReader):
    """The `ColdReader` seam without the cold part: plain buffered reads that may be served by
    the page cache (how = 'cached'). For measuring a reader's own ceiling on tmpfs or cached
    files; never for drive measurements."""

    def _open(self, path: str) -> tuple[int, str]:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), "cached"


def open_cold(path: str) -> ColdReader:
    return ColdReader(path)


def read_range(reader: ColdReader, offset: int, length: int, buffer=None) -> memoryview:
    """Read any byte range, aligned or not, through the covering aligned range.

    Returns a view of exactly the bytes available in [offset, offset+length) (short only at end
    of file). `buffer`, if given, must hold align_up(offset+length) - align_down(offset) bytes.
    """
    a = reader.alignment
    start = align_down(offset, a)
    span = align_up(offset + length, a) - start
    buf = buffer if buffer is not None else aligned_buffer(span)
    n = reader.read_into(memoryview(buf)[:span], start)
    lo = offset - start
    hi = min(lo + length, n)
    return memoryview(buf)[lo:max(lo, hi)]


def _mapped_blocks(reader: ColdReader, start: int, end: int, block: int, cancel: threading.Event | None,
                   pace: Callable[[int], None] | None) -> Iterator[tuple[int, memoryview]]:
    """`read_sequential` for a file in RAM: views of a read-only shared map, `block` bytes each
    (short only at the end of the file, as reads are)."""
    end = min(end, os.fstat(reader.fd).st_size)
    if start >= end:
        return
    m = mmap.mmap(reader.fd, end, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    try:
        if hasattr(m, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            m.madvise(mmap.MADV_SEQUENTIAL)
        view = memoryview(m)
        for off in range(start, end, block):
            if cancel is not None and cancel.is_set():
                return
            n = min(block, end - off)
            if pace is not None:
                pace(n)
            part = view[off:off + n]
            yield off, part
            part.release()
        view.release()
    finally:
        try:
            m.close()
        except BufferError:       # a caller kept a view: the map goes with the last one
            pass


def read_sequential(reader: ColdReader, start: int = 0, end: int | None = None, block: int | None = None,
                    depth: int = READ_AHEAD, cancel: threading.Event | None = None,
                    pace: Callable[[int], None] | None = None) -> Iterator[tuple[int, memoryview]]:
    """Yield (offset, bytes) for [start, end) in order, keeping `depth` aligned reads in flight.

    One sequential reader per drive with a little read-ahead: O_DIRECT has no kernel read-ahead,
    so a lone synchronous reader would leave the drive idle while the caller hashes. The view
    yielded is valid until the next iteration. Raises OSError from the read that failed; a read
    that comes back short before `end` ends the iteration early (the caller sees fewer bytes).
    `pace(nbytes)`, if given, is called before each read is issued and returns when it may go
    (--max-rate). A file in RAM (`reader.in_memory`) is served as views of a map of it, block by
    block, paced and cancellable the same way: no copy, no threads. `block` defaults to IO_BLOCK
    from a drive and MAPPED_BLOCK from RAM.
    """
    end = reader.size if end is None else end
    if block is None:
        block = MAPPED_BLOCK if reader.in_memory else IO_BLOCK
    if start % reader.alignment or block % reader.alignment:
        raise ValueError("start and block must be aligned")
    if start >= end:
        return
    if reader.in_memory:
        yield from _mapped_blocks(reader, start, end, block, cancel, pace)
        return
    from concurrent.futures import ThreadPoolExecutor    # here: a file in RAM needs no threads, and the import costs

    bufs = [aligned_buffer(block) for _ in range(depth + 1)]
    pending: deque = deque()
    next_off = start
    free = list(range(depth + 1))
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="coldread") as pool:
        def submit():
            nonlocal next_off
            slot = free.pop()
            want = min(block, align_up(end - next_off, reader.alignment))
            if pace is not None:
                pace(min(block, end - next_off))
            pending.append((next_off, slot, pool.submit(reader.read_into, memoryview(bufs[slot])[:want], next_off)))
            next_off += block
        try:
            while len(pending) < depth and next_off < end:
                submit()
            while pending:
                if cancel is not None and cancel.is_set():
                    return
                off, slot, fut = pending.popleft()
                n = fut.result()
                length = min(n, end - off)
                yield off, memoryview(bufs[slot])[:length]
                free.append(slot)
                if length < min(block, end - off):
                    return
                if next_off < end:
                    submit()
        finally:
            for _, _, fut in pending:
                fut.cancel()
            for _, _, fut in pending:
                if not fut.cancelled():
                    try:
                        fut.result()
                    except Exception:
                        pass
