"""planner.pricing: one pricing for every engine's read pattern, checked by hand.

A group lands when its slowest drive does: max over drives of sum(size / throughput(size, k)),
k the drive's pieces in flight (`Concurrency.in_flight`); a phase is the sum of its groups.
Both engines go through the same functions; the numbers below are worked out on curves whose
throughput is known exactly (`Flat`, `Paced`)."""

from dataclasses import replace

import numpy as np
import pytest

from engines.base import Piece
from engines.colibri.family import FAMILY
from engines.pattern import Concurrency, Pattern, Read, Setup, Step
from engines.registry import get_engine
from models.geometry import stacked_geometry
from planner import pricing as pricing_module
from planner.barrier import SharedLink, shape_from_latency
from planner.constants import ENGRAM_READ_BYTES, ENGRAM_READS_PER_TOKEN
from planner.drivecurves import Background, Drive
from planner.pricing import Curves, PhaseSteps, expert_sources, price_patterns, price_phase, sample_steps
from tests.helpers import impure_imports
from tests.planner.helpers import FAST, LAGGY, SLOW, Flat, Paced

DS4 = get_engine("ds4-argodrive")
COLIBRI = get_engine("colibri")
MB = 1_000_000
V41_COMPONENT = 6_635_520
HEAVY = shape_from_latency(1.0e6, 4.0e6, 9.0e6, 1.5e6)     # p99 six times the median (ns)


def one_step(phase, step, layers=1, tokens=1, empty=0):
    return PhaseSteps(phase, (step,), 1.0, empty, tokens, layers)


def price(engine, geometry, drives, steps, weights, mode=frozenset(), backgrounds=(), links=()):
    setup = Setup(tuple(weights), frozenset(mode))
    return price_phase(steps, setup, lambda st, su: engine.pattern(geometry, st, su), Curves(drives), engine,
                       backgrounds, links, geometry)


def test_the_pricing_module_is_pure():
    assert impure_imports(pricing_module) == []


# ---- concurrency ------------------------------------------------------------------------------

@pytest.mark.parametrize("conc, pieces, reads, expect", [
    (Concurrency(per_source=8), (3, 10, 0), None, (3, 8, 0)),           # lanes per drive, never more than it has
    (Concurrency(shared=9), (3, 3, 3), None, (3, 3, 3)),                # the pool in proportion to the pieces
    (Concurrency(shared=9), (20, 10, 0), None, (6, 3, 0)),              # 9 x 20/30, 9 x 10/30
    (Concurrency(shared=9), (1, 1, 16), None, (1, 1, 8)),               # at least 1: 9 x 1/18 rounds to 1
    (Concurrency(shared=8, per_read=True), (4, 4), 4, (4, 4)),          # 4 reads striped over 2 drives: all legs at once
    (Concurrency(shared=8, per_read=True), (24, 2), 24, (8, 1)),        # 8 x 24/24 threads, 8 x 2/24 -> 1
    (Concurrency(), (5, 0, 2), None, (5, 0, 2)),                        # no limit: every piece at once
])
def test_in_flight_by_hand(conc, pieces, reads, expect):
    assert conc.in_flight(pieces, reads) == expect


# ---- a pattern priced by hand -----------------------------------------------------------------

def hand_pattern():
    """Two groups: A = a 3 MB read cut 2 MB (source 0) + 1 MB (source 1), and a 1 MB read on
    source 1; B = a 1 MB read on source 0."""
    step = Step("prefill", 0, (0,))
    a = (Read("f", 0, 3 * MB, (Piece(0, 0, 2 * MB, 0), Piece(1, 2 * MB, MB, 0))),
         Read("f", 3 * MB, MB, (Piece(1, 3 * MB, MB, 0),)))
    b = (Read("f", 4 * MB, MB, (Piece(0, 4 * MB, MB, 0),)),)
    return Pattern(step, (a, b))


def test_a_pattern_of_known_pieces_on_known_curves_priced_exactly():
    engine = replace(DS4, concurrency=lambda phase: Concurrency(per_source=2))
    drives = (Drive("a", Paced(1e-3, 100e6)), Drive("b", Paced(1e-3, 40e6)))
    pr = price_patterns([hand_pattern()], one_step("prefill", Step("prefill", 0, (0,))), Curves(drives), engine)
    # group A: a holds 1 piece (k=1): 1 ms + 2 MB / 100 MB/s = 21 ms; b holds 2 (k=2): each
    # (1 ms + 1 MB / 40 MB/s) / 2 = 13 ms, 26 ms for both -> A lands at 26 ms, on b, 5 ms after a.
    # group B: a alone, 1 ms + 10 ms = 11 ms, 11 ms after b (which reads nothing).
    assert pr.seconds == pytest.approx(0.026 + 0.011)
    assert pr.source_bytes == (3 * MB, 2 * MB) and pr.source_pieces == (2, 2)
    assert pr.source_s == pytest.approx((0.021 + 0.011, 0.026))
    assert pr.lands_last == (1.0, 1.0) and pr.gap_s == pytest.approx((0.005 + 0.011) / 2)
    assert (pr.groups, pr.reads, pr.steps) == (2, 3, 1)
    assert pr.throughput_Bps == pytest.approx(5 * MB / 0.037) and pr.tail_s == 0 and pr.bound == ""


