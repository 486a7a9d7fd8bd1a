import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.ds4_argodrive import BLOCK, COMPONENT_BYTES, PREFILL_CHUNK, block_counts
from planner.model import Background, Drive, capability_weights, decode_workload, evaluate, prefill_workload
from planner.solve import block_counts_many, predict, smallest_equivalent, solve_phase, split_classes
from tests.planner.helpers import FAST, LAGGY, SLOW, drives3


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 300), st.lists(st.integers(1, 100), min_size=1, max_size=3))
def test_vectorised_counts_match_the_engine_rule(blocks, weights):
    assert tuple(block_counts_many(blocks, np.array([weights]))[0]) == block_counts(blocks, weights)


def test_smallest_equivalent_weights_of_design_section_5():
    assert smallest_equivalent((10, 5, 5), COMPONENT_BYTES) == (2, 1, 1)
    assert smallest_equivalent((10, 6, 6), COMPONENT_BYTES) == smallest_equivalent((10, 7, 7), COMPONENT_BYTES) == (3, 2, 2)
    assert smallest_equivalent((10, 5), COMPONENT_BYTES) == (2, 1)
    assert smallest_equivalent((7,), COMPONENT_BYTES) == (1,)


def test_split_classes_are_distinct_and_each_weight_reproduces_its_counts():
    counts, weights = split_classes(3, COMPONENT_BYTES)
    assert len({tuple(c) for c in counts}) == len(counts)
    assert len(counts) == 351     # every way to share 25 blocks over 3 sources is reachable
    for c, w in zip(counts[::17], weights[::17]):
        assert block_counts(25, tuple(int(x) for x in w)) == tuple(int(x) for x in c)


