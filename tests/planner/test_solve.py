"""planner.solve: each engine's own weight grid searched with the one pricing, checked against
pricing every row; colibri's joint solve over its modes; idle drives; the plan it assembles."""

from dataclasses import replace

import numpy as np
import pytest

from core.errors import UsageError
from engines.pattern import Step
from engines.registry import get_engine
from models.geometry import stacked_geometry
from planner import solve as solve_module
from planner.constants import IDLE_TOLERANCE, TIE_TOLERANCE
from planner.drivecurves import Background, Drive
from planner.plan import Source
from planner.pricing import PhaseSteps, sample_steps
from planner.solve import (
    PHASES,
    FULL_SEARCH,
    Pricer,
    Problem,
    _pick,
    predict,
    recorded_concurrency,
    solve,
    solve_plan,
    with_concurrency,
)
from planner.workload import model_workload
from tests.helpers import impure_imports
from tests.planner.helpers import FAST, LAGGY, SLOW, Flat

DS4 = get_engine("ds4-argodrive")
COLIBRI = get_engine("colibri")
V41_COMPONENT = 6_635_520


def small_problem(engine, drives, arch="?", sample=16, **kw):
    """4 layers x 16 experts of V4.1's components, a 64-token prompt; at most `sample` steps per phase."""
    g = stacked_geometry("m", 4, 16, 2, V41_COMPONENT, arch=arch)
    wl = model_workload(g, prompt_tokens=64)
    phases = {ph: sample_steps(ph, s.steps, s.tokens, s.layers, sample) for ph, s in wl.phases.items()}
    return Problem(engine, g, tuple(drives), phases, **kw)


def test_the_solve_module_is_pure():
    assert impure_imports(solve_module) == []


def test_a_problem_refuses_more_drives_than_the_engine_reads():
    with pytest.raises(UsageError, match="ds4-argodrive reads from 1..3 sources"):
        small_problem(DS4, [Drive(f"d{i}", FAST) for i in range(4)])
    small_problem(COLIBRI, [Drive(f"d{i}", FAST) for i in range(4)], arch="glm_moe_dsa")     # colibri reads 5


def test_reads_in_flight_overridden_and_recorded():
    lanes = with_concurrency(DS4, lanes=4)
    assert lanes.concurrency("prefill").per_source == 4 and lanes.concurrency("decode").shared == 9
    threads = with_concurrency(COLIBRI, threads=3)
    assert threads.concurrency("decode").shared == 3 and threads.concurrency("decode").per_read
    back = recorded_concurrency(DS4, {"prefill": {"per_source": 4, "shared": None}, "decode": {"per_source": None, "shared": 2}})
    assert (back.concurrency("prefill").per_source, back.concurrency("decode").shared) == (4, 2)
    assert recorded_concurrency(DS4, None) is DS4


# ---- the search --------------------------------------------------------------------------------

def exhaustive(pricer, grid, phase, mode=frozenset()):
    return np.array([pricer.price(phase, row, mode).seconds for row in grid])


def test_ds4_search_finds_the_exhaustive_optimum():
    """Decode over three drives (351 distinct splits of a 25-block component) and prefill over two
    (127 of a 128-block staging chunk) are larger than FULL_SEARCH: searched coarse to fine, and
    still the optimum of pricing every row (within the tie tolerance, the smaller weights)."""
    for drives, phase in (((Drive("a", FAST), Drive("b", SLOW), Drive("c", LAGGY)), "decode"),
                          ((Drive("a", FAST), Drive("b", LAGGY)), "prefill")):
        p = small_problem(DS4, drives)
        grid = DS4.grid(len(drives), p.geometry, phase)
        assert len(grid) > FULL_SEARCH
        every = exhaustive(Pricer(p), grid, phase)
        ch = solve(p, top=2)
        best = every.min()
        ties = np.flatnonzero(every <= best * (1 + TIE_TOLERANCE))
        assert ch.predicted[phase]["seconds"] <= best * (1 + TIE_TOLERANCE)
        assert ch.weights[phase] == tuple(int(x) for x in grid[ties[0]])
        # the alternatives are the next best splits priced, each behind the plan
        alts = [a for a in ch.alternatives if a["phase"] == phase]
        assert len(alts) == 2 and all(a["seconds"] >= ch.predicted[phase]["seconds"] * (1 - TIE_TOLERANCE) for a in alts)
        # an alternative faster than the pick can only be a tie (marked as one), or a split the pick
        # passed over for leaving a drive idle (marked as that, never as a tie)
        assert not ch.idle.get(phase)
        assert all(a["tied"] == (a["seconds"] <= best * (1 + TIE_TOLERANCE) and not a["idles_a_drive"]) for a in alts)
        assert all(a["tied"] or a["idles_a_drive"] for a in alts if a["seconds"] < ch.predicted[phase]["seconds"])
        assert all(list(a["weights"]) != list(ch.weights[phase]) for a in alts)