def test_a_group_is_max_over_drives_of_sum_size_over_throughput_on_a_fitted_curve():
    """The same pattern on iobench's fitted curves: whatever the curve, the formula."""
    engine = replace(DS4, concurrency=lambda phase: Concurrency(per_source=2))
    pr = price_patterns([hand_pattern()], one_step("prefill", Step("prefill", 0, (0,))),
                        Curves((Drive("a", FAST), Drive("b", SLOW))), engine)
    a = 2 * MB / FAST.throughput(2 * MB, 1)
    b = 2 * (MB / SLOW.throughput(MB, 2))
    assert pr.seconds == pytest.approx(max(a, b) + MB / FAST.throughput(MB, 1))


def test_ds4_decode_of_one_missed_expert_by_hand():
    """10:6:6 cuts a 6,635,520 B component into 2,965,504 / 1,835,008 / 1,835,008 B (11, 7, 7 blocks
    of 256 KiB, the tail on the primary); a missed expert is its 3 components in one group, the
    pread pool's 9 threads give each drive its 3 pieces at once."""
    g = stacked_geometry("m", 1, 4, 2, V41_COMPONENT)
    drives = (Drive("a", Flat(100e6)), Drive("b", Flat(50e6)), Drive("c", Flat(50e6)))
    pr = price(DS4, g, drives, one_step("decode", Step("decode", 0, (1,))), (10, 6, 6))
    assert pr.source_bytes == (3 * 2_965_504, 3 * 1_835_008, 3 * 1_835_008) and pr.source_pieces == (3, 3, 3)
    assert pr.seconds == pytest.approx(3 * 1_835_008 / 50e6)
    assert pr.source_s == pytest.approx((3 * 2_965_504 / 100e6, 3 * 1_835_008 / 50e6, 3 * 1_835_008 / 50e6))
    assert pr.source_experts == (1, 0, 0)       # the expert's first byte is in the primary's piece


def test_colibri_decode_of_whole_experts_by_hand():
    """colibri's GLM engine hashes (layer, expert) into 256 buckets: layer 0's experts 0..3 land in
    0, 243, 44, 218; weights 1:1 cut at 128, so experts 0 and 2 are the primary's, 1 and 3 the
    mirror's, each read whole (3 component reads) in the token's one group."""
    g = stacked_geometry("m", 1, 4, 2, V41_COMPONENT, arch="glm_moe_dsa")
    drives = (Drive("a", Flat(100e6)), Drive("b", Flat(50e6)))
    pr = price(COLIBRI, g, drives, one_step("decode", Step("decode", 0, (0, 1, 2, 3))), (1, 1))
    assert pr.source_experts == (2, 2) and pr.source_pieces == (6, 6)
    assert pr.source_bytes == (6 * V41_COMPONENT, 6 * V41_COMPONENT)
    assert pr.seconds == pytest.approx(6 * V41_COMPONENT / 50e6) and pr.groups == 1 and pr.lands_last == (0, 1)
    # O_DIRECT reads the 4 KiB-aligned window: 6,635,520 B is 1620 pages exactly, so nothing changes
    assert price(COLIBRI, g, drives, one_step("decode", Step("decode", 0, (0, 1, 2, 3))), (1, 1),
                 frozenset({"direct"})).seconds == pytest.approx(pr.seconds)


def test_colibri_decode_gains_from_a_slower_second_drive_only_when_a_layer_misses_several_experts():
    """Two independent drives at 40 and 20 MB/s, whole experts, the token's layer one barrier (all its
    reads in flight: 3 experts x 3 components < 8 threads). One missed expert takes s / 40 MB/s on the
    primary alone; hashed to the mirror (expert 1 at 1:1) it takes s / 20 MB/s: twice as long, so a layer
    that misses one expert only loses. Three missed experts (0, 2 on the primary, 1 on the mirror) take
    3 s / 40 MB/s on one drive, max(2 s / 40, s / 20) = 2 s / 40 MB/s on two: 1.5 x faster."""
    g = stacked_geometry("m", 1, 4, 2, V41_COMPONENT, arch="glm_moe_dsa")
    expert = 3 * V41_COMPONENT
    one = (Drive("a", Flat(40e6)),)
    two = (Drive("a", Flat(40e6)), Drive("b", Flat(20e6)))
    for experts, alone, both in (((1,), expert / 40e6, expert / 20e6), ((0, 1, 2), 3 * expert / 40e6, 2 * expert / 40e6)):
        steps = one_step("decode", Step("decode", 0, experts))
        assert price(COLIBRI, g, one, steps, (1,)).seconds == pytest.approx(alone)
        assert price(COLIBRI, g, two, steps, (1, 1)).seconds == pytest.approx(both)


