"""The decode barrier priced from latency tails, and links shared by several drives."""

import numpy as np
import pytest

from engines.ds4_argodrive import BLOCK, COMPONENT_BYTES, PREFILL_CHUNK, block_counts
from planner.barrier import (
    ATOMS,
    LatencyShape,
    Link,
    barrier_time,
    expected_max,
    link_times,
    links_from,
    shape_from_latency,
)
from planner.model import Background, Drive, decode_workload, evaluate, prefill_workload
from planner.plans import load_inputs
from planner.solve import predict, solve_phase, split_classes
from tests.planner.helpers import FAST, LAGGY, SLOW, drives3, group, make_rig, preset

HEAVY = shape_from_latency(1.0e6, 4.0e6, 9.0e6, 1.5e6)     # p99 six times the median (ns)


# ---- expected maximum, by hand -----------------------------------------------------------------

def test_expected_max_of_hand_computed_atoms():
    # A is 1 or 3 (mean 2), B is always 2: max is 2 when A=1, 3 when A=3 -> 2.5 (max of means: 2)
    assert expected_max(np.array([[1.0, 3.0], [2.0, 2.0]])) == pytest.approx(2.5)
    # two fair coins of {0, 1}: max is 1 unless both are 0 -> 3/4
    assert expected_max(np.array([[0.0, 1.0], [0.0, 1.0]])) == pytest.approx(0.75)
    # {1, 2, 6} against {3, 3, 3}: max is 3, 3, 6 -> 4
    assert expected_max(np.array([[1.0, 2.0, 6.0], [3.0, 3.0, 3.0]])) == pytest.approx(4.0)
    # one variable: its mean
    assert expected_max(np.array([[1.0, 2.0, 6.0]])) == pytest.approx(3.0)


def test_expected_max_is_vectorised_over_candidates():
    rows = np.array([[[1.0, 3.0], [2.0, 2.0]], [[0.0, 1.0], [0.0, 1.0]], [[5.0, 5.0], [1.0, 1.0]]])
    assert expected_max(rows) == pytest.approx([2.5, 0.75, 5.0])


def test_zero_spread_barrier_is_the_slowest_mean():
    means = np.array([[1e-3, 2e-3, 0.5e-3], [3e-3, 1e-3, 0.0]])
    k = np.array([[3, 3, 3], [3, 3, 0]])
    flat = [LatencyShape()] * 3
    assert barrier_time(means, flat, k) == pytest.approx(means.max(axis=1))
    scale, extra = np.array([1.25, 1.0, 1.0]), np.array([0.1e-3, 0.0, 0.0])
    assert barrier_time(means, flat, k, scale, extra) == pytest.approx((means * scale + extra).max(axis=1))


def test_shape_keeps_the_measured_quantiles_and_mean_one():
    atoms = HEAVY.atoms()
    assert len(atoms) == ATOMS and atoms.mean() == pytest.approx(1.0)
    q50, q95, q99 = np.quantile(atoms, [0.5, 0.95, 0.99])
    assert q95 / q50 == pytest.approx(4.0, rel=0.1)
    assert q99 / q50 == pytest.approx(9.0, rel=0.2)
    # the maximum of k draws grows with k; without spread it stays 1
    assert HEAVY.atoms(1).mean() < HEAVY.atoms(3).mean() < HEAVY.atoms(9).mean()
    assert LatencyShape().atoms(3) == pytest.approx(np.ones(ATOMS))


@pytest.mark.parametrize("k", [2, 3, 6])
def test_the_maximum_of_k_draws_matches_k_independent_copies(k):
    """atoms(k) reads the maximum of k draws off one draw's quantiles (u -> u ** (1/k)); the exact
    expected maximum of k copies of one draw's atoms agrees."""
    assert HEAVY.atoms(k).mean() == pytest.approx(expected_max(np.stack([HEAVY.atoms(1)] * k)), rel=2e-3)


@pytest.mark.parametrize("lat", [(0, 1, 2, 1), (3, 2, 1, 2), (1, 2, 3, 0), (5, 5, 5, 5)])
def test_unusable_or_flat_latencies_give_no_spread(lat):
    assert not shape_from_latency(*lat).spread


