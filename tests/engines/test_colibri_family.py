"""colibri's family of engines (engines.colibri Member, FAMILY): each member's mirror rules,
against worked examples computed by hand or by compiling the engine's own C function.

"Compiled" below means: the function was copied verbatim from the engine's source into a small
harness in a scratch directory outside this repository (gcc -O1), run, and its output pasted
here. The harnesses printed, for a layers x experts grid walked layer by layer, each drive's
count and sig = sig*31 + drive (mod 2**64), exactly as test_colibri.py's
test_placement_matches_the_compiled_source does for the GLM engine."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines import colibri as c

MIB = 1 << 20

# ---------------------------------------------------------------------------------------------
# The weighted stripe legs (mir_stripe_plan)


def legs(pieces):
    return [(p.source, p.offset, p.length) for p in pieces]


@pytest.mark.parametrize("weights, routed, holders, length, expected", [
    # Compiled: mir_stripe_plan with g_mir_cut set from the weights' cuts, the legs listed as
    # mir_pread_striped issues them (owner srep[(rep+i)%nsf], offset, size).
    # 51:45:4 -> cuts 131/246/256, shares 131/115/10 of 256; 19 MiB = 256 * 77,824:
    # 77,824*131 = 10,194,944 and 77,824*115 = 8,949,760 (both already 4 KiB multiples).
    ((51, 45, 4), 0, (0, 1, 2), 19 * MIB, [(0, 0, 10_194_944), (1, 10_194_944, 8_949_760), (2, 19_144_704, 778_240)]),
    ((51, 45, 4), 1, (0, 1, 2), 19 * MIB, [(1, 0, 8_949_760), (2, 8_949_760, 778_240), (0, 9_728_000, 10_194_944)]),
    ((51, 45, 4), 2, (0, 1, 2), 19 * MIB, [(2, 0, 778_240), (0, 778_240, 10_194_944), (1, 10_973_184, 8_949_760)]),
    # 10:5:5 -> 128/192/256: shares 64 and 64 of 256 -> 4,980,736 each, the primary the rest.
    ((10, 5, 5), 1, (0, 1, 2), 19 * MIB, [(1, 0, 4_980_736), (2, 4_980_736, 4_980_736), (0, 9_961_472, 9_961_472)]),
    ((1, 1), 0, (0, 1), 19 * MIB, [(0, 0, 9_961_472), (1, 9_961_472, 9_961_472)]),
    # 1:1:254 -> cuts 1/2/256, shares 1/1/254: 4 MiB * 1/256 = 16,384 each.
    ((1, 1, 254), 0, (0, 1, 2), 4 * MIB, [(0, 0, 16_384), (1, 16_384, 16_384), (2, 32_768, 4_161_536)]),
    # A partial mirror: drive 1 lacks the shard. 9:3:3 -> 154/205/256, holders 0 and 2 with
    # shares 154 and 51 of 205; routed 2 is a list index (k = (2+i) % 2): holder 0 first.
    # 19,922,944 * 154 // 205 = 14,966,504 -> up to 4 KiB: 14,966,784.
    ((9, 3, 3), 2, (0, 2), 19 * MIB, [(0, 0, 14_966_784), (2, 14_966_784, 4_956_160)]),
    # 4 MiB + 4 KiB on two equal drives: the first leg rounds up (2,099,200 -> 2,101,248).
    ((1, 1), 0, (0, 1), 4 * MIB + 4096, [(0, 0, 2_101_248), (1, 2_101_248, 2_097_152)]),
])
def test_weighted_legs_match_the_compiled_plan(weights, routed, holders, length, expected):
    assert legs(c.stripe_read(0, length, routed, holders, weights, legs="weighted")) == expected
    base = 1 << 30
    assert legs(c.stripe_read(base, length, routed, holders, weights, legs="weighted")) == [
        (s, base + o, n) for s, o, n in expected]


def test_weighted_legs_keep_the_source_contract():
    # tests/test_mirror_stripe_split.c (colibri's own test of mir_stripe_plan): a 4 % leg gets
    # under half an equal third, a 51 % leg over 1.3 equal thirds; equal weights split evenly.
    n = 19 * MIB
    sizes = [p.length for p in c.stripe_read(0, n, 0, (0, 1, 2), (51, 45, 4), legs="weighted")]
    assert sizes[2] < n // 3 // 2 and sizes[0] > n // 3 * 13 // 10
    a, b = (p.length for p in c.stripe_read(0, n, 0, (0, 1), (50, 50), legs="weighted"))
    assert abs(a - b) <= 8192


def test_weighted_legs_leave_what_colibri_does_not_stripe_whole():
    # Under 4 MiB, or one holder: one read on the routed drive, as with equal legs.
    assert legs(c.stripe_read(0, 4 * MIB - 4096, 1, (0, 1), (1, 1), legs="weighted")) == [(1, 0, 4 * MIB - 4096)]
    assert legs(c.stripe_read(0, 8 * MIB, 1, (1,), (1, 1), legs="weighted")) == [(1, 0, 8 * MIB)]


def test_weighted_legs_need_the_weights_of_every_holder():
    with pytest.raises(ValueError):
        c.stripe_read(0, 8 * MIB, 0, (0, 1), legs="weighted")
    with pytest.raises(ValueError):
        c.stripe_read(0, 8 * MIB, 0, (0, 1, 2), (1, 1), legs="weighted")
    with pytest.raises(ValueError):
        c.stripe_read(0, 8 * MIB, 0, (0, 1), (1, 1), legs="proportional")


def test_equal_legs_stay_the_default():
    assert c.stripe_read(0, 19 * MIB, 1, (0, 1, 2)) == c.stripe_read(0, 19 * MIB, 1, (0, 1, 2), (51, 45, 4))


@settings(max_examples=300, deadline=None)
@given(weights=st.lists(st.integers(1, 100), min_size=2, max_size=5),
       length=st.integers(1, 64 * MIB).map(lambda x: (x + 4095) & ~4095), data=st.data())
def test_weighted_legs_cover_the_window_exactly(weights, length, data):
    n = len(weights)
    holders = tuple(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))))
    routed = data.draw(st.sampled_from(holders))
    pieces = c.stripe_read(4096, length, routed, holders, weights, legs="weighted")
    pos = 4096
    for p in pieces:
        assert p.offset == pos and p.length > 0 and p.source in holders
        pos += p.length
    assert pos == 4096 + length
    assert len({p.source for p in pieces}) == len(pieces)
    if c.stripes(length, len(holders)):
        assert all(p.offset % 4096 == 0 for p in pieces)
        assert pieces[0].source == holders[routed % len(holders)]
