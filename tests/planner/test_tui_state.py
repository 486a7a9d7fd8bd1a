"""The tuner's pure state: transitions, predictions from the planner's model, saved plans."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from engines.split import split_read
from planner.cli import app as planner_app
from planner.model import decode_workload, prefill_workload
from planner.plan import Phase, Plan, plan_from_json, plan_to_dict
from planner.plans import load_inputs, load_plan, save_plan
from planner.solve import predict, solve_plan
from planner.tui import state as st
from planner.tui import view
from planner.tui.load import latest_measured, load_tuner, save_tuned, solve_weights
from tests.planner.helpers import FAST, SLOW, make_rig, write_harness_results

PLAN_W = {"prefill": (2, 1, 1), "decode": (5, 3, 2)}


def rig_with_plan(root, weights=PLAN_W):
    """make_rig's three drives and a plan with these weights (as if solved), created at a fixed time."""
    rig, _ = make_rig(root)
    inputs = load_inputs(rig.root)
    plan = Plan(inputs.sources, Phase(weights["prefill"]), Phase(weights["decode"]),
                created="2026-11-29T19:30:00.000Z", provenance=inputs.provenance)
    return rig, save_plan(rig, plan)


@pytest.fixture
def state(tmp_path):
    rig, _ = rig_with_plan(tmp_path / "rig")
    return load_tuner(rig.root)


def test_opening_state_is_the_plan_split_and_predicted_by_the_planner(state):
    assert [s.name for s in state.sources] == ["fast", "slow", "laggy"]
    assert state.phase == "prefill" and state.cursor == 0 and st.changed(state) == ()
    for ph, wl in (("prefill", prefill_workload()), ("decode", decode_workload())):
        v = state.views[ph]
        assert v.weights == PLAN_W[ph]
        assert v.pieces == split_read(0, wl.read_bytes, PLAN_W[ph])
        assert v.prediction == predict(state.drives, PLAN_W[ph], wl)
    # DESIGN §5: a 32 MiB chunk by 2:1:1 is 64/32/32 blocks
    assert [p.blocks for p in state.views["prefill"].pieces] == [64, 32, 32]


def test_nudge_changes_one_weight_of_the_phase_on_screen_and_predicts_again(state):
    s = st.switch_phase(st.move_cursor(state, 2))            # decode, source 2 (laggy)
    t = st.nudge(s, s.cursor, +4)
    assert t.weights("decode") == (5, 3, 6) and t.weights("prefill") == (2, 1, 1)
    assert s.weights("decode") == (5, 3, 2)                  # the old state is untouched
    assert t.views["decode"].prediction == predict(state.drives, (5, 3, 6), decode_workload())
    assert t.views["decode"].pieces == split_read(0, 6_635_520, (5, 3, 6))
    assert st.changed(t) == ("decode",)
    assert st.gain_over_solved(t) == pytest.approx(
        t.views["decode"].prediction.throughput_Bps / s.views["decode"].prediction.throughput_Bps)


def test_nudge_stays_within_1_and_100(state):
    low = st.nudge(state, 1, -50)
    assert low.weights() == (2, 1, 1) and "1..100" in low.message
    high = st.nudge(st.nudge(state, 0, 97), 0, 10)
    assert high.weights() == (100, 1, 1)
    with pytest.raises(ValueError):
        st.nudge(state, 3, 1)


def test_cursor_wraps_and_phase_switches_back(state):
    assert st.move_cursor(state, -1).cursor == 2
    assert st.move_cursor(state, 4).cursor == 1
    assert st.switch_phase(state).phase == "decode"
    assert st.switch_phase(st.switch_phase(state)).phase == "prefill"


def test_reset_returns_the_phase_on_screen_to_the_plan(state):
    t = st.nudge(st.nudge(state, 0, 5), 2, 3)
    t = st.switch_phase(st.nudge(st.switch_phase(t), 1, 1))  # decode changed too
    r = st.reset(t)                                          # resets prefill only
    assert r.views["prefill"] == state.views["prefill"]
    assert r.weights("decode") == (5, 4, 2) and st.changed(r) == ("decode",)


def test_without_a_plan_the_state_waits_for_a_solve_and_keeps_what_the_user_changed(tmp_path):
    rig, _ = make_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, SLOW))
    s = load_tuner(rig.root)
    assert s.solved is None and st.changed(s) == ("prefill", "decode")
    assert "still solving" in st.reset(s).message
    assert st.gain_over_solved(s) is None
    assert s.weights("decode") == (10, 5)                    # rate alone, on a 1..10 scale
    touched = st.nudge(st.switch_phase(s), 1, 1)             # decode changed by the user
    weights = solve_weights(touched)
    done = st.with_solution(touched, weights)
    assert done.solved["prefill"].weights == weights["prefill"] == done.weights("prefill")
    assert done.weights("decode") == touched.weights("decode")
    assert st.reset(done).weights("decode") == weights["decode"]


