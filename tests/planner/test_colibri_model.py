"""planner.colibri_model: colibri's placement shares, its reads priced on hand-computed curves,
and the search over its cut grid (whole experts, one weight vector for both phases, the stripe
switch)."""

from dataclasses import dataclass

import numpy as np
import pytest

from engines.colibri import cuts, placement_counts
from iobench.model import DriveModel
from planner.barrier import LatencyShape
from planner.colibri_model import (
    ColibriWorkload,
    choose,
    cut_classes,
    cuts_many,
    outcome_probs,
    placement_counts_many,
    price_decode,
    price_prefill,
    throughput,
    weight_grid,
)
from planner.model import Drive
from tests.planner.helpers import FAST, SLOW


@dataclass(frozen=True)
class Flat:
    """A drive that moves `bw` bytes/s whatever the read and the queue: k reads in flight take
    k x size / bw each (Little's law), so every time below is bytes / bw."""
    bw: float

    def throughput(self, size_bytes, in_flight):
        return self.bw

    def request_time(self, size_bytes, in_flight):
        return in_flight * size_bytes / self.bw


A, B = Drive("a", Flat(100e6)), Drive("b", Flat(50e6))
# 2 layers x 4 experts: expert_route's buckets (the C formula, engines.colibri.expert_hash) are
# layer 0: 0, 243, 44, 218 and layer 1: 190, 52, 200, 186.
SMALL = dict(layers=2, experts=4, top_k=2)


def test_the_weights_cuts_by_hand_and_vectorised_as_colibri_computes_them():
    # cut[r] = (int)(256 * cum / total + 0.5), at least the previous + 1, the last 256
    assert cuts((9, 3, 3)) == (154, 205, 256)       # 153.6 + .5 -> 154; 204.8 + .5 -> 205
    assert cuts((1, 100)) == (3, 256)               # 2.53 + .5 -> 3
    assert cuts((100, 1, 1)) == (251, 253, 256)     # 250.98 + .5 -> 251; 253.49 + .5 -> 253
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 4, 5):
        w = rng.integers(1, 101, size=(500, n))
        got = cuts_many(w)
        assert [tuple(int(x) for x in row) for row in got] == [cuts(tuple(int(x) for x in row)) for row in w]


def test_placement_shares_by_hand_on_a_small_geometry():
    # 1:1 cuts at 128: buckets 0, 44, 52 fall below it -> 3 experts on the model's drive, 5 on the mirror.
    # 9:3:3 cuts at 154 and 205: {0, 44, 52}, {190, 200, 186}, {243, 218}.
    # 100:1:1 cuts at 251 and 253: nothing hashes into [251, 253) or [253, 256).
    for weights, want in (((1, 1), (3, 5)), ((9, 3, 3), (3, 3, 2)), ((100, 1, 1), (8, 0, 0))):
        assert placement_counts(2, 4, weights) == want
        assert tuple(placement_counts_many(cuts_many([weights]), 2, 4)[0]) == want
    c, w = cut_classes(3)
    got = placement_counts_many(c[:200], 6, 32)
    assert [tuple(int(x) for x in row) for row in got] == [placement_counts(6, 32, tuple(int(x) for x in row))
                                                           for row in w[:200]]


def test_the_cut_grid_keeps_the_smallest_weights_of_each_cut_vector():
    c, w = cut_classes(2)
    assert len({tuple(x) for x in c}) == len(c)                       # distinct cut vectors
    assert [tuple(x) for x in cuts_many(w)] == [tuple(x) for x in c]  # each row's weights give its cuts
    grid = weight_grid(2)
    first = {}
    for row, cut in zip(grid, cuts_many(grid)):
        first.setdefault(tuple(cut), tuple(row))
    assert {tuple(x): tuple(y) for x, y in zip(c, w)} == first        # the first in smallest-first order
    assert first[(128, 256)] == (1, 1) and first[(171, 256)] == (2, 1)