def test_prefill_time_is_the_slowest_drive_bytes_over_its_throughput():
    d = drives3()
    wl = prefill_workload(8)
    p = predict(d, (3, 1, 1), wl)
    sizes = [c * BLOCK for c in block_counts(PREFILL_CHUNK // BLOCK, (3, 1, 1))]
    expect = [n / m.throughput(n, 8) for n, m in zip(sizes, (FAST, SLOW, LAGGY))]
    assert [s.time_s for s in p.shares] == pytest.approx(expect)
    assert p.time_per_batch_s == pytest.approx(max(expect))
    assert p.throughput_Bps == pytest.approx(PREFILL_CHUNK / max(expect))
    assert p.lands_last == "fast"


def test_decode_is_a_barrier_over_request_times_at_the_batch_depth():
    d = drives3()
    p = predict(d, (3, 2, 2), decode_workload(batch=3, threads=9))
    sizes = (11 * BLOCK + COMPONENT_BYTES % BLOCK, 7 * BLOCK, 7 * BLOCK)
    expect = [m.request_time(s, 3) for s, m in zip(sizes, (FAST, SLOW, LAGGY))]
    assert [s.bytes for s in p.shares] == list(sizes)
    assert p.time_per_batch_s == pytest.approx(max(expect))
    assert p.throughput_Bps == pytest.approx(3 * COMPONENT_BYTES / max(expect))
    srt = sorted(expect)
    assert p.gap_s == pytest.approx(srt[-1] - srt[-2])


def test_threads_cap_pieces_in_flight_per_drive():
    d = drives3()
    wide = predict(d, (1, 1, 1), decode_workload(batch=6, threads=9))
    capped = [s.time_s for s in wide.shares]
    sizes = [s.bytes for s in wide.shares]
    assert capped == pytest.approx([m.request_time(s, 3) for s, m in zip(sizes, (FAST, SLOW, LAGGY))])


def test_slow_streaming_drive_moves_decode_but_not_prefill():
    """A drive slow per request is as fast as its twin for bulk reads but slower for decode pieces."""
    d = drives3()
    pre = solve_phase(d, prefill_workload(8))
    dec = solve_phase(d, decode_workload())
    assert pre.weights[1] == pre.weights[2]
    assert dec.prediction.shares[2].blocks < dec.prediction.shares[1].blocks


def test_solver_beats_or_equals_every_class_and_baselines():
    d = drives3()
    for wl in (prefill_workload(8), decode_workload()):
        s = solve_phase(d, wl)
        counts, _ = split_classes(3, wl.read_bytes)
        ev = evaluate(d, counts, wl)
        assert s.prediction.throughput_Bps == pytest.approx(ev.throughput.max())
        assert s.prediction.throughput_Bps >= s.equal.throughput_Bps
        assert s.prediction.throughput_Bps >= s.capability.throughput_Bps
        assert all(a.throughput_Bps <= s.prediction.throughput_Bps for a in s.alternatives)
        assert smallest_equivalent(s.weights, wl.read_bytes) == s.weights


def test_bandwidth_proportional_drives_get_bandwidth_proportional_prefill():
    d = (Drive("a", FAST), Drive("b", SLOW), Drive("c", SLOW))
    assert solve_phase(d, prefill_workload(8)).weights == (2, 1, 1)
    assert capability_weights(d, prefill_workload(8)) == (100, 50, 50)


def test_background_on_primary_moves_decode_share_off_it():
    d = (Drive("a", FAST), Drive("b", SLOW), Drive("c", SLOW))
    quiet = solve_phase(d, decode_workload())
    busy = solve_phase(d, decode_workload(), (Background(0, "engram"), Background(0, "busy", 0.2)))
    assert busy.prediction.shares[0].blocks < quiet.prediction.shares[0].blocks
    assert busy.prediction.throughput_Bps < quiet.prediction.throughput_Bps


def test_engram_background_is_decode_only():
    d = drives3()
    bg = (Background(0, "engram"),)
    assert predict(d, (2, 1, 1), prefill_workload(8), bg) == predict(d, (2, 1, 1), prefill_workload(8))
    assert predict(d, (2, 1, 1), decode_workload(), bg).shares[0].time_s > predict(d, (2, 1, 1), decode_workload()).shares[0].time_s


def test_single_source_reads_everything():
    p = predict((Drive("a", FAST),), (5,), decode_workload())
    assert p.shares[0].bytes == COMPONENT_BYTES and p.gap_s == 0.0


def test_corrected_curve_meets_measurements_and_fades_to_the_fit():
    from planner.model import CorrectedCurve

    pts = ((1 << 20, 3, 70e6), (8 << 20, 8, 120e6))
    c = CorrectedCurve(SLOW, pts, reach=0.5)
    assert c.throughput(1 << 20, 3) == pytest.approx(70e6)           # at a measured shape: the measurement
    assert c.throughput(8 << 20, 8) == pytest.approx(120e6)
    assert c.throughput(4 << 20, 3) == pytest.approx(SLOW.throughput(4 << 20, 3))   # 2 octaves away: the fit
    assert c.throughput(1 << 20, 1) == pytest.approx(SLOW.throughput(1 << 20, 1))   # other lane count: the fit
    mid = c.throughput(int(1.2 * (1 << 20)), 3)
    assert 70e6 < mid < SLOW.throughput(int(1.2 * (1 << 20)), 3)
    assert c.request_time(1 << 20, 3) == pytest.approx(3 * (1 << 20) / 70e6)
    assert CorrectedCurve(SLOW).throughput(1 << 20, 3) == SLOW.throughput(1 << 20, 3)


def test_near_ties_go_to_the_smaller_weights():
    from planner.constants import TIE_TOLERANCE

    d = drives3()
    wl = decode_workload()
    s = solve_phase(d, wl)
    counts, smallest = split_classes(3, wl.read_bytes)
    ev = evaluate(d, counts, wl)
    ties = np.flatnonzero(ev.time <= ev.time.min() * (1 + TIE_TOLERANCE))
    assert s.weights == tuple(int(x) for x in smallest[ties[0]])
    assert all(sum(s.weights) <= sum(smallest[t]) for t in ties)
