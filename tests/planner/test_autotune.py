"""The measured tuner's pure logic: candidates from the solver's Choice (per phase, or jointly for
an engine with one weight vector for both phases), ABBA order, the time budget, the pick (the
joint one by the solver's own objective), the plan."""

import json
from functools import lru_cache

import pytest

from core.errors import RigError
from engine_bridge.moe.constants import COLIBRI_MODEL_TYPE
from engines.registry import get_engine
from models.geometry import stacked_geometry
from planner.autotune import (
    Arm,
    Tally,
    Trial,
    abba_order,
    arms_for,
    candidates,
    joint_pick,
    measured_plan,
    pick,
    rounds_that_fit,
    run_trials,
)
from planner.plan import Phase, Source, plan_from_dict, plan_to_dict
from planner.solve import Pricer, Problem, prediction, solve, solve_plan
from planner.workload import model_workload
from tests.planner.helpers import drives3

DS4, COLIBRI = "ds4-argodrive", "colibri"
SOURCES = (Source("fast", "/f"), Source("slow", "/s"), Source("laggy", "/l"))


@lru_cache(maxsize=None)
def problem(engine: str, n: int = 3) -> Problem:
    """A small model's problem (2 layers x 16 experts, stacked like a GGUF): ds4's 557,056 B
    components (2 blocks + 32 KiB), or 1 MiB ones of a model colibri's GLM engine runs."""
    comp, arch = (557_056, "deepseek2") if engine == DS4 else (1 << 20, COLIBRI_MODEL_TYPE)
    g = stacked_geometry("m.gguf", 2, 16, 2, comp, 3, arch=arch)
    return Problem(get_engine(engine), g, drives3()[:n], model_workload(g).phases)


@lru_cache(maxsize=None)
def solved(engine: str, n: int = 3):
    return solve(problem(engine, n), 3)


def predictor(p: Problem):
    pricer = Pricer(p)
    return lambda ph, w, m: prediction(pricer.price(ph, w, m), w, m, p.drives)