def test_settings_of_the_plan_make_the_tuner_predict_what_the_plan_predicted(tmp_path):
    rig, _ = make_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, SLOW))
    inputs = load_inputs(rig.root)
    from planner.model import Background
    plan = solve_plan(inputs.sources, inputs.drives, prefill_workload(lanes=4), decode_workload(batch=2, threads=4),
                      (Background(0, "engram"),), provenance=inputs.provenance, top=0)
    save_plan(rig, plan)
    s = load_tuner(rig.root)
    assert s.workloads["prefill"].in_flight == 4 and s.workloads["decode"].threads == 4
    assert s.backgrounds == (Background(0, "engram"),)
    for ph in ("prefill", "decode"):
        assert s.views[ph].prediction.throughput_Bps == pytest.approx(getattr(plan, ph).predicted["throughput_Bps"])


def test_saved_plan_is_the_plan_contract_and_says_it_was_tuned_by_hand(state, tmp_path):
    t = st.nudge(st.switch_phase(state), 1, 2)
    plan = st.tuned_plan(t, created="2026-11-29T20:00:00.000Z")
    back = plan_from_json(json.dumps(plan_to_dict(plan)))
    assert back == plan
    assert back.prefill.weights == (2, 1, 1) and back.decode.weights == (5, 5, 2)
    assert back.decode.predicted["throughput_Bps"] == t.views["decode"].prediction.throughput_Bps
    assert back.provenance["tuned"]["by"] == "hand" and back.provenance["tuned"]["changed"] == ["decode"]
    assert back.provenance["tuned"]["solved"] == {"prefill": [2, 1, 1], "decode": [5, 3, 2]}
    assert back.provenance["bench"] == state.provenance["bench"]
    assert back.baselines["decode"]["gain_over_solved"] == pytest.approx(st.gain_over_solved(t, "decode"))
    path = save_tuned(str(tmp_path / "rig"), t)
    assert os.path.dirname(path) == str(tmp_path / "rig" / "plans")
    assert load_plan(path).decode.weights == (5, 5, 2)
    reopened = load_tuner(str(tmp_path / "rig"))                 # the newest plan is now the tuned one
    assert reopened.plan_name == os.path.basename(path) and reopened.weights("decode") == (5, 5, 2)


def test_view_draws_the_split_and_marks_who_lands_last(state):
    s = st.switch_phase(state)
    rows = view.source_rows(s)
    p = s.views["decode"].prediction
    assert [r.name for r in rows] == ["fast", "slow", "laggy"] and rows[0].selected
    assert [r.nbytes for r in rows] == [f"{x.length:,}" for x in s.views["decode"].pieces]
    assert [r.bar.count("█") for r in rows] == [round(view.BAR * x.length / 6_635_520) for x in s.views["decode"].pieces]
    assert [bool(r.note) for r in rows] == [r.name == p.lands_last for r in rows]
    t = st.nudge(s, 2, 10)
    assert view.source_rows(t)[2].weight == "12 (plan 2)"
    assert [label for label, _ in view.phase_tabs(t)] == ["prefill 2:1:1", "decode 5:3:12 *"]
    assert f"x{st.gain_over_solved(t):.3f}" in view.summary(t)[2]


def test_latest_harness_run_is_shown_next_to_the_prediction(tmp_path):
    rig, _ = rig_with_plan(tmp_path / "rig")
    assert latest_measured(rig.root) == ()
    write_harness_results(tmp_path / "rig" / "runs" / "20261129T194000Z")
    os.makedirs(tmp_path / "rig" / "runs" / "20261129T195000Z")   # newer, but no results: skipped
    m = latest_measured(rig.root)
    assert [(x.arm, x.n, x.tps["prefill"]) for x in m] == [("1drive", 2, 11.0), ("3drives", 1, 25.0)]
    s = load_tuner(rig.root)
    lines = view.measured_lines(s)
    assert "20261129T194000Z" in lines[0] and "prefill" in lines[0]
    assert lines[2].endswith("◀") and "25.00" in lines[2] and not lines[1].endswith("◀")


def test_pure_modules_and_the_planner_cli_do_not_load_textual():
    code = ("import sys, planner.tui.state, planner.tui.view, planner.cli; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'textual']")
    subprocess.run([sys.executable, "-c", code], check=True)


runner = CliRunner()


@pytest.mark.parametrize("setup, expect, code", [
    ("empty", "no iobench results", 3),
    ("other-plan", "is for sources", 2),
    ("missing-plan", "not found", 3),
])
def test_tune_refuses_a_rig_it_cannot_tune_with_one_line(tmp_path, setup, expect, code):
    root = tmp_path / "rig"
    args = ["tune", "--rig", str(root)]
    if setup == "empty":
        os.makedirs(root)
    else:
        rig, _ = make_rig(root)
        if setup == "other-plan":
            two, _ = make_rig(tmp_path / "two", names=("fast", "slow"), models=(FAST, SLOW))
            inputs = load_inputs(two.root)
            args += ["--plan", save_plan(two, Plan(inputs.sources, Phase((1, 1)), Phase((1, 1))))]
        else:
            args += ["--plan", "nope"]
    r = runner.invoke(planner_app, args)
    assert r.exit_code == code, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("planner: error: ") and expect in lines[0]
