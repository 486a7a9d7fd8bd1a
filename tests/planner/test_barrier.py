"""The decode barrier priced from latency tails, and links shared by several drives (planner.barrier),
as the one pricing and the solver use them."""

import numpy as np
import pytest

from engines.pattern import Step
from engines.registry import get_engine
from models.geometry import stacked_geometry
from planner.barrier import (
    ATOMS,
    LatencyShape,
    SharedLink,
    barrier_time,
    expected_max,
    link_times,
    links_from,
    shape_from_latency,
)
from planner.drivecurves import Background, Drive
from planner.plans import load_inputs
from planner.pricing import PhaseSteps
from planner.solve import Problem, predict, solve
from tests.planner.helpers import FAST, LAGGY, SLOW, drives3, group, make_rig, preset, write_small_gguf

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


DS4 = get_engine("ds4-argodrive")
V41_COMPONENT = 6_635_520


def problem(drives, links=(), backgrounds=()):
    """ds4 on 2 layers x 8 experts of V4.1's components: a decode token missing 1, 2 or 3 experts
    per layer, and a prefill of 6 experts per layer."""
    g = stacked_geometry("m", 2, 8, 2, V41_COMPONENT)
    dec = (Step("decode", 0, (1,)), Step("decode", 1, (2, 5)), Step("decode", 0, (0, 3, 7)))
    phases = {"prefill": PhaseSteps("prefill", tuple(Step("prefill", i, (0, 1, 2, 4, 5, 6)) for i in range(2)), 1.0, 0, 64, 2),
              "decode": PhaseSteps("decode", dec, 1.0, 0, 2, 2)}
    return Problem(DS4, g, tuple(drives), phases, tuple(backgrounds), tuple(links))


def test_heavy_tail_costs_more_than_the_max_of_means():
    plain = drives3()
    tailed = (plain[0], plain[1], Drive("laggy", LAGGY, HEAVY))
    for w in ((3, 2, 2), (1, 1, 3), (5, 3, 2)):
        a, b = predict(problem(plain), "decode", w), predict(problem(tailed), "decode", w)
        assert [x["time_s"] for x in a["sources"]] == pytest.approx([x["time_s"] for x in b["sources"]])   # same means
        assert a["tail_s"] == 0 and b["tail_s"] > 0
        assert b["seconds"] > a["seconds"] * 1.05                   # the tailed drive holds a piece of every group
    idle = predict(problem(tailed), "decode", (100, 100, 1))         # laggy's share rounds to 0 blocks
    assert idle["sources"][2]["bytes"] == 0
    assert idle["seconds"] == pytest.approx(predict(problem(plain), "decode", (100, 100, 1))["seconds"])


def test_zero_spread_tails_predict_exactly_as_the_mean_model():
    flat = tuple(Drive(d.name, d.curve, LatencyShape()) for d in drives3())
    for ph in ("prefill", "decode"):
        assert predict(problem(flat, backgrounds=(Background(0, "engram"),)), ph, (3, 2, 2)) == \
            predict(problem(drives3(), backgrounds=(Background(0, "engram"),)), ph, (3, 2, 2))


def test_a_tailed_drive_gets_less_of_the_decode_read():
    plain = (Drive("a", SLOW), Drive("b", SLOW))
    tailed = (Drive("a", SLOW), Drive("b", SLOW, HEAVY))
    assert solve(problem(plain)).predicted["decode"]["sources"][1]["bytes"] > \
        solve(problem(tailed)).predicted["decode"]["sources"][1]["bytes"]


# ---- links -------------------------------------------------------------------------------------

def test_link_time_is_the_members_bytes_over_the_ceiling():
    nbytes = np.array([[100, 50, 50], [10, 20, 70]])
    t = link_times(nbytes, (SharedLink("hub", (1, 2), 10.0), SharedLink("all", (0, 1, 2), 50.0)), reads_per_batch=3)
    assert t == pytest.approx(np.array([[30.0, 12.0], [27.0, 6.0]]))


def test_a_shared_link_caps_both_phases_and_the_solver_moves_bytes_off_it():
    d = (Drive("a", FAST), Drive("b", SLOW), Drive("c", SLOW))
    hub = SharedLink("hub", (1, 2), 100e6)              # b and c together move what one moves alone
    for ph in ("prefill", "decode"):
        free, capped = predict(problem(d), ph, (2, 1, 1)), predict(problem(d, links=(hub,)), ph, (2, 1, 1))
        assert capped["seconds"] > free["seconds"] and capped["bound"] == "hub" and free["bound"] == ""
        # every group lasts at least as long as the hub needs for b's and c's bytes of it
        behind = sum(s["bytes"] for s in capped["sources"][1:])          # per layer
        assert capped["time_per_layer_s"] >= behind / 100e6 * (1 - 1e-9)
    free, capped = solve(problem(d)), solve(problem(d, links=(hub,)))
    for ph in ("prefill", "decode"):
        assert capped.predicted[ph]["sources"][0]["share"] > free.predicted[ph]["sources"][0]["share"]
        assert capped.predicted[ph]["seconds"] >= free.predicted[ph]["seconds"]


def test_links_from_keeps_groups_that_fell_short_at_their_highest_rate():
    links = links_from([("hub", (2, 1), 150.0, 200.0),          # decode: 75 % of alone -> shared
                        ("hub", (1, 2), 190.0, 195.0),          # seq: carried 190
                        ("dock", (0, 1), 99.0, 100.0),          # never short: independent drives
                        ("solo", (0,), 10.0, 100.0)])           # one drive is no link
    assert links == (SharedLink("hub", (1, 2), 190.0),)


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
    assert inputs.links == (SharedLink("hub", (1, 2), 200e6),)
    assert inputs.provenance["links"] == [{"name": "hub", "drives": ["slow", "laggy"], "ceiling_Bps": 200e6}]


def test_solve_prices_tails_only_when_asked(tmp_path):
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    dec = lambda bw, lat: {"decode": preset("decode", bw, lat), "seq": preset("seq", 2 * bw, lanes=8)}  # noqa: E731
    presets = [dec(150e6, (1000, 1100, 1200, 1000)), dec(80e6, (1000, 1000, 1000, 1000)), dec(80e6, (800, 3000, 7000, 1200))]
    rig, _ = make_rig(tmp_path / "rig", presets=presets)
    write_small_gguf(rig.model.path, layers=2, experts=8, top_k=2)
    runs = {}
    for flag in ([], ["--tails"]):
        r = CliRunner().invoke(app, ["solve", "--rig", rig.root, "--prompt-tokens", "32", "--json", *flag])
        assert r.exit_code == 0, r.output
        runs[bool(flag)] = json.loads(r.stdout)
    assert runs[False]["provenance"]["tails"] is False and runs[False]["provenance"]["model"]["tails"] == {}
    assert runs[True]["provenance"]["tails"] is True and set(runs[True]["provenance"]["model"]["tails"]) == {"fast", "laggy"}
    assert runs[True]["decode"]["predicted"]["tail_s"] > 0 and not runs[False]["decode"]["predicted"].get("tail_s")
