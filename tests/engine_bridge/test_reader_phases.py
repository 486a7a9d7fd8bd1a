"""The split reader counts per phase what the split gave each source and what each delivered."""

import pytest

from engine_bridge.reader.split_reader import SplitReader
from engine_bridge.reader.settings import ReaderSettings
from engines.ds4_argodrive.constants import BLOCK_BYTES
from engines.split import split_read
from tests.engine_bridge.helpers import primary_and_copies
from tests.helpers import FailingReader

COMPONENT = 557_056                # 2 blocks + 32 KiB: at 2:1:1 the third source's piece is 0 blocks
SIZE = 8 * COMPONENT


@pytest.fixture
def model(tmp_path):
    return primary_and_copies(tmp_path, SIZE, seed=5)


def test_per_phase_counters_follow_the_split_exactly(model):
    paths, data = model
    prefill = [(i * COMPONENT, 2 * COMPONENT) for i in range(3)]          # 4.25 blocks each: every source a piece
    decode = [(i * COMPONENT, COMPONENT) for i in range(5)]
    with SplitReader(paths, [2, 1, 1], [2, 1, 1], settings=ReaderSettings(lanes=2)) as r:
        for (o, n), v in zip(prefill, r.read_many(prefill, "prefill")):
            assert bytes(v) == data[o:o + n]
        for (o, n), v in zip(decode, r.read_many(decode, "decode")):
            assert bytes(v) == data[o:o + n]
        s = r.stats()
    d = s.to_dict()
    assert list(d["phases"]) == ["prefill", "decode"]
    assert set(d["phases"]["decode"]) == {"reads", "bytes", "largest_read", "sources"}
    assert set(d["phases"]["decode"]["sources"][0]) == {"index", "bytes", "reads", "given_bytes", "given_pieces"}
    pre, dec = s.phases
    assert (pre.phase, pre.reads, pre.bytes, pre.largest_read) == ("prefill", 3, 6 * COMPONENT, 2 * COMPONENT)
    assert (dec.phase, dec.reads, dec.bytes, dec.largest_read) == ("decode", 5, 5 * COMPONENT, COMPONENT)
    piece = [p.length for p in split_read(0, COMPONENT, [2, 1, 1])]
    assert piece == [COMPONENT - BLOCK_BYTES, BLOCK_BYTES, 0]
    assert [(x.bytes, x.reads, x.given_bytes, x.given_pieces) for x in dec.sources] == [
        (5 * piece[0], 5, 5 * piece[0], 5), (5 * piece[1], 5, 5 * piece[1], 5), (0, 0, 0, 0)]
    big = [p.length for p in split_read(0, 2 * COMPONENT, [2, 1, 1])]
    assert all(b > 0 for b in big)
    assert [(x.bytes, x.reads) for x in pre.sources] == [(3 * b, 3) for b in big]
    # the phases add up to the reader's totals
    for i, src in enumerate(s.sources):
        assert src.bytes == pre.sources[i].bytes + dec.sources[i].bytes
        assert src.reads == pre.sources[i].reads + dec.sources[i].reads


def test_a_phase_without_reads_counts_zeros(model):
    paths, _ = model
    with SplitReader(paths, [1, 1, 1], settings=ReaderSettings(lanes=1)) as r:
        r.read(0, COMPONENT, "prefill")
        d = r.stats().to_dict()["phases"]
    assert d["decode"] == {"reads": 0, "bytes": 0, "largest_read": 0,
                           "sources": [{"index": i, "bytes": 0, "reads": 0, "given_bytes": 0, "given_pieces": 0}
                                       for i in range(3)]}
    assert d["prefill"]["reads"] == 1 and sum(s["bytes"] for s in d["prefill"]["sources"]) == COMPONENT


def test_given_pieces_another_source_read_are_counted_where_they_were_given(model):
    paths, data = model
    FailingReader.broken = {paths[1]: 0}          # source 1 fails every read: its pieces fail over
    reads = [(i * COMPONENT, COMPONENT) for i in range(4)]
    with SplitReader(paths, [2, 1, 1], [2, 1, 1], opener=FailingReader, settings=ReaderSettings(lanes=1)) as r:
        for (o, n), v in zip(reads, r.read_many(reads[:1], "decode") + r.read_many(reads[1:], "decode")):
            assert bytes(v) == data[o:o + n]
        dec = r.stats().phases[1]
    FailingReader.broken = {}
    one = dec.sources[1]
    # its first piece was given (then re-read elsewhere); after it degraded the split left it out
    assert one.bytes == 0 and one.reads == 0 and one.given_pieces >= 1 and one.given_bytes == one.given_pieces * BLOCK_BYTES
    assert sum(x.bytes for x in dec.sources) == dec.bytes == 4 * COMPONENT