class FakeClock:
    """Time moves only when a fake measurement says a trial took so long."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_measure(clock, rates, seconds=None):
    """A measure function: arm -> its rate from `rates` (by weights), taking `seconds` (default:
    the trial length asked) of the fake clock. Records the calls."""
    calls = []

    def measure(arm, trial_s):
        calls.append(arm.weights)
        clock.now += trial_s if seconds is None else seconds(arm)
        return rates[arm.weights]
    measure.calls = calls
    return measure


def arms(phase="decode", *ws):
    return tuple(Arm(phase, w, (f"model #{i + 1}",), 100.0 - i) for i, w in enumerate(ws))


def test_abba_order_alternates_direction():
    assert abba_order(3, 3) == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    assert abba_order(2, 0) == [] and abba_order(0, 2) == []


@pytest.mark.parametrize("n,trial,budget,rounds", [
    (5, 4.0, 300.0, 14),     # 15 fit, kept even
    (5, 4.0, 40.0, 2),
    (5, 4.0, 30.0, 1),       # one round fits: one round
    (5, 4.0, 19.0, 0),       # not even one
    (10, 3.0, 300.0, 10),
    (0, 3.0, 300.0, 0),
])
def test_rounds_that_fit(n, trial, budget, rounds):
    assert rounds_that_fit(n, trial, budget) == rounds


def test_every_planned_round_runs_in_abba_order_when_the_budget_allows():
    a = arms("decode", (1, 1), (2, 1), (3, 1))
    clock = FakeClock()
    m = fake_measure(clock, {(1, 1): 10.0, (2, 1): 30.0, (3, 1): 20.0})
    t = run_trials(a, m, clock, budget_s=24.0, trial_s=4.0)
    assert t.rounds_planned == 2 and not t.stopped_by_budget
    assert m.calls == [(1, 1), (2, 1), (3, 1), (3, 1), (2, 1), (1, 1)]
    assert [(x.round, x.arm) for x in t.trials] == abba_order(3, 2)
    assert [x.start_s for x in t.trials] == [0.0, 4.0, 8.0, 12.0, 16.0, 20.0] and t.wall_s == 24.0


def test_a_trial_that_cannot_finish_is_never_started():
    """Trials take 7 s, not the nominal 4: after the first, the runner expects 7 s per trial and
    stops while the next would still end within the budget."""
    a = arms("decode", (1, 1), (2, 1))
    clock = FakeClock()
    m = fake_measure(clock, {(1, 1): 1.0, (2, 1): 2.0}, seconds=lambda arm: 7.0)
    t = run_trials(a, m, clock, budget_s=30.0, trial_s=4.0, rounds=10)
    assert len(t.trials) == 4 and t.stopped_by_budget          # 4 x 7 = 28; a fifth would end at 35
    assert all(x.start_s + x.seconds <= 30.0 for x in t.trials)
    # the first trial runs on the nominal estimate: a budget below it measures nothing
    clock2 = FakeClock()
    t2 = run_trials(a, fake_measure(clock2, {(1, 1): 1.0, (2, 1): 2.0}), clock2, budget_s=3.9, trial_s=4.0)
    assert t2.trials == () and t2.stopped_by_budget and t2.rounds_planned == 1


def test_the_longest_trial_so_far_sets_the_estimate():
    a = arms("decode", (1, 1), (2, 1))
    clock = FakeClock()
    lengths = iter([4.0, 9.0, 4.0, 4.0, 4.0])
    m = fake_measure(clock, {(1, 1): 1.0, (2, 1): 2.0}, seconds=lambda arm: next(lengths))
    t = run_trials(a, m, clock, budget_s=25.0, trial_s=4.0, rounds=4)
    # 4 + 9 = 13 used; 13 + 9 <= 25 starts a third (ends 17); 17 + 9 > 25 stops
    assert [x.seconds for x in t.trials] == [4.0, 9.0, 4.0] and t.stopped_by_budget


def test_the_rest_and_warm_up_count_in_the_rounds_planned_and_in_the_first_estimate():
    """Trials of 4 s measured take 4.8 s with a 0.3 s rest and a 0.5 s warm-up. For 3 arms and
    100 s, the bare 4 s would plan 8 rounds that the budget cuts short in the seventh; counting
    the 0.8 s plans 6, and all 6 finish. A 4.5 s budget starts no trial, though 4 s would fit."""
    a = arms("decode", (1, 1), (2, 1), (3, 1))
    rates = {(1, 1): 1.0, (2, 1): 2.0, (3, 1): 3.0}
    bare_clock = FakeClock()
    bare = run_trials(a, fake_measure(bare_clock, rates, seconds=lambda arm: 4.8), bare_clock, budget_s=100.0, trial_s=4.0)
    assert bare.rounds_planned == 8 and bare.stopped_by_budget and len(bare.trials) == 20
    clock = FakeClock()
    t = run_trials(a, fake_measure(clock, rates, seconds=lambda arm: 4.8), clock, budget_s=100.0, trial_s=4.0,
                   overhead_s=0.8)
    assert t.rounds_planned == 6 and len(t.trials) == 18 and not t.stopped_by_budget
    clock2 = FakeClock()
    t2 = run_trials(a, fake_measure(clock2, rates), clock2, budget_s=4.5, trial_s=4.0, overhead_s=0.8)
    assert t2.trials == () and t2.stopped_by_budget


def test_stop_ends_the_run_before_the_next_trial_and_keeps_what_was_measured():
    a = arms("decode", (1, 1), (2, 1))
    clock = FakeClock()
    m = fake_measure(clock, {(1, 1): 1.0, (2, 1): 2.0})
    t = run_trials(a, m, clock, budget_s=300.0, trial_s=4.0, rounds=4, stop=lambda: len(m.calls) >= 3)
    assert len(t.trials) == 3 and t.interrupted and not t.stopped_by_budget
    assert pick(a, t)["decode"].rounds == (0,)


def test_pick_uses_complete_rounds_only():
    a = arms("decode", (1, 1), (2, 1), (3, 1))
    trials = [Trial(0, 0, 10.0, 0, 1), Trial(1, 0, 30.0, 1, 1), Trial(2, 0, 20.0, 2, 1),
              Trial(2, 1, 21.0, 3, 1), Trial(1, 1, 29.0, 4, 1), Trial(0, 1, 11.0, 5, 1),
              Trial(0, 2, 99.0, 6, 1)]                              # a round cut short: not counted
    p = pick(a, Tally(tuple(trials), 3, True, 7.0))["decode"]
    assert p.by == "measured" and p.arm == 1 and p.rounds == (0, 1)
    assert p.medians == {0: 10.5, 1: 29.5, 2: 20.5}


def test_pick_ties_go_to_the_model_order_and_no_round_keeps_the_model_choice():
    a = arms("prefill", (2, 1), (1, 1))
    same = (Trial(0, 0, 5.0, 0, 1), Trial(1, 0, 5.0, 1, 1))
    assert pick(a, Tally(same, 1, False, 2.0))["prefill"].arm == 0
    p = pick(a, Tally((Trial(1, 0, 50.0, 0, 1),), 1, True, 1.0))["prefill"]
    assert (p.arm, p.by, p.rounds) == (0, "model", ())


def test_candidates_measure_a_split_once_with_all_its_roles():
    pred = lambda bps: {"throughput_Bps": bps}   # noqa: E731
    c = candidates("decode", [((3, 2), pred(9.0)), ((2, 1), pred(8.0)), ((1, 1), pred(7.0)), ((5, 1), pred(1.0))],
                   ((2, 1), pred(8.0)), ((1, 1), pred(7.0)), top=3)
    assert [(x.weights, x.roles) for x in c] == [((3, 2), ("model #1",)), ((2, 1), ("model #2", "capability")),
                                                  ((1, 1), ("model #3", "equal"))]


def test_candidates_that_give_the_same_reads_are_measured_once():
    pred = lambda bps: {"throughput_Bps": bps}   # noqa: E731
    same = lambda ph, w, m: sum(w) % 2           # noqa: E731  (a stand-in for "the engine reads these alike")
    c = candidates("decode", [((3, 2), pred(9.0)), ((2, 1), pred(8.0))], ((4, 1), pred(8.0)), ((1, 1), pred(7.0)),
                   top=2, key=same)
    assert [(x.weights, x.roles) for x in c] == [((3, 2), ("model #1", "model #2", "capability")), ((1, 1), ("equal",))]


def test_arms_for_an_engine_with_weights_per_phase():
    ch = solved(DS4)
    a = arms_for(ch, top=3)
    for ph in ("prefill", "decode"):
        mine = [x for x in a if x.phase == ph]
        assert mine[0].weights == ch.weights[ph] and mine[0].roles[0] == "model #1"
        assert mine[0].predicted_Bps == pytest.approx(ch.predicted[ph]["throughput_Bps"])
        roles = [r for x in mine for r in x.roles]
        assert {"capability", "equal", "model #2", "model #3"} <= set(roles)
        assert len({x.weights for x in mine}) == len(mine) and all(x.mode == frozenset() for x in mine)
    assert [x.phase for x in a] == sorted((x.phase for x in a), key=("prefill", "decode").index)
    assert arms_for(ch, top=3, joint=False) == a


def test_arms_for_an_engine_with_one_vector_measures_each_candidate_on_both_phases_in_its_mode():
    p, ch = problem(COLIBRI, 2), solved(COLIBRI, 2)
    assert ch.scores and ch.weights["prefill"] == ch.weights["decode"]
    a = arms_for(ch, top=3, predict=predictor(p))
    pre, dec = [x for x in a if x.phase == "prefill"], [x for x in a if x.phase == "decode"]
    assert a == tuple(pre + dec)
    assert [(x.weights, x.mode, x.roles) for x in pre] == [(x.weights, x.mode, x.roles) for x in dec]
    assert (pre[0].weights, pre[0].mode, pre[0].roles[0]) == (ch.weights["prefill"], ch.mode, "model #1")
    # the pick's weights in every other mode the solver scored, each measured in that mode
    others = {name for name in ch.scores if name != ("+".join(sorted(ch.mode)) or "default")}
    assert {r for x in pre for r in x.roles if r.startswith("mode ")} == {f"mode {m}" for m in others}
    for x in a:
        assert x.predicted_Bps > 0 and x.prediction["phase"] == x.phase and list(x.weights) == x.prediction["weights"]
        assert x.mode == frozenset(k for k in ("direct", "stripe") if x.prediction[k])
    assert {"capability", "equal"} <= {r for x in pre for r in x.roles}
    assert len({(x.weights, x.mode) for x in pre}) == len(pre)
    # without a predictor: no other modes (their predictions are not in the Choice)
    assert not any(r.startswith("mode ") for x in arms_for(ch, top=3) for r in x.roles)


def test_arms_for_merges_candidates_that_give_the_same_reads():
    """On this model every expert's tensors are 4 KiB-aligned and under 4 MiB: the O_DIRECT window
    is the read itself and nothing is striped, so the three modes read alike and each weight
    vector is one candidate, measured once with all its roles."""
    p, ch = problem(COLIBRI, 2), solved(COLIBRI, 2)
    pricer = Pricer(p)

    def reads(ph, w, m):
        return tuple(p.engine.pattern(p.geometry, st, pricer.setup(w, m)).groups for st in p.phases[ph].steps)

    assert ch.mode == frozenset() and set(ch.scores) == {"default", "direct", "direct+stripe"}
    a = arms_for(ch, top=3, key=reads, predict=predictor(p))
    pre = [x for x in a if x.phase == "prefill"]
    assert pre[0].roles == ("model #1", "mode direct", "mode direct+stripe")
    keys = [tuple(reads(ph, x.weights, x.mode) for ph in ("prefill", "decode")) for x in pre]
    assert len(set(keys)) == len(keys) == len({x.weights for x in pre})
    assert len(pre) < len(arms_for(ch, top=3, predict=predictor(p))) / 2


def joint_arms(specs):
    """Arms of both phases from (weights, mode, {phase: (predicted Bps, predicted seconds)})."""
    return tuple(Arm(ph, w, (f"c{i}",), bps, {"throughput_Bps": bps, "seconds": s}, m)
                 for ph in ("prefill", "decode") for i, (w, m, p) in enumerate(specs) for bps, s in (p[ph],))


def tally_of(arms, rates, rounds=2):
    trials = [Trial(i, r, rates[i], 0.0, 1.0) for r in range(rounds) for i in range(len(arms))]
    return Tally(tuple(trials), rounds, False, float(len(trials)))


def test_the_joint_pick_is_the_solvers_objective_on_the_measurements():
    """Three candidates: A fastest in prefill, B in decode, C close to both. The sum over phases
    of seconds / the phase's fastest picks C (1.05 + 1.05 < 1 + 2 and 1.5 + 1), for both phases;
    picking each phase alone would have taken A and B."""
    a = joint_arms([((2, 1), frozenset(), {"prefill": (100.0, 1.0), "decode": (100.0, 1.0)}),
                    ((1, 1), frozenset(), {"prefill": (100.0, 1.0), "decode": (100.0, 1.0)}),
                    ((3, 1), frozenset(), {"prefill": (100.0, 1.0), "decode": (100.0, 1.0)})])
    # measured rates: seconds = 100 B / rate
    rates = [100.0, 100 / 1.5, 100 / 1.05, 50.0, 100.0, 100 / 1.05]
    picks = pick(a, tally_of(a, rates), joint=True)
    assert picks == joint_pick(a, tally_of(a, rates))
    assert [a[picks[ph].arm].weights for ph in ("prefill", "decode")] == [(3, 1), (3, 1)]
    assert all(p.by == "measured" and p.rounds == (0, 1) for p in picks.values())
    assert picks["prefill"].objective[2] == pytest.approx(2.1) and picks["decode"].objective[3] == pytest.approx(3.0)
    alone = pick(a, tally_of(a, rates))
    assert a[alone["prefill"].arm].weights == (2, 1) and a[alone["decode"].arm].weights == (1, 1)


def test_the_joint_pick_weighs_seconds_not_rates():
    """A mode that reads more bytes (O_DIRECT windows) at a higher rate can still take longer."""
    a = joint_arms([((2, 1), frozenset(), {"prefill": (100.0, 1.0), "decode": (100.0, 1.0)}),
                    ((2, 1), frozenset({"direct"}), {"prefill": (100.0, 2.0), "decode": (100.0, 2.0)})])
    rates = [100.0, 150.0, 100.0, 150.0]            # direct: 200 B at 150 B/s = 1.33 s against 1 s
    picks = pick(a, tally_of(a, rates), joint=True)
    assert {a[p.arm].mode for p in picks.values()} == {frozenset()}
    rates = [100.0, 250.0, 100.0, 250.0]            # 0.8 s: now direct is faster
    picks = pick(a, tally_of(a, rates), joint=True)
    assert {a[p.arm].mode for p in picks.values()} == {frozenset({"direct"})}


def test_the_joint_pick_needs_a_round_of_every_arm_and_ties_go_to_the_model_order():
    a = joint_arms([((2, 1), frozenset(), {"prefill": (1.0, 1.0), "decode": (1.0, 1.0)}),
                    ((1, 1), frozenset(), {"prefill": (1.0, 1.0), "decode": (1.0, 1.0)})])
    cut = Tally((Trial(0, 0, 1.0, 0, 1), Trial(1, 0, 9.0, 1, 1), Trial(2, 0, 1.0, 2, 1)), 1, True, 3.0)
    picks = pick(a, cut, joint=True)
    assert [(p.arm, p.by) for p in picks.values()] == [(0, "model"), (2, "model")]
    even = pick(a, tally_of(a, [5.0] * 4), joint=True)
    assert [p.arm for p in even.values()] == [0, 2]


def test_a_joint_measured_plan_takes_the_picked_mode():
    p = problem(COLIBRI, 2)
    plan, ch = solve_plan(SOURCES[:2], p, {"bench": "b.json"}, created="2026-11-30T10:00:00.000Z")
    a = arms_for(ch, top=1, predict=predictor(p))
    direct = next(i for i, x in enumerate(a) if x.phase == "prefill" and x.mode == frozenset({"direct"}))
    rates = [x.predicted_Bps * (3.0 if x.mode == frozenset({"direct"}) else 1.0) for x in a]
    t = tally_of(a, rates)
    out = measured_plan(plan, a, t, pick(a, t, joint=True), {"joint": True})
    assert out.direct and not out.stripe and out.prefill.weights == out.decode.weights == a[direct].weights
    cands = out.decode.measured["candidates"]
    assert all("objective" in c and c["mode"] in ([], ["direct"], ["direct", "stripe"]) for c in cands)
    assert plan_from_dict(json.loads(json.dumps(plan_to_dict(out)))) == out
    assert out.provenance["autotune"]["arms"][direct]["mode"] == ["direct"]


MEASURED_KEYS = {"throughput_Bps", "runs_Bps", "n", "spread_pct", "error_pct", "picked_by", "rounds", "candidates"}
CANDIDATE_KEYS = {"weights", "mode", "roles", "predicted_Bps", "measured_Bps", "runs_Bps"}


def _measured_run():
    plan, ch = solve_plan(SOURCES, problem(DS4), {"bench": "b.json"}, created="2026-11-30T10:00:00.000Z")
    a = arms_for(ch, 2)
    # the drives "measure" the decode equal split fastest, prefill as the model predicts
    rates = {i: (x.predicted_Bps * (2.0 if x.phase == "decode" and "equal" in x.roles else 1.0)) for i, x in enumerate(a)}
    clock = FakeClock()

    def measure(arm, trial_s):
        clock.now += trial_s
        return rates[a.index(arm)]
    tally = run_trials(a, measure, clock, budget_s=300.0, trial_s=4.0, rounds=2)
    return plan, a, tally, pick(a, tally)


def test_measured_plan_records_predictions_and_measurements_with_pinned_keys():
    plan, a, tally, picks = _measured_run()
    out = measured_plan(plan, a, tally, picks, {"budget_s": 300.0, "trial_s": 4.0})
    eq = next(x for x in a if x.phase == "decode" and "equal" in x.roles)
    assert out.decode.weights == eq.weights and out.prefill.weights == plan.prefill.weights
    d = plan_to_dict(out)
    assert set(d["decode"]) == {"weights", "predicted", "measured"}
    m = d["decode"]["measured"]
    assert set(m) == MEASURED_KEYS and all(set(c) == CANDIDATE_KEYS for c in m["candidates"])
    assert m["picked_by"] == "measured" and m["n"] == 2 and m["rounds"] == [0, 1]
    assert m["throughput_Bps"] == pytest.approx(2 * eq.predicted_Bps)
    assert m["error_pct"] == pytest.approx(-50.0)
    assert d["decode"]["predicted"]["weights"] == list(eq.weights)
    auto = d["provenance"]["autotune"]
    assert {"budget_s", "trial_s", "rounds_planned", "rounds_done", "stopped_by_budget", "interrupted", "wall_s",
            "solved", "solved_mode", "arms", "trials"} <= set(auto)
    assert auto["solved"]["decode"] == list(plan.decode.weights) and len(auto["trials"]) == 2 * len(a)
    back = plan_from_dict(json.loads(json.dumps(d)))
    assert back == out


def test_plans_without_measurements_load_and_write_as_before():
    old = {"schema": 1, "kind": "plan", "engine": "ds4-argodrive", "created": "2026-11-29T19:00:00Z",
           "sources": [{"name": "a", "path": "/a"}, {"name": "b", "path": "/b"}],
           "prefill": {"weights": [2, 1], "predicted": {}}, "decode": {"weights": [3, 2], "predicted": {}}}
    p = plan_from_dict(old)
    assert p.decode == Phase((3, 2), {}, {})
    assert set(plan_to_dict(p)["decode"]) == {"weights", "predicted"}
    bad = dict(old, decode={"weights": [3, 2], "measured": [1]})
    with pytest.raises(RigError, match="decode.measured"):
        plan_from_dict(bad)


def test_no_complete_round_keeps_the_solved_weights_and_says_so():
    plan, a, _, _ = _measured_run()
    tally = Tally((Trial(1, 0, 1e12, 0.0, 4.0),), 1, True, 4.0)
    out = measured_plan(plan, a, tally, pick(a, tally), {})
    assert out.prefill.weights == plan.prefill.weights and out.decode.weights == plan.decode.weights
    assert out.prefill.measured["picked_by"] == "model" and out.prefill.measured["throughput_Bps"] is None
    cands = out.prefill.measured["candidates"]
    assert out.prefill.measured["runs_Bps"] == [] and cands[1]["runs_Bps"] == [1e12] and cands[1]["measured_Bps"] is None


def test_planner_show_prints_the_measurement_beside_the_prediction(tmp_path):
    from typer.testing import CliRunner

    from planner.cli import app as planner_app
    from planner.plans import save_plan
    from tests.planner.helpers import make_rig

    rig, _ = make_rig(tmp_path / "rig")
    plan, a, tally, picks = _measured_run()
    path = save_plan(rig, measured_plan(plan, a, tally, picks, {"budget_s": 300.0, "trial_s": 4.0}))
    r = CliRunner().invoke(planner_app, ["show", path])
    assert r.exit_code == 0, r.output
    lines = [x.strip() for x in r.stdout.splitlines() if x.strip().startswith("measured ")]
    assert len(lines) == 2 and all("with the split reader (median of 2" in x and "picked by measured" in x for x in lines)
    assert lines[1].endswith("prediction -50.0 %")
