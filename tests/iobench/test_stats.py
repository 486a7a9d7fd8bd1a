"""Percentiles, knee, spread and window crediting: the arithmetic of a trial."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iobench import stats


def test_percentile_interpolates_between_ranks():
    values = [10, 20, 30, 40, 50]
    assert stats.percentile(values, 0) == 10
    assert stats.percentile(values, 50) == 30
    assert stats.percentile(values, 100) == 50
    assert stats.percentile(values, 25) == 20
    assert stats.percentile(values, 95) == pytest.approx(48.0)
    assert stats.percentile([7], 99) == 7
    assert stats.percentile([], 50) == 0.0
    with pytest.raises(ValueError):
        stats.percentile(values, 101)


def test_latency_summary_keys_and_order():
    lat = list(range(1, 1001))
    s = stats.latency_summary(lat)
    assert set(s) == {"p50", "p95", "p99", "mean"}
    assert s["p50"] <= s["p95"] <= s["p99"]
    assert s["p99"] == 990  # 1 + 0.99 * 999 = 990.01, rounded
    assert stats.latency_summary([]) == {"p50": 0, "p95": 0, "p99": 0, "mean": 0}


def test_knee_is_lowest_lane_count_within_5_percent_of_best():
    by = {1: 50.0, 2: 90.0, 4: 96.0, 8: 100.0, 16: 99.0}
    assert stats.best_lanes(by) == 8
    assert stats.knee_lanes(by) == 4           # 96 >= 95
    assert stats.knee_lanes({1: 94.9, 2: 100.0}) == 2
    assert stats.knee_lanes({1: 95.0, 2: 100.0}) == 1
    assert stats.best_lanes({1: 100.0, 2: 100.0}) == 1   # a tie goes to fewer lanes
    with pytest.raises(ValueError):
        stats.best_lanes({})


def test_spread_is_range_over_median():
    assert stats.spread_pct([100, 102, 98]) == pytest.approx(4.0)
    assert stats.spread_pct([100]) == 0.0
    assert stats.spread_pct([0, 0]) == 0.0


def test_window_credits_requests_by_overlap():
    # three 100-byte requests: [0,10), [10,20), [5,25)
    s = np.array([0, 10, 5])
    e = np.array([10, 20, 25])
    n = np.array([100, 100, 100])
    by, rq = stats.window_totals(s, e, n, 0, 10)
    assert by == pytest.approx(100 + 0 + 25)
    assert rq == pytest.approx(1.25)
    by, _ = stats.window_totals(s, e, n, 0, 100)
    assert by == pytest.approx(300)
    assert stats.window_totals(s, e, n, 30, 40) == (0.0, 0.0)
    (bps, rps), = stats.window_rates(s, e, n, [(0, 1_000_000_000)])
    assert bps == pytest.approx(300) and rps == pytest.approx(3)


def test_linear_credit_is_exact_for_a_staggered_fifo():
    """A drive serving one request at a time (a throttle's queue) with L lanes staggered in steady
    state: the credited rate equals the true rate in any window."""
    L, piece, service = 4, 1000, 10     # each request is served for 10 ns, waits 30 ns before
    starts, ends = [], []
    for k in range(200):
        end = (k + 1) * service
        starts.append(end - L * service)
        ends.append(end)
    s, e, n = np.array(starts), np.array(ends), np.full(len(starts), piece)
    for a, b in [(500, 900), (613, 1377), (1000, 1005)]:
        by, _ = stats.window_totals(s, e, n, a, b)
        assert by / (b - a) == pytest.approx(piece / service)


@given(st.lists(st.floats(min_value=1, max_value=1e12), min_size=1, max_size=3))
def test_integer_weights_are_engine_weights_in_proportion(rates):
    w = stats.integer_weights(rates)
    assert len(w) == len(rates)
    assert all(1 <= x <= 100 for x in w)
    assert max(w) == 10
    fastest = rates.index(max(rates))
    assert w[fastest] == 10


def test_integer_weights_examples():
    assert stats.integer_weights([12.9e9, 7.08e9, 7.08e9]) == (10, 5, 5)
    assert stats.integer_weights([200e6, 100e6, 100e6]) == (10, 5, 5)
    assert stats.integer_weights([0, 0]) == (1, 1)


def test_the_ratio_interval_is_the_runs_noise_around_the_ratio():
    assert stats.ratio_interval([5.0, 5.0, 5.0], [2.0, 2.0]) == (2.5, 2.5)       # no noise: the ratio itself
    tight = stats.ratio_interval([10.0, 10.1, 9.9], [5.0, 5.1, 4.9])
    loose = stats.ratio_interval([10.0, 12.0, 8.0], [5.0, 6.0, 4.0])
    assert 1.9 < tight[0] <= 2.0 <= tight[1] < 2.1
    assert loose[0] < tight[0] and loose[1] > tight[1]
    assert stats.ratio_interval([10.0, 12.0, 8.0], [5.0, 6.0, 4.0]) == loose      # seeded: the same runs, the same interval
    assert stats.ratio_interval([1.0], [1.0, 2.0]) is None and stats.ratio_interval([1.0, 2.0], [0.0, 0.0]) is None
    with pytest.raises(ValueError, match="level"):
        stats.ratio_interval([1.0, 2.0], [1.0, 2.0], level=1.0)


def test_a_paired_ratio_cancels_what_moves_both_runs_of_a_pair():
    # the machine drifts from pass to pass by a factor of two; within a pass x is 1.1 y
    pairs = [(1.1 * y, y) for y in (5.0, 10.0, 7.0, 14.0)]
    r, lo, hi = stats.paired_ratio(pairs)
    assert r == lo == hi == pytest.approx(1.1)
    wide = stats.ratio_interval([x for x, _ in pairs], [y for _, y in pairs])
    assert wide[0] < 0.9 and wide[1] > 1.3          # taken as independent runs, the drift is noise
    noisy = stats.paired_ratio([(1.0, 1.0), (1.2, 1.0), (0.9, 1.0), (1.1, 1.0)])
    assert noisy[1] < noisy[0] < noisy[2] and noisy == stats.paired_ratio([(1.0, 1.0), (1.2, 1.0), (0.9, 1.0), (1.1, 1.0)])
    assert stats.paired_ratio([(1.0, 1.0)]) is None and stats.paired_ratio([(1.0, 1.0), (1.0, 0.0)]) is None
    with pytest.raises(ValueError, match="level"):
        stats.paired_ratio([(1.0, 1.0), (1.0, 1.0)], level=0.0)
