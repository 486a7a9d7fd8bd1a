"""The split reader returns exactly the bytes a plain read returns, and its counters add up."""

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import MissingError, UsageError
from engine_bridge.reader.readstats import format_stats, healthy_split, last_landing, latency_summary, percentile
from engine_bridge.reader.split_reader import SplitReader
from engine_bridge.reader.settings import ReaderSettings
from engines.ds4_argodrive.constants import BLOCK_BYTES
from engines.split import split_read
from tests.engine_bridge.helpers import primary_and_copies
from tests.helpers import impure_imports

SIZE = 3 * BLOCK_BYTES + 12_345          # not a multiple of 4 KiB: the last page is partial


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return primary_and_copies(tmp_path_factory.mktemp("reader"), SIZE, seed=7)


def _ranges(rng, n):
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.3:   # aligned
            off = rng.randrange(0, SIZE // 4096) * 4096
            ln = rng.randrange(0, (SIZE - off) // 4096 + 1) * 4096
        elif kind < 0.5:  # GGUF-like: 32-byte aligned
            off = rng.randrange(0, SIZE // 32) * 32
            ln = rng.randrange(0, (SIZE - off) // 32 + 1) * 32
        else:
            off = rng.randrange(0, SIZE)
            ln = rng.randrange(0, SIZE - off + 1)
        out.append((off, ln))
    out += [(0, SIZE), (SIZE - 1, 1), (SIZE - 5000, 5000), (0, 0), (4095, 2)]
    return out


@pytest.mark.parametrize("cold", [True, False])
@pytest.mark.parametrize("nsrc", [1, 2, 3])
def test_split_reads_equal_plain_reads(model, nsrc, cold):
    paths, data = model
    rng = random.Random(nsrc * 10 + cold)
    weights = [rng.randint(1, 100) for _ in range(nsrc)]
    decode = [rng.randint(1, 100) for _ in range(nsrc)]
    ranges = _ranges(rng, 40)
    with SplitReader(paths[:nsrc], weights, decode, cold=cold, settings=ReaderSettings(lanes=3)) as r:
        for off, ln in ranges[:20]:
            assert bytes(r.read(off, ln)) == data[off:off + ln], (off, ln, weights)
        views = r.read_many(ranges[20:], phase="decode")
        for (off, ln), v in zip(ranges[20:], views):
            assert bytes(v) == data[off:off + ln], (off, ln, decode)
        s = r.stats()
    want = [0] * nsrc
    for i, (off, ln) in enumerate(ranges):
        for p in split_read(off, ln, decode if i >= 20 else weights):
            want[p.source] += p.length
    assert [x.bytes for x in s.sources] == want
    assert s.bytes == sum(ln for _, ln in ranges)
    assert s.reads == len(ranges) - sum(1 for _, ln in ranges if ln == 0)
    assert not any(x.degraded for x in s.sources) and not s.events


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_hypothesis_random_ranges_and_weights(model, data):
    paths, content = model
    n = data.draw(st.integers(1, 3))
    weights = data.draw(st.lists(st.integers(1, 100), min_size=n, max_size=n))
    off = data.draw(st.integers(0, SIZE))
    ln = data.draw(st.integers(0, SIZE - off))
    with SplitReader(paths[:n], weights, cold=False, settings=ReaderSettings(lanes=1)) as r:
        assert bytes(r.read(off, ln)) == content[off:off + ln]
        assert [x.bytes for x in r.stats().sources] == [p.length for p in split_read(off, ln, weights)]


def test_counters_reads_and_lands_last_add_up(model):
    paths, data = model
    with SplitReader(paths, [2, 1, 1], settings=ReaderSettings(lanes=2)) as r:
        r.read_many([(0, 3 * BLOCK_BYTES)] * 6 + [(0, 1000)])
        s = r.stats()
    # 3 blocks over 2:1:1 -> one block each: three pieces per big read, one piece for the small one.
    assert [x.reads for x in s.sources] == [7, 6, 6]
    assert [x.bytes for x in s.sources] == [6 * BLOCK_BYTES + 1000, 6 * BLOCK_BYTES, 6 * BLOCK_BYTES]
    assert sum(x.lands_last for x in s.sources) == 6      # one per read with a race; none for the single piece
    assert all(x.gap_ns >= 0 for x in s.sources)
    assert all(x.lat_ns["p50"] > 0 and x.lat_ns["p50"] <= x.lat_ns["p99"] for x in s.sources)
    text = format_stats(s)
    assert text.splitlines()[1].startswith(f"source[1] bytes={6 * BLOCK_BYTES} reads=6 lands_last=")
    d = s.to_dict()
    assert set(d["sources"][0]) == {"index", "path", "weight", "decode_weight", "bytes", "reads", "lands_last",
                                    "gap_ns", "lat_ns", "degraded", "events", "failover_bytes", "hedged", "late",
                                    "slow", "stolen_bytes", "chunk_bytes"}


def test_submit_lets_caller_overlap(model):
    paths, data = model
    with SplitReader(paths, [1, 1, 1], settings=ReaderSettings(lanes=2)) as r:
        t1 = r.submit(0, BLOCK_BYTES * 2)
        t2 = r.submit(BLOCK_BYTES, BLOCK_BYTES + 7, "decode")
        assert bytes(t2.result()) == data[BLOCK_BYTES:2 * BLOCK_BYTES + 7]
        assert bytes(t1.result()) == data[:BLOCK_BYTES * 2]


def test_bad_inputs_are_refused(model, tmp_path):
    paths, data = model
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:-1])
    with pytest.raises(UsageError, match="short.gguf: size .* differs from the primary"):
        SplitReader([paths[0], str(short)], [1, 1])
    with pytest.raises(UsageError, match="same file as"):
        SplitReader([paths[0], paths[1], paths[1]], [1, 1, 1])
    link = tmp_path / "hard.gguf"
    os.link(paths[1], link)
    with pytest.raises(UsageError, match="same file as"):
        SplitReader([paths[0], paths[1], str(link)], [1, 1, 1])
    with pytest.raises(UsageError, match="weight of source 1 is 0"):
        SplitReader(paths[:2], [10, 0])
    with pytest.raises(UsageError, match="2 weights .* for 3 sources"):
        SplitReader(paths, [10, 5])
    with pytest.raises(UsageError, match="decode weights"):
        SplitReader(paths, [10, 5, 5], [10, 6])
    with pytest.raises(UsageError, match="at most 3 sources"):
        SplitReader(paths + [str(short)], [1, 1, 1, 1])
    with pytest.raises(MissingError, match="nope.gguf: no such file"):
        SplitReader([paths[0], str(tmp_path / "nope.gguf")], [1, 1])
    with pytest.raises(UsageError, match="not a regular file"):
        SplitReader([paths[0], str(tmp_path)], [1, 1])
    with SplitReader(paths[:1], [1], settings=ReaderSettings(lanes=1)) as r:
        with pytest.raises(UsageError, match="outside the file"):
            r.read(SIZE - 1, 2)
        with pytest.raises(UsageError, match="phase"):
            r.read(0, 1, phase="warmup")


def test_pure_helpers():
    assert percentile([], 50) == 0
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 99) == 4
    assert latency_summary([5]) == {"p50": 5, "p95": 5, "p99": 5}
    assert last_landing([(0, 10)]) is None
    assert last_landing([(0, 10), (1, 30), (2, 25)]) == (1, 5)
    # all healthy: exactly split_read; one degraded: its share goes to the others.
    assert healthy_split(0, 4 * BLOCK_BYTES, (2, 1, 1), [0, 1, 2]) == [
        (p.source, p.offset, p.length) for p in split_read(0, 4 * BLOCK_BYTES, (2, 1, 1)) if p.length]
    assert healthy_split(0, 4 * BLOCK_BYTES, (2, 1, 1), [0, 2]) == [(0, 0, 3 * BLOCK_BYTES), (2, 3 * BLOCK_BYTES, BLOCK_BYTES)]


def test_caller_buffer(model):
    from engine_bridge.reader.buffers import span
    from core.coldio import aligned_buffer
    paths, data = model
    with SplitReader(paths, [3, 2, 1], settings=ReaderSettings(lanes=2)) as r:
        buf = aligned_buffer(span(100, 2 * BLOCK_BYTES))
        v = r.read(100, 2 * BLOCK_BYTES, buffer=buf)
        assert bytes(v) == data[100:100 + 2 * BLOCK_BYTES]
        assert bytes(memoryview(buf)[100:110]) == data[100:110]
        with pytest.raises(UsageError, match="too small"):
            r.read(100, 2 * BLOCK_BYTES, buffer=aligned_buffer(2 * BLOCK_BYTES))
        with pytest.raises(UsageError, match="page-aligned"):
            r.read(0, 10, buffer=memoryview(aligned_buffer(8192))[1:])


def test_released_buffers_are_reused(model):
    paths, data = model
    with SplitReader(paths, [2, 1, 1], settings=ReaderSettings(lanes=2)) as r:
        t = r.submit(10, BLOCK_BYTES + 5)
        first = t._buf
        assert bytes(t.result()) == data[10:10 + BLOCK_BYTES + 5]
        t.release()
        with pytest.raises(UsageError, match="after release"):
            t.result()
        t2 = r.submit(4096 * 3 + 1, BLOCK_BYTES)          # same size class: gets the same buffer back
        assert t2._buf is first
        assert bytes(t2.result()) == data[4096 * 3 + 1:4096 * 3 + 1 + BLOCK_BYTES]
        t3 = r.submit(0, 100)                       # nothing released of that class: a new one
        assert t3._buf is not first and bytes(t3.result()) == data[:100]


def test_the_counters_arithmetic_is_pure():
    from engine_bridge.reader import lanes, readstats

    assert impure_imports(readstats) == []
    assert any(x.endswith(": threading") for x in impure_imports(lanes))   # the check sees the threads around it