def test_a_small_grid_is_priced_whole():
    p = small_problem(DS4, (Drive("a", FAST), Drive("b", SLOW)))
    grid = DS4.grid(2, p.geometry, "decode")
    assert len(grid) <= FULL_SEARCH
    every = exhaustive(Pricer(p), grid, "decode")
    first_tied = np.flatnonzero(every <= every.min() * (1 + TIE_TOLERANCE))[0]
    assert solve(p).weights["decode"] == tuple(int(x) for x in grid[first_tied])


def test_colibri_joint_solve_over_its_modes_is_the_exhaustive_optimum():
    """One weight vector for both phases and one switch setting: the sum over the phases of each
    phase's seconds over its fastest, minimised over every (mode, weights) of its cut grid."""
    p = small_problem(COLIBRI, (Drive("a", FAST), Drive("b", SLOW)), arch="glm_moe_dsa")
    modes = COLIBRI.modes(p.geometry)
    assert modes == (frozenset(), frozenset({"direct"}), frozenset({"direct", "stripe"}))
    grid = COLIBRI.grid(2, p.geometry, "decode")
    pricer = Pricer(p)
    secs = {ph: np.array([exhaustive(pricer, grid, ph, m) for m in modes]) for ph in PHASES}   # modes x rows
    objective = sum(secs[ph] / secs[ph].min() for ph in PHASES)
    ch = solve(p)
    assert ch.weights["prefill"] == ch.weights["decode"] and ch.mode in modes
    mi, row = modes.index(ch.mode), [tuple(int(x) for x in r) for r in grid].index(ch.weights["decode"])
    assert objective[mi, row] <= objective.min() * (1 + TIE_TOLERANCE)
    assert set(ch.scores) == {"default", "direct", "direct+stripe"}
    for ph in PHASES:
        assert ch.predicted[ph] == predict(p, ph, ch.weights[ph], ch.mode)
    # the faster drive serves more experts
    dec = ch.predicted["decode"]["sources"]
    assert dec[0]["experts"] > dec[1]["experts"] > 0


def test_striping_wins_on_twin_drives_with_large_reads():
    """Equal drives and 6.6 MB expert reads: striping every read over both beats placing whole
    experts, whose luck of the hash leaves one drive the last of each group."""
    p = small_problem(COLIBRI, (Drive("a", FAST), Drive("b", FAST)), arch="glm_moe_dsa")
    ch = solve(p)
    assert ch.mode == frozenset({"direct", "stripe"})
    assert ch.scores["direct+stripe"] < ch.scores["default"]


def test_a_member_that_does_not_stripe_has_no_stripe_mode():
    p = small_problem(COLIBRI, (Drive("a", FAST), Drive("b", FAST)), arch="deepseek_v41")
    assert COLIBRI.modes(p.geometry) == (frozenset(), frozenset({"direct"}))
    assert "stripe" not in solve(p).mode


def test_background_on_the_primary_moves_decode_off_it():
    quiet = small_problem(DS4, (Drive("a", FAST), Drive("b", FAST)))
    busy = replace(quiet, backgrounds=(Background(0, "engram"), Background(0, "busy", 0.3)))
    q, b = solve(quiet).predicted["decode"]["sources"], solve(busy).predicted["decode"]["sources"]
    assert b[0]["share"] < q[0]["share"]


# ---- idle drives -------------------------------------------------------------------------------

def test_pick_prefers_a_candidate_using_every_drive_within_the_idle_tolerance():
    every = lambda c: c != "idle"                                    # noqa: E731
    near = {"idle": 1.0, "full": 1 + IDLE_TOLERANCE / 2}
    far = {"idle": 1.0, "full": 1 + 2 * IDLE_TOLERANCE}
    assert _pick(near, lambda c: c, every) == "full"
    assert _pick(far, lambda c: c, every) == "idle"
    tie = {"b": 1.0, "a": 1 + TIE_TOLERANCE / 2}                     # ties go to the smaller key
    assert _pick(tie, lambda c: c, lambda c: True) == "a"


def one_block_problem(bw_b):
    """Two drives and a 266,240 B component (one 256 KiB block and a 4 KiB tail): ds4 gives the
    block to one drive, so decode either leaves the mirror idle (weights 1:1: the primary reads it
    all) or gives the primary the tails alone (1:2)."""
    g = stacked_geometry("m", 1, 4, 2, 266_240)
    phases = {"prefill": PhaseSteps("prefill", (Step("prefill", 0, (0, 1, 2, 3)),), 1.0, 0, 16, 1),
              "decode": PhaseSteps("decode", (Step("decode", 0, (1,)),), 1.0, 0, 1, 1)}
    return Problem(DS4, g, (Drive("a", Flat(100e6)), Drive("b", Flat(bw_b))), phases)


