"""The measured tuner's pure logic: candidates, ABBA order, the time budget, the pick, the plan."""

import json

import pytest

from core.errors import RigError
from planner.autotune import (
    Arm,
    Tally,
    Trial,
    abba_order,
    arms_for,
    candidates,
    measured_plan,
    pick,
    rounds_that_fit,
    run_trials,
)
from planner.model import decode_workload, prefill_workload
from planner.plan import Phase, Source, plan_from_dict, plan_from_json, plan_to_dict
from planner.solve import solve_phase, solve_plan
from tests.planner.helpers import drives3


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


def test_arms_for_a_solved_phase():
    s = solve_phase(drives3(), decode_workload())
    a = arms_for(s, top=3)
    assert a[0].weights == s.weights and a[0].roles[0] == "model #1"
    assert a[0].predicted_Bps == pytest.approx(s.prediction.throughput_Bps)
    roles = [r for x in a for r in x.roles]
    assert {"capability", "equal", "model #2", "model #3"} <= set(roles)
    assert len({x.weights for x in a}) == len(a)


MEASURED_KEYS = {"throughput_Bps", "runs_Bps", "n", "spread_pct", "error_pct", "picked_by", "rounds", "candidates"}
CANDIDATE_KEYS = {"weights", "roles", "predicted_Bps", "measured_Bps", "runs_Bps"}


def _measured_run():
    d = drives3()
    plan = solve_plan((Source("fast", "/f"), Source("slow", "/s"), Source("laggy", "/l")), d, prefill_workload(), decode_workload(),
                      provenance={"bench": "b.json"}, created="2026-11-30T10:00:00.000Z")
    sols = {ph: solve_phase(d, wl) for ph, wl in (("prefill", prefill_workload()), ("decode", decode_workload()))}
    a = arms_for(sols["prefill"], 2) + arms_for(sols["decode"], 2)
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
            "solved", "arms", "trials"} <= set(auto)
    assert auto["solved"]["decode"] == list(plan.decode.weights) and len(auto["trials"]) == 2 * len(a)
    back = plan_from_json(json.dumps(d))
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
