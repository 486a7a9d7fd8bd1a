"""The split reader's buffer pool counts the memory its buffers hold, huge pages whole."""

import os

import numpy as np
import pytest

from core import platform
from core.coldio import aligned_buffer, buffer_footprint
from core.constants import ALIGNMENT
from engine_bridge.reader.buffers import POOL_BYTES, BufferPool, copy_bytes, pool_limit

KiB, MiB = 1024, 1 << 20


def test_the_pool_keeps_buffers_up_to_its_limit_in_memory_held():
    each = buffer_footprint(300 * KiB)          # 2 MiB where buffers take huge pages, else 300 KiB
    pool = BufferPool(limit=2 * each)
    bufs = [pool.get(300 * KiB) for _ in range(3)]
    assert all(len(b) == 512 * KiB for b in bufs)           # the size class
    each = buffer_footprint(512 * KiB)
    for b in bufs:
        pool.put(b)
    assert pool.held == min(3, pool.limit // each) * each <= pool.limit
    kept = pool.held
    again = pool.get(400 * KiB)                             # same class: from the pool
    assert again is bufs[0] or again is bufs[1] or again is bufs[2]
    assert pool.held == kept - each


def test_a_released_buffer_that_does_not_fit_drops_idle_buffers_of_classes_asked_for_before_its_own():
    """A prefill's large buffers fill the pool; once the decode's reads come back the pool keeps
    theirs and drops the large idle ones (asked for before), rather than every decode read getting a
    fresh buffer whose pages the kernel zeroes (docs/reader.md "Round 22")."""
    big, small = 8 * MiB, 1 * MiB
    fb, fs = buffer_footprint(big), buffer_footprint(small)
    pool = BufferPool(limit=2 * fb + fs)
    prefill = [pool.get(big) for _ in range(2)]
    for b in prefill:
        pool.put(b)
    assert pool.held == 2 * fb
    decode = [pool.get(small) for _ in range(3)]     # the decode's reads, asked for after the prefill's
    for b in decode:
        pool.put(b)
    assert len(pool.free[small]) == 3 and pool.held <= pool.limit
    assert len(pool.free[big]) == 2 - -(-2 * fs // fb)    # as few large ones dropped as make room
    again = [pool.get(small) for _ in range(3)]
    assert {id(b) for b in again} == {id(b) for b in decode}    # reused, not fresh


def test_a_released_buffer_drops_nothing_asked_for_since_its_own_class_nor_what_would_not_make_room():
    big, small = 8 * MiB, 1 * MiB
    fb, fs = buffer_footprint(big), buffer_footprint(small)
    pool = BufferPool(limit=fb + fs)
    first = pool.get(small)
    large = pool.get(big)                # asked for after the small class: in use since
    pool.put(large)
    pool.put(first)
    pool.put(aligned_buffer(small))      # a second small one does not fit: it is dropped, the large one kept
    assert len(pool.free[big]) == 1 and len(pool.free[small]) == 1 and pool.held == fb + fs

    pool = BufferPool(limit=fb)
    large = pool.get(big)
    larger = pool.get(2 * big)           # asked for later, but larger than the whole pool
    pool.put(large)
    pool.put(larger)                     # dropping the large one would not make room for it: nothing dropped
    assert len(pool.free[big]) == 1 and 2 * big not in pool.free and pool.held == fb


def _rss(address: int) -> int | None:
    """Resident bytes of this process's mapping holding `address` (its smaps Rss), None without smaps."""
    if not os.path.exists("/proc/self/smaps"):
        return None
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, _, hi = head.partition("-")
                inside = int(lo, 16) <= address < int(hi, 16)
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    return None


def test_the_pool_hands_out_fresh_buffers_unfaulted_for_the_reads_to_fault_in():
    """A fresh buffer from the pool costs whoever asks for it no page faults (the engine's thread at
    a submit): its pages come in as the read writes them; zero-filled and aligned all the same."""
    size = 8 * MiB
    fresh, faulted = BufferPool().get(size), aligned_buffer(size)
    if _rss(platform.buffer_address(fresh)) is None:
        pytest.skip("no /proc/self/smaps here")
    assert platform.buffer_address(fresh) % ALIGNMENT == 0 and len(fresh) == size
    assert _rss(platform.buffer_address(fresh)) == 0
    assert _rss(platform.buffer_address(faulted)) >= size          # what the pool did before: faulted at once
    assert bytes(fresh[::ALIGNMENT]) == bytes(size // ALIGNMENT)    # zero-filled
    fresh[::ALIGNMENT] = b"\1" * (size // ALIGNMENT)                # written, as a read lands
    assert _rss(platform.buffer_address(fresh)) >= size


def test_the_pool_keeps_no_more_than_an_eighth_of_the_ram_the_process_may_fill():
    """Idle buffers count against a memory budget like any other memory: under 821 MiB (make
    demo's) the pool keeps an eighth of it, on a machine of 64 GiB its 512 MiB."""
    assert pool_limit(821 * MiB) == 821 * MiB // 8
    assert pool_limit(64 << 30) == POOL_BYTES == 512 * MiB
    assert pool_limit(0) == POOL_BYTES                                # the RAM unknown: the default
    assert BufferPool().limit == pool_limit()                          # the limit this process runs under
    assert BufferPool(limit=3 * MiB).limit == 3 * MiB


@pytest.mark.parametrize("make_dst", [lambda n: aligned_buffer(n, fault=False), bytearray,
                                      lambda n: np.zeros(n // 4, np.float32)], ids=["pool", "bytearray", "float32"])
def test_copy_bytes_copies_exactly_the_range_into_any_writable_buffer(make_dst):
    """A read's bytes laid into a fresh buffer at its barrier (the pool's, or a caller's of any
    element type): exactly [dst_at, dst_at + n) changes, to src[src_at, src_at + n)."""
    n = 3 * ALIGNMENT
    src = bytes(range(256)) * (n // 256)
    dst = make_dst(n)
    copy_bytes(dst, 100, src, 7, 1000)
    got = bytes(memoryview(dst).cast("B"))
    assert got[100:1100] == src[7:1007] and got[:100] == bytes(100) and got[1100:] == bytes(n - 1100)
    copy_bytes(dst, 0, src, 0, 0)                          # nothing to copy: nothing changes
    assert bytes(memoryview(dst).cast("B")) == got