def test_prefill_waits_for_the_slowest_drive_of_each_block():
    cw = ColibriWorkload(**SMALL, expert_bytes=1_000_000, prefill_reads=10.0, misses_per_token=1.0)
    counts = placement_counts_many(cuts_many([(1, 1)]), 2, 4)         # shares 3/8 and 5/8
    pr = price_prefill((A, B), cw, counts)
    # one block of 10 reads: a reads 3.75 x 1 MB at 100 MB/s = 37.5 ms, b 6.25 x 1 MB at 50 MB/s = 125 ms
    assert pr.drive_s[0] == pytest.approx([0.0375, 0.125])
    assert pr.layer_s[0] == pytest.approx(0.125) and pr.last[0] == 1
    assert throughput(pr)[0] == pytest.approx(10 * 1_000_000 / 0.125)
    # 100 reads are blocks of 64 and 36, each a barrier: b needs 0.8 s, then 0.45 s
    pr = price_prefill((A, B), ColibriWorkload(**SMALL, expert_bytes=1_000_000, prefill_reads=100.0,
                                               misses_per_token=1.0), counts)
    assert pr.layer_s[0] == pytest.approx(1.25) and pr.batch_s[0] == pytest.approx(0.8)


def test_decode_is_the_expected_last_read_over_the_multinomial_of_misses():
    # 1 miss per token over 2 layers: 0.5 per layer, so each of the 2 picks misses with p 0.25 and
    # lands on a (3/8) or b (5/8): q_a = 0.09375, q_b = 0.15625, no miss 0.75.
    cw = ColibriWorkload(**SMALL, expert_bytes=1_000_000, prefill_reads=10.0, misses_per_token=1.0)
    counts = placement_counts_many(cuts_many([(1, 1)]), 2, 4)
    qa, qb, q0 = 0.09375, 0.15625, 0.75
    # (reads on a, reads on b): probability, then the layer's time (a read takes 10 ms on a, 20 ms on b)
    cases = {(1, 0): (2 * qa * q0, 0.01), (0, 1): (2 * qb * q0, 0.02), (2, 0): (qa * qa, 0.02),
             (0, 2): (qb * qb, 0.04), (1, 1): (2 * qa * qb, 0.02)}
    want = sum(p * t for p, t in cases.values())
    assert want == pytest.approx(0.00783203125)
    pr = price_decode((A, B), cw, counts)
    assert pr.layer_s[0] == pytest.approx(want)
    assert pr.drive_s[0] == pytest.approx([2 * qa * q0 * 0.01 + qa * qa * 0.02 + 2 * qa * qb * 0.01,
                                           2 * qb * q0 * 0.02 + qb * qb * 0.04 + 2 * qa * qb * 0.02])
    assert pr.last[0] == 1
    probs = outcome_probs(np.array([[0, 0], [1, 0], [0, 1], [2, 0], [0, 2], [1, 1]]), np.array([[3 / 8, 5 / 8]]), 2, 0.25)
    assert probs[0] == pytest.approx([q0 * q0, *(p for p, _ in cases.values())])
    assert probs.sum() == pytest.approx(1.0)


def test_a_striped_read_is_equal_chunks_on_every_drive():
    cw = ColibriWorkload(**SMALL, expert_bytes=8 << 20, prefill_reads=10.0, misses_per_token=1.0)
    assert cw.window == 8 << 20 and cw.can_stripe(2) and not cw.can_stripe(1)
    counts = placement_counts_many(cuts_many([(1, 1)]), 2, 4)
    # 4 MiB on each drive per read; decode: m ~ Binomial(2, 0.25) reads in the layer, b holds m chunks
    dec = price_decode((A, B), cw, counts, stripe=True)
    assert dec.layer_s[0] == pytest.approx((0.375 * 1 + 0.0625 * 2) * (4 << 20) / 50e6)
    pre = price_prefill((A, B), cw, counts, stripe=True)
    assert pre.layer_s[0] == pytest.approx(10 * (4 << 20) / 50e6)
    assert pre.drive_bytes[0] == pytest.approx([10 * (4 << 20)] * 2)
    assert not ColibriWorkload(**SMALL, expert_bytes=(4 << 20) - 4096, prefill_reads=1.0,
                               misses_per_token=1.0).can_stripe(3)


