"""The split reader's buffer pool counts the memory its buffers hold, huge pages whole."""

from engine_bridge.reader.buffers import BufferPool
from core.coldio import buffer_footprint

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
