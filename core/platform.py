"""The operating-system seam: direct I/O flags, cache control, page residency, xattr names.

Everything that differs between Linux and macOS lives here, so the rest of the project asks
one question ("open this for cold reads") and gets one answer. The decision logic is pure
functions of `sys.platform`-like names so it can be tested on any machine.
"""

from __future__ import annotations

import mmap
import os
import sys

from .constants import XATTR_DARWIN, XATTR_LINUX

F_NOCACHE = 48        # macOS fcntl: do not keep this fd's pages in the unified buffer cache
PLATFORM = sys.platform


def is_linux(platform: str = PLATFORM) -> bool:
    return platform.startswith("linux")


def is_darwin(platform: str = PLATFORM) -> bool:
    return platform == "darwin"


def stamp_xattr_name(platform: str = PLATFORM) -> str:
    """Linux needs the user. namespace; macOS has no namespaces and wants a reverse-DNS name."""
    return XATTR_DARWIN if is_darwin(platform) else XATTR_LINUX


def cold_open_strategy(platform: str = PLATFORM) -> str:
    """'o_direct' on Linux, 'f_nocache' on macOS, 'fadvise' elsewhere."""
    if is_linux(platform):
        return "o_direct"
    if is_darwin(platform):
        return "f_nocache"
    return "fadvise"


def open_direct(path: str) -> tuple[int, str]:
    """Open read-only for cold reads. Returns (fd, how): how is 'o_direct', 'f_nocache' or
    'fadvise' when the file system refuses O_DIRECT (tmpfs, some FUSE): then each read first
    asks the kernel to drop the range's clean pages."""
    strategy = cold_open_strategy()
    if strategy == "o_direct":
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC), "o_direct"
        except OSError as e:
            if e.errno != 22:  # EINVAL: this file system has no O_DIRECT
                raise
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC), "fadvise"
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    if strategy == "f_nocache":
        import fcntl

        fcntl.fcntl(fd, F_NOCACHE, 1)
    return fd, strategy


def open_for_direct_write(path: str, flags: int, mode: int = 0o644) -> tuple[int, bool]:
    """Open a destination for writes that bypass the page cache where the platform allows:
    O_DIRECT on Linux (offsets, lengths and buffers aligned), F_NOCACHE on macOS. Returns
    (fd, aligned_writes_required). Falls back to buffered writes where refused."""
    if is_linux():
        try:
            return os.open(path, flags | os.O_DIRECT, mode), True
        except OSError as e:
            if e.errno != 22:
                raise
        return os.open(path, flags, mode), False
    fd = os.open(path, flags, mode)
    if is_darwin():
        import fcntl

        fcntl.fcntl(fd, F_NOCACHE, 1)
    return fd, False


def drop_cached(fd: int, offset: int = 0, length: int = 0) -> None:
    """Ask the kernel to forget clean cached pages of a range (no-op where unsupported)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


_libc = None


def _mincore():
    global _libc
    if _libc is None:
        import ctypes.util      # here, not at the top: it costs `replicas hash` more than hashing a small file

        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc.mincore.restype = ctypes.c_int
    return _libc.mincore


def resident_fraction(path: str, offset: int = 0, length: int | None = None) -> float:
    """Fraction (0..1) of a file range's pages that sit in the page cache, by mincore(2).

    On macOS F_NOCACHE does not evict pages already cached, so a cold trial checks this first.
    Returns 0.0 for an empty range.
    """
    size = os.path.getsize(path)
    if length is None:
        length = size - offset
    length = max(0, min(length, size - offset))
    if length == 0:
        return 0.0
    page = mmap.PAGESIZE
    start = offset - offset % page
    span = offset + length - start
    fd = os.open(path, os.O_RDONLY)
    try:
        # A copy-on-write mapping of a read-only fd is writable from ctypes' point of view
        # (nothing is ever written) and mincore still reports the file's page-cache pages.
        m = mmap.mmap(fd, span, access=mmap.ACCESS_COPY, offset=start)
    finally:
        os.close(fd)
    import ctypes               # here, not at the top (as in _mincore)

    try:
        pages = -(-span // page)
        vec = (ctypes.c_ubyte * pages)()
        anchor = ctypes.c_char.from_buffer(m)
        try:
            rc = _mincore()(ctypes.addressof(anchor), ctypes.c_size_t(span), vec)
        finally:
            del anchor
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return sum(v & 1 for v in vec) / pages
    finally:
        m.close()


def buffer_address(buffer) -> int:
    """The memory address where a writable, contiguous buffer (mmap, bytearray, memoryview of
    any format) starts."""
    import ctypes               # here, not at the top (as in _mincore)

    anchor = ctypes.c_char.from_buffer(memoryview(buffer).cast("B"))
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def anon_huge_bytes(address: int, smaps: str = "/proc/self/smaps") -> int | None:
    """Bytes of transparent huge pages in this process's mapping that holds `address` (its
    AnonHugePages line in /proc/self/smaps); None where there is no smaps (macOS) or no such
    mapping."""
    try:
        with open(smaps) as f:
            text = f.read()
    except OSError:
        return None
    inside = False
    for line in text.splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            lo, _, hi = head.partition("-")
            try:
                inside = int(lo, 16) <= address < int(hi, 16)
            except ValueError:
                inside = False
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return None


def available_memory(meminfo: str = "/proc/meminfo") -> int:
    """Bytes of RAM the kernel says are available for new work, the page cache's room (Linux:
    MemAvailable; elsewhere the free pages sysconf reports; 0 when neither answers)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def maxrss_bytes(ru_maxrss: int, platform: str = PLATFORM) -> int:
    """A `resource` usage's `ru_maxrss` (the peak resident memory: what a process held of the RAM
    beside the page cache) in bytes: Linux counts it in KiB, macOS in bytes."""
    return max(0, int(ru_maxrss)) * (1 if is_darwin(platform) else 1024)