@pytest.mark.parametrize("bw_b, weights, idle", [
    (98e6, (1, 2), False),      # 3 x 262,144 B / 98 MB/s = 8.025 ms vs 3 x 266,240 / 100 = 7.987 ms: 0.47 % slower
    (97e6, (1, 1), True),       # 8.108 ms: 1.5 % slower, beyond IDLE_TOLERANCE: the mirror stays idle, and is named
])
def test_a_drive_the_best_split_leaves_idle(bw_b, weights, idle):
    p = one_block_problem(bw_b)
    alone = 3 * 266_240 / 100e6
    split = max(3 * 4096 / 100e6, 3 * 262_144 / bw_b)
    assert (split - alone) / alone == pytest.approx(0.0047 if not idle else 0.0151, abs=1e-4)
    ch = solve(p)
    assert ch.weights["decode"] == weights
    assert ch.predicted["decode"]["seconds"] == pytest.approx(alone if idle else split)
    if idle:
        assert ch.idle["decode"]["sources"] == ["b"]
        assert ch.idle["decode"]["why"].startswith("decode: b reads nothing at 1:1: the engine's reads of this "
                                                   "model give it no bytes, and no split using every drive is within 1%")
    else:
        assert "decode" not in ch.idle
        # the faster 1:1 the pick passed over is listed as leaving a drive idle, never as a tie
        # ("as fast within 0.1 %: 1:1" beside a 1:2 plan read as a contradiction)
        (one,) = [a for a in ch.alternatives if a["phase"] == "decode" and tuple(a["weights"]) == (1, 1)]
        assert one["idles_a_drive"] and not one["tied"] and one["behind"] < 0


def test_a_tie_that_leaves_a_drive_idle_is_no_tie_when_the_pick_uses_every_drive():
    from planner.solve import _tied

    every = lambda c: c != "idle"                                    # noqa: E731
    scored = {"idle": 1.0, "full": 1 + TIE_TOLERANCE / 2}
    assert not _tied(scored, "idle", "full", every) and _tied(scored, "full", "full", every)
    assert _tied(scored, "idle", "idle", every)              # the pick leaves it idle too: a plain tie


def test_colibri_names_a_drive_no_expert_hashes_to():
    """2 layers x 4 experts hash into buckets 0, 243, 44, 218, 190, 52, 200, 186; with a drive
    a hundred times slower the fastest cuts give it none of them."""
    g = stacked_geometry("m", 2, 4, 2, 1 << 20, arch="glm_moe_dsa")
    steps = tuple(Step("decode", layer, (e,)) for layer in range(2) for e in range(4))
    phases = {"prefill": PhaseSteps("prefill", tuple(Step("prefill", layer, (0, 1, 2, 3)) for layer in range(2)), 1.0, 0, 64, 2),
              "decode": PhaseSteps("decode", steps, 1.0, 0, 4, 2)}
    p = Problem(COLIBRI, g, (Drive("a", Flat(100e6)), Drive("b", Flat(1e6))), phases)
    ch = solve(p)
    assert ch.predicted["decode"]["sources"][1]["experts"] == 0
    assert ch.idle["decode"]["sources"] == ch.idle["prefill"]["sources"] == ["b"]


def test_a_phase_with_nothing_to_read_still_solves():
    """A cache that holds every expert the decode picks: no step reads anything."""
    for engine, arch in ((DS4, "?"), (COLIBRI, "glm_moe_dsa")):
        p = small_problem(engine, (Drive("a", FAST), Drive("b", SLOW)), arch=arch)
        dec = p.phases["decode"]
        p = replace(p, phases={**p.phases, "decode": PhaseSteps("decode", (), 0.0, int(dec.total_steps), dec.tokens, dec.layers)})
        ch = solve(p)
        assert ch.predicted["decode"]["throughput_Bps"] == 0.0 and ch.predicted["decode"]["seconds"] == 0.0
        assert ch.baselines["decode"]["gain_over_equal"] == 1.0 and "decode" not in ch.idle
        assert ch.predicted["prefill"]["throughput_Bps"] > 0


# ---- the plan ----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine, arch", [(DS4, "?"), (COLIBRI, "glm_moe_dsa")])
def test_solve_plan_records_the_choice_and_what_the_pricing_assumed(engine, arch):
    p = small_problem(engine, (Drive("a", FAST), Drive("b", SLOW)), arch=arch, backgrounds=(Background(0, "engram"),))
    plan, ch = solve_plan((Source("a", "/a"), Source("b", "/b")), p, {"bench": "/x.json"}, top=1)
    assert plan.engine == engine.name and plan.provenance["bench"] == "/x.json"
    assert (plan.prefill.weights, plan.decode.weights) == (ch.weights["prefill"], ch.weights["decode"])
    m = plan.provenance["model"]
    assert set(m["concurrency"]) == set(PHASES) and m["background"] == [{"source": "a", "kind": "engram", "value": 0.0}]
    assert m["modes"] == ["+".join(sorted(x)) or "default" for x in engine.modes(p.geometry)]
    assert m["steps"]["decode"]["sampled"] == len(p.phases["decode"].steps)
    for ph in PHASES:
        assert {"capability", "equal", "gain_over_equal"} <= set(plan.baselines[ph])
        assert sum(s["experts"] for s in getattr(plan, ph).predicted["sources"]) > 0
    if not engine.phase_weights:
        assert plan.prefill.weights == plan.decode.weights
        assert plan.switches == ch.mode