def test_the_solver_gives_the_faster_drive_more_experts_and_the_same_weights_for_both_phases():
    cw = ColibriWorkload(layers=40, experts=384, top_k=6, expert_bytes=19_906_560, prefill_reads=187.4,
                         misses_per_token=11.06)
    ch = choose((Drive("fast", FAST), Drive("slow", SLOW)), cw)
    counts = ch.counts[ch.row]
    assert counts[0] > 1.6 * counts[1]                        # FAST streams ~2x SLOW
    assert tuple(cuts_many([ch.weights[ch.row]])[0]) == tuple(ch.cuts[ch.row])
    swapped = choose((Drive("slow", SLOW), Drive("fast", FAST)), cw)
    assert swapped.counts[swapped.row][1] > 1.6 * swapped.counts[swapped.row][0]
    assert not ch.stripe                                      # unequal drives: equal chunks wait for the slow one


def test_stripe_is_chosen_only_when_it_helps_and_never_under_4_mib():
    big = ColibriWorkload(layers=40, experts=384, top_k=6, expert_bytes=19_906_560, prefill_reads=187.4,
                          misses_per_token=11.06)
    same = (Drive("a", FAST), Drive("b", FAST), Drive("c", FAST))
    ch = choose(same, big)
    assert ch.stripe and ch.stripes == (False, True)
    # it helps: both phases are faster striped at the pick than whole at the best whole pick
    off = int(np.argmin(ch.score[0]))
    for ph in ("prefill", "decode"):
        assert ch.priced[(ph, True)].layer_s[ch.row] <= ch.priced[(ph, False)].layer_s[off] * 1.001
    # a drive streaming 8x slower: its equal chunk of every read would hold up both phases
    crawl = DriveModel(lat_s=100e-6, stream_bw=20e6, bw_max=25e6)
    mixed = (Drive("a", FAST), Drive("b", FAST), Drive("c", crawl))
    ch = choose(mixed, big)
    assert not ch.stripe and ch.counts[ch.row][2] < ch.counts[ch.row][0] / 4
    small = ColibriWorkload(layers=40, experts=384, top_k=6, expert_bytes=(4 << 20) - 8192, prefill_reads=187.4,
                            misses_per_token=11.06)
    ch = choose(same, small)
    assert not ch.stripe and ch.stripes == (False,)


def test_a_drive_with_a_latency_tail_lands_last_later_in_decode_only():
    cw = ColibriWorkload(**SMALL, expert_bytes=1_000_000, prefill_reads=10.0, misses_per_token=1.0)
    counts = placement_counts_many(cuts_many([(1, 1)]), 2, 4)
    tailed = (A, Drive("b", Flat(50e6), LatencyShape(0.8, 2.0, 4.0)))
    plain, tail = price_decode((A, B), cw, counts), price_decode(tailed, cw, counts)
    assert plain.tail_s[0] == 0.0 and tail.tail_s[0] > 0.0
    assert tail.layer_s[0] > plain.layer_s[0]
    assert price_prefill(tailed, cw, counts).layer_s[0] == price_prefill((A, B), cw, counts).layer_s[0]


def test_no_misses_cost_nothing_and_say_so():
    cw = ColibriWorkload(**SMALL, expert_bytes=1_000_000, prefill_reads=10.0, misses_per_token=0.0)
    pr = price_decode((A, B), cw, placement_counts_many(cuts_many([(1, 1)]), 2, 4))
    assert pr.layer_s[0] == 0.0 and throughput(pr)[0] == 0.0