def test_heavy_tail_costs_more_than_the_max_of_means():
    plain = drives3()
    tailed = (plain[0], plain[1], Drive("laggy", LAGGY, HEAVY))
    wl = decode_workload()
    counts, _ = split_classes(3, wl.read_bytes)
    a, b = evaluate(plain, counts, wl), evaluate(tailed, counts, wl)
    assert np.array_equal(a.source_time, b.source_time)          # the means are the same
    assert np.array_equal(a.time, a.source_time.max(axis=1))     # no tails: the slowest mean
    assert (b.time >= a.time * (1 - 1e-12)).all()
    laggy_last = b.source_time.argmax(axis=1) == 2               # where the tailed drive sets the mean barrier
    assert laggy_last.any() and (b.time[laggy_last] > a.time[laggy_last] * 1.05).all()
    laggy_idle = counts[:, 2] == 0
    assert b.time[laggy_idle] == pytest.approx(a.time[laggy_idle], rel=1e-12)
    p = predict(tailed, (3, 2, 2), wl)
    assert p.tail_s > 0 and p.time_per_batch_s == pytest.approx(max(s.time_s for s in p.shares) + p.tail_s)


def test_zero_spread_tails_predict_exactly_as_the_mean_model():
    flat = tuple(Drive(d.name, d.curve, LatencyShape()) for d in drives3())
    for wl in (prefill_workload(8), decode_workload()):
        assert predict(flat, (3, 2, 2), wl, (Background(0, "engram"),)) == predict(drives3(), (3, 2, 2), wl, (Background(0, "engram"),))


def test_tails_are_decode_only():
    tailed = (Drive("fast", FAST, HEAVY), Drive("slow", SLOW, HEAVY))
    plain = (Drive("fast", FAST), Drive("slow", SLOW))
    assert predict(tailed, (2, 1), prefill_workload(8)) == predict(plain, (2, 1), prefill_workload(8))


def test_a_tailed_drive_gets_less_of_the_decode_read():
    plain = (Drive("a", SLOW), Drive("b", SLOW))
    tailed = (Drive("a", SLOW), Drive("b", SLOW, HEAVY))
    assert solve_phase(plain, decode_workload()).prediction.shares[1].blocks > \
        solve_phase(tailed, decode_workload()).prediction.shares[1].blocks


# ---- links -------------------------------------------------------------------------------------

def test_link_time_is_the_members_bytes_over_the_ceiling():
    nbytes = np.array([[100, 50, 50], [10, 20, 70]])
    t = link_times(nbytes, (Link("hub", (1, 2), 10.0), Link("all", (0, 1, 2), 50.0)), reads_per_batch=3)
    assert t == pytest.approx(np.array([[30.0, 12.0], [27.0, 6.0]]))