def test_colibri_prefill_waits_for_each_block_of_64_experts():
    """A prefill step of 80 experts is two groups (64 + 16): each waits for its slowest drive."""
    g = stacked_geometry("m", 1, 80, 4, MB, arch="glm_moe_dsa")
    drives = (Drive("a", Flat(100e6)), Drive("b", Flat(50e6)))
    pr = price(COLIBRI, g, drives, one_step("prefill", Step("prefill", 0, tuple(range(80)))), (2, 1))
    want = 0.0
    for block in (range(64), range(64, 80)):
        on = [FAMILY["glm"].route(0, e, None, (2, 1)) for e in block]
        want += max(3 * MB * on.count(0) / 100e6, 3 * MB * on.count(1) / 50e6)
    assert pr.groups == 2 and pr.seconds == pytest.approx(want)
    assert pr.source_experts == tuple(float(sum(FAMILY["glm"].route(0, e, None, (2, 1)) == i for e in range(80))) for i in (0, 1))


@pytest.mark.parametrize("engine, arch", [(DS4, "?"), (COLIBRI, "glm_moe_dsa")])
def test_colibri_stripes_legs_and_ds4_cuts_pieces_but_experts_count_once(engine, arch):
    g = stacked_geometry("m", 2, 8, 2, V41_COMPONENT, arch=arch)
    drives = (Drive("a", FAST), Drive("b", FAST), Drive("c", SLOW))
    mode = frozenset({"direct", "stripe"}) if engine is COLIBRI else frozenset()
    for step in (Step("decode", 1, (0, 3, 5)), Step("prefill", 0, tuple(range(8)))):
        pr = price(engine, g, drives, one_step(step.phase, step), (3, 2, 2), mode)
        assert sum(pr.source_experts) == len(step.experts)
        assert min(pr.source_pieces) > 0                # every drive holds a piece or a leg


def test_an_expert_no_piece_covers_counts_for_no_source():
    g = stacked_geometry("m", 1, 4, 2, MB)
    step = Step("decode", 0, (0, 1))
    x = g.expert_ranges(0, 1)[0]
    only_one = Pattern(step, ((Read(x.file, x.offset, x.length, (Piece(1, x.offset, x.length, 0),)),),))
    assert tuple(expert_sources(only_one, g, 2)) == (0, 1)
    inside = Pattern(step, ((Read(x.file, x.offset - 10, 20, (Piece(0, x.offset - 10, 20, 0),)),),))
    assert tuple(expert_sources(inside, g, 2)) == (1, 0)    # the expert starts inside the piece


# ---- what else lands on the drives ------------------------------------------------------------

def test_links_bound_a_group():
    g = stacked_geometry("m", 1, 4, 2, V41_COMPONENT)
    drives = (Drive("a", Flat(100e6)), Drive("b", Flat(50e6)), Drive("c", Flat(50e6)))
    steps = one_step("decode", Step("decode", 0, (1,)))
    hub = SharedLink("hub", (1, 2), 10e6)             # b and c together move 10 MB/s: the hub sets the time
    free, capped = price(DS4, g, drives, steps, (10, 6, 6)), price(DS4, g, drives, steps, (10, 6, 6), links=(hub,))
    assert capped.seconds == pytest.approx(2 * 3 * 1_835_008 / 10e6) and capped.bound == "hub"
    assert free.bound == "" and free.seconds < capped.seconds
    wide = SharedLink("wide", (1, 2), 1e12)           # a link it never fills changes nothing
    assert price(DS4, g, drives, steps, (10, 6, 6), links=(wide,)).seconds == pytest.approx(free.seconds)


