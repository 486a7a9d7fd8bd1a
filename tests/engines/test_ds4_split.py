import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import UsageError
from engines.ds4_argodrive.blocks import block_counts, split_ds4
from engines.ds4_argodrive.constants import BLOCK_BYTES, COMPONENT_BYTES
from engines.split import parse_weights, split_read


@pytest.mark.parametrize("weights, blocks, nbytes", [
    ((10, 5, 5), (13, 6, 6), (3_489_792, 1_572_864, 1_572_864)),
    ((2, 1, 1), (13, 6, 6), (3_489_792, 1_572_864, 1_572_864)),
    ((10, 6, 6), (11, 7, 7), (2_965_504, 1_835_008, 1_835_008)),
    ((10, 7, 7), (11, 7, 7), (2_965_504, 1_835_008, 1_835_008)),
    ((10, 5), (17, 8), (4_538_368, 2_097_152)),
    ((10, 6), (16, 9), (4_276_224, 2_359_296)),
])
def test_worked_facts_of_design_section_5(weights, blocks, nbytes):
    pieces = split_read(0, COMPONENT_BYTES, weights)
    assert tuple(p.blocks for p in pieces) == blocks
    assert tuple(p.length for p in pieces) == nbytes


def test_short_read_goes_to_primary():
    pieces = split_ds4(1000, BLOCK_BYTES - 1, (1, 100, 100))
    assert [(p.offset, p.length) for p in pieces] == [(1000, BLOCK_BYTES - 1), (1000 + BLOCK_BYTES - 1, 0),
                                                      (1000 + BLOCK_BYTES - 1, 0)]


def test_ties_go_to_lower_index_and_winner_is_zeroed():
    # 2 blocks over 1:1:1 -> remainders 2,2,2: sources 0 and 1 win one each.
    assert block_counts(2, (1, 1, 1)) == (1, 1, 0)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 1 << 40), st.integers(0, 64 << 20), st.lists(st.integers(1, 100), min_size=1, max_size=3))
def test_split_properties(offset, length, weights):
    pieces = split_ds4(offset, length, weights)
    assert len(pieces) == len(weights)
    pos = offset
    for p in pieces:            # contiguous, in source order
        assert p.offset == pos
        pos += p.length
    assert pos == offset + length  # covers the range exactly
    blocks, tail = divmod(length, BLOCK_BYTES)
    assert pieces[0].length == pieces[0].blocks * BLOCK_BYTES + tail  # tail on the primary
    assert all(p.length == p.blocks * BLOCK_BYTES for p in pieces[1:])
    total = sum(weights)
    for p, w in zip(pieces, weights):   # floor share plus at most one extra block
        assert blocks * w // total <= p.blocks <= blocks * w // total + 1


@pytest.mark.parametrize("bad", ["0:5:5", "101:1", "10:5:5:5", "a:b", "10:-1", ""])
def test_bad_weights_are_usage_errors(bad):
    with pytest.raises(UsageError):
        parse_weights(bad)


def test_negative_length_refused():
    with pytest.raises(UsageError):
        split_read(0, -1, (1,))