def test_a_shared_link_caps_prefill_and_decode():
    d = (Drive("a", FAST), Drive("b", SLOW), Drive("c", SLOW))
    hub = Link("hub", (1, 2), 100e6)              # b and c together move what one moves alone
    for wl in (prefill_workload(8), decode_workload()):
        free, capped = predict(d, (2, 1, 1), wl), predict(d, (2, 1, 1), wl, links=(hub,))
        per_read = sum(s.bytes for s in capped.shares[1:])
        assert capped.time_per_batch_s == pytest.approx(max(free.time_per_batch_s, per_read * wl.reads_per_batch / 100e6))
        assert capped.time_per_batch_s > free.time_per_batch_s and capped.bound == "hub" and free.bound == ""
    # the solver moves the shared drives' bytes to the drive on its own link
    wl = prefill_workload(8)
    free, capped = solve_phase(d, wl), solve_phase(d, wl, links=(hub,))
    assert capped.prediction.shares[0].blocks > free.prediction.shares[0].blocks
    assert capped.prediction.throughput_Bps <= free.prediction.throughput_Bps
    # one chunk by hand: 2:1:1 of 128 blocks is 64/32/32; b+c = 64 blocks over 100 MB/s
    sizes = [c * BLOCK for c in block_counts(PREFILL_CHUNK // BLOCK, (2, 1, 1))]
    alone = max(n / m.throughput(n, 8) for n, m in zip(sizes, (FAST, SLOW, SLOW)))
    assert predict(d, (2, 1, 1), wl, links=(hub,)).time_per_batch_s == pytest.approx(max(alone, (sizes[1] + sizes[2]) / 100e6))


def test_links_from_keeps_groups_that_fell_short_at_their_highest_rate():
    links = links_from([("hub", (2, 1), 150.0, 200.0),          # decode: 75 % of alone -> shared
                        ("hub", (1, 2), 190.0, 195.0),          # seq: carried 190
                        ("dock", (0, 1), 99.0, 100.0),          # never short: independent drives
                        ("solo", (0,), 10.0, 100.0)])           # one drive is no link
    assert links == (Link("hub", (1, 2), 190.0),)


def test_load_inputs_reads_tails_and_shared_links_from_the_bench_result(tmp_path):
    dec = lambda bw, lat: {"decode": preset("decode", bw, lat), "seq": preset("seq", 2 * bw, lanes=8)}  # noqa: E731
    presets = [dec(150e6, (1000, 1100, 1200, 1000)), dec(80e6, (1000, 1000, 1000, 1000)), dec(80e6, (800, 3000, 7000, 1200))]
    together = [group("together", "seq", ("fast", "slow", "laggy"), 600e6)]          # not short of 300+160+160
    groups = [group("hub", "seq", ("slow", "laggy"), 200e6), group("hub", "decode", ("slow", "laggy"), 120e6)]
    rig, _ = make_rig(tmp_path / "rig", presets=presets, groups=groups, together=together)
    assert all(d.tail is None for d in load_inputs(rig.root).drives)   # tails are asked for, not the default
    inputs = load_inputs(rig.root, tails=True)
    assert inputs.provenance["tails"] is True
    assert inputs.drives[1].tail is None                        # no spread measured
    assert inputs.drives[2].tail == shape_from_latency(800, 3000, 7000, 1200)
    assert inputs.drives[0].tail.spread
    assert inputs.links == (Link("hub", (1, 2), 200e6),)
    assert inputs.provenance["links"] == [{"name": "hub", "drives": ["slow", "laggy"], "ceiling_Bps": 200e6}]


def test_decode_component_by_hand_with_a_link():
    d = (Drive("a", FAST), Drive("b", SLOW))
    link = Link("both", (0, 1), 10e6)                        # a slow link: it alone sets the time
    p = predict(d, (1, 1), decode_workload(batch=3), links=(link,))
    assert p.time_per_batch_s == pytest.approx(3 * COMPONENT_BYTES / 10e6)
    assert p.throughput_Bps == pytest.approx(10e6) and p.bound == "both"


def test_solve_prices_tails_only_when_asked(tmp_path):
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    dec = lambda bw, lat: {"decode": preset("decode", bw, lat), "seq": preset("seq", 2 * bw, lanes=8)}  # noqa: E731
    presets = [dec(150e6, (1000, 1100, 1200, 1000)), dec(80e6, (1000, 1000, 1000, 1000)), dec(80e6, (800, 3000, 7000, 1200))]
    rig, _ = make_rig(tmp_path / "rig", presets=presets)
    runs = {}
    for flag in ([], ["--tails"]):
        r = CliRunner().invoke(app, ["solve", "--rig", rig.root, "--workload", "ds4-v41", "--json", *flag])
        assert r.exit_code == 0, r.output
        runs[bool(flag)] = json.loads(r.stdout)
    assert runs[False]["provenance"]["tails"] is False and runs[False]["provenance"]["model"]["tails"] == {}
    assert runs[True]["provenance"]["tails"] is True and set(runs[True]["provenance"]["model"]["tails"]) == {"fast", "laggy"}
    assert runs[True]["decode"]["predicted"]["tail_s"] > 0 and not runs[False]["decode"]["predicted"].get("tail_s")