def test_engram_adds_to_the_primary_in_decode_only():
    g = stacked_geometry("m", 4, 8, 2, V41_COMPONENT)
    drives = (Drive("a", Flat(100e6)), Drive("b", Flat(100e6)))
    engram = (Background(0, "engram"),)
    # one step with a read and one empty step (a layer whose experts were all cached)
    dec = PhaseSteps("decode", (Step("decode", 0, (1,)),), 1.0, 1, 1, 4)
    rows = ENGRAM_READS_PER_TOKEN / 4 * Flat(100e6).request_time(ENGRAM_READ_BYTES, 1)   # per layer of a token
    plain, busy = price(DS4, g, drives, dec, (1, 1)), price(DS4, g, drives, dec, (1, 1), backgrounds=engram)
    assert busy.source_s[0] == pytest.approx(plain.source_s[0] + 2 * rows) and busy.source_s[1] == plain.source_s[1]
    # 1:1 of 25 blocks: the primary's 13 blocks (with the tail) land last; the rows come before them
    assert busy.seconds == pytest.approx(plain.seconds + 2 * rows)
    pre = one_step("prefill", Step("prefill", 0, (1, 2)))
    assert price(DS4, g, drives, pre, (1, 1), backgrounds=engram) == price(DS4, g, drives, pre, (1, 1))
    cg = stacked_geometry("m", 4, 8, 2, V41_COMPONENT, arch="glm_moe_dsa")
    assert price(COLIBRI, cg, drives, dec, (1, 1), backgrounds=engram).seconds > price(COLIBRI, cg, drives, dec, (1, 1)).seconds


def test_a_busy_drive_is_stretched_in_both_phases():
    g = stacked_geometry("m", 1, 4, 2, V41_COMPONENT)
    drives = (Drive("a", Flat(100e6)), Drive("b", Flat(100e6)))
    for step in (Step("decode", 0, (1,)), Step("prefill", 0, (0, 1, 2))):
        plain = price(DS4, g, drives, one_step(step.phase, step), (1, 1))
        half = price(DS4, g, drives, one_step(step.phase, step), (1, 1), backgrounds=(Background(1, "busy", 0.5),))
        assert half.source_s[1] == pytest.approx(2 * plain.source_s[1]) and half.source_s[0] == plain.source_s[0]


@pytest.mark.parametrize("engine, arch", [(DS4, "?"), (COLIBRI, "glm_moe_dsa")])
def test_tails_never_make_a_group_faster_and_stay_out_of_prefill(engine, arch):
    g = stacked_geometry("m", 2, 16, 4, V41_COMPONENT, arch=arch)
    plain = (Drive("a", FAST), Drive("b", SLOW), Drive("c", LAGGY))
    tailed = (Drive("a", FAST), Drive("b", SLOW, HEAVY), Drive("c", LAGGY, HEAVY))
    dec = PhaseSteps("decode", (Step("decode", 0, (1, 4)), Step("decode", 1, (7,)), Step("decode", 1, (2, 9, 11))),
                     1.0, 0, 3, 2)
    pre = one_step("prefill", Step("prefill", 0, tuple(range(16))), layers=2)
    rng = np.random.default_rng(3)
    for w in [(1, 1, 1), (10, 6, 6), (1, 50, 50)] + [tuple(int(x) for x in rng.integers(1, 101, 3)) for _ in range(5)]:
        a, b = price(engine, g, plain, dec, w), price(engine, g, tailed, dec, w)
        assert b.seconds >= a.seconds * (1 - 1e-12) and b.tail_s >= 0
        assert b.source_s == pytest.approx(a.source_s)          # the means stay the means
        assert price(engine, g, tailed, pre, w) == price(engine, g, plain, pre, w)


# ---- the phase's steps ------------------------------------------------------------------------

def test_sample_steps_keeps_an_even_sample_scaled_to_all_and_counts_empty_steps_apart():
    steps = [Step("decode", i % 4, (i,) if i % 3 else ()) for i in range(30)]    # 20 read, 10 empty
    s = sample_steps("decode", steps, 10, 4, 5)
    assert len(s.steps) == 5 and s.scale == pytest.approx(20 / 5) and s.empty == 10 and s.total_steps == 30
    assert s.steps[0] == steps[1] and s.steps[-1] == steps[29]
    whole = sample_steps("decode", steps, 10, 4, 100)
    assert len(whole.steps) == 20 and whole.scale == 1.0


def test_a_sampled_phase_is_its_steps_scaled():
    g = stacked_geometry("m", 1, 8, 2, V41_COMPONENT)
    drives = (Drive("a", Flat(100e6)), Drive("b", Flat(50e6)))
    step = Step("decode", 0, (1, 2))
    once = price(DS4, g, drives, one_step("decode", step), (2, 1))
    four = price(DS4, g, drives, PhaseSteps("decode", (step,), 4.0, 0, 1, 1), (2, 1))
    assert four.seconds == pytest.approx(4 * once.seconds) and four.source_bytes == tuple(4 * b for b in once.source_bytes)
    assert four.source_experts == tuple(4 * x for x in once.source_experts) and four.groups == 4
