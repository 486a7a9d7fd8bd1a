"""The tuner's pure state: transitions, predictions from the one pricing, saved plans; for an engine
that cuts reads per phase (ds4-argodrive) and one with one weight vector and switches (colibri)."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from engines.registry import get_engine
from planner.cli import app as planner_app
from planner.drivecurves import Background
from planner.plan import Phase, Plan, plan_from_dict, plan_to_dict
from planner.plans import load_inputs, load_plan, save_plan
from planner.rigmodel import choose_workload, rig_problem
from planner.solve import Pricer, capability_weights, predict
from planner.tui import state as st
from planner.tui import view
from planner.tui.load import latest_measured, load_tuner, save_tuned, solve_weights
from tests.helpers import impure_imports
from tests.planner.helpers import (
    FAST,
    LAGGY,
    SLOW,
    colibri_tuner_rig,
    make_rig,
    tuner_rig,
    write_harness_results,
)

PLAN_W = {"prefill": (2, 1, 1), "decode": (5, 3, 2)}
runner = CliRunner()


def invoke(*args):
    return runner.invoke(planner_app, [str(a) for a in args])


def rig_with_plan(root, weights=PLAN_W):
    """tuner_rig's three drives and small model, and a plan with these weights (as if solved),
    created at a fixed time."""
    rig, _ = tuner_rig(root)
    inputs = load_inputs(rig.root)
    plan = Plan(inputs.sources, Phase(weights["prefill"]), Phase(weights["decode"]),
                created="2026-11-29T19:30:00.000Z", provenance=inputs.provenance)
    return rig, save_plan(rig, plan)


@pytest.fixture
def state(tmp_path):
    rig, _ = rig_with_plan(tmp_path / "rig")
    return load_tuner(rig.root)


def test_the_pure_modules_are_pure_and_the_planner_cli_does_not_load_textual():
    assert impure_imports(st) == [] and impure_imports(view) == []
    code = ("import sys, planner.tui.state, planner.tui.view, planner.cli; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'textual']")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_opening_state_is_the_plan_priced_as_planner_solve_prices_it(state, tmp_path):
    root = str(tmp_path / "rig")
    assert [s.name for s in state.sources] == ["fast", "slow", "laggy"]
    assert state.phase == "prefill" and state.cursor == 0 and st.changed(state) == () and state.mode == frozenset()
    # the problem planner solve would build: the engine, the rig's own model, its drives
    inputs = load_inputs(root)
    problem = rig_problem(inputs, choose_workload(root, "ds4-argodrive"), get_engine("ds4-argodrive"))
    assert state.engine.name == "ds4-argodrive" and state.problem.geometry.layers == 6
    assert state.problem.phases == problem.phases and state.problem.drives == problem.drives
    for ph in ("prefill", "decode"):
        v = state.views[ph]
        assert v.weights == PLAN_W[ph] and v.mode == frozenset()
        assert v.prediction == predict(problem, ph, PLAN_W[ph])
    assert view.engine_lines(state) == ["ds4-argodrive · fast.gguf: 6 layers x 32 experts, 4 per token"]


def test_nudge_changes_one_weight_of_the_phase_on_screen_and_predicts_again(state):
    s = st.switch_phase(st.move_cursor(state, 2))            # decode, source 2 (laggy)
    t = st.nudge(s, s.cursor, +4)
    assert t.weights("decode") == (5, 3, 6) and t.weights("prefill") == (2, 1, 1)
    assert s.weights("decode") == (5, 3, 2)                  # the old state is untouched
    assert t.views["decode"].prediction == predict(state.problem, "decode", (5, 3, 6))
    assert st.changed(t) == ("decode",)
    assert st.gain_over_solved(t) == pytest.approx(
        s.views["decode"].prediction["seconds"] / t.views["decode"].prediction["seconds"])


def test_nudge_stays_within_the_weights_the_engine_accepts(state):
    low = st.nudge(state, 1, -50)
    assert low.weights() == (2, 1, 1) and "1..100" in low.message
    high = st.nudge(st.nudge(state, 0, 97), 0, 10)
    assert high.weights() == (100, 1, 1)
    with pytest.raises(ValueError):
        st.nudge(state, 3, 1)


def test_an_engine_without_switches_says_so(state):
    assert state.modes == (frozenset(),)
    assert st.next_mode(state).message == "ds4-argodrive has no switches that change its reads of this model"
    assert st.next_mode(state).views == state.views


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
    rig, _ = tuner_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, SLOW))
    s = load_tuner(rig.root)
    assert s.solved is None and st.changed(s) == ("prefill", "decode")
    assert "still solving" in st.reset(s).message
    assert st.gain_over_solved(s) is None
    # the drives' rates alone at an equal split's reads, on a 1..10 scale
    assert s.weights("decode") == capability_weights(Pricer(s.problem), "decode", scale=10) == (10, 5)
    touched = st.nudge(st.switch_phase(s), 1, 1)             # decode changed by the user
    solution = solve_weights(touched)
    done = st.with_solution(touched, solution)
    assert done.solved["prefill"].weights == solution.weights["prefill"] == done.weights("prefill")
    assert done.weights("decode") == touched.weights("decode")
    assert st.reset(done).weights("decode") == solution.weights["decode"]
    untouched = st.with_solution(s, solution)                # nothing changed: the screen moves to it
    assert st.changed(untouched) == () and untouched.message.startswith("solved: prefill ")


def test_a_plan_is_priced_again_as_it_was_solved(tmp_path):
    """Its background work and reads in flight come from the plan's provenance."""
    rig, _ = tuner_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, SLOW))
    r = invoke("solve", "--rig", rig.root, "--background", "primary:engram", "--lanes", "4", "--threads", "4",
               "--top", "0", "--json")
    assert r.exit_code == 0, r.output
    plan = load_plan(json.loads(r.stdout)["path"])
    s = load_tuner(rig.root)
    assert s.problem.backgrounds == (Background(0, "engram"),)
    assert s.engine.concurrency("prefill").per_source == 4 and s.engine.concurrency("decode").shared == 4
    for ph in ("prefill", "decode"):
        assert s.views[ph].prediction == pytest.approx(getattr(plan, ph).predicted)


def test_saved_plan_is_the_plan_contract_and_says_it_was_tuned_by_hand(state, tmp_path):
    t = st.nudge(st.switch_phase(state), 1, 2)
    plan = st.tuned_plan(t, created="2026-11-29T20:00:00.000Z")
    back = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    assert back == plan
    assert back.prefill.weights == (2, 1, 1) and back.decode.weights == (5, 5, 2)
    assert back.decode.predicted == t.views["decode"].prediction
    assert back.provenance["tuned"]["by"] == "hand" and back.provenance["tuned"]["changed"] == ["decode"]
    assert back.provenance["tuned"]["solved"] == {"prefill": [2, 1, 1], "decode": [5, 3, 2]}
    assert back.provenance["bench"] == state.provenance["bench"]
    assert back.provenance["model"]["concurrency"]["decode"] == {"per_source": None, "shared": 9}
    assert back.baselines["decode"]["gain_over_solved"] == pytest.approx(st.gain_over_solved(t, "decode"))
    assert back.workload["name"] == "model" and back.geometry["layers"] == 6
    path = save_tuned(str(tmp_path / "rig"), t)
    assert os.path.dirname(path) == str(tmp_path / "rig" / "plans")
    assert load_plan(path).decode.weights == (5, 5, 2)
    reopened = load_tuner(str(tmp_path / "rig"))                 # the newest plan is now the tuned one
    assert reopened.plan_name == os.path.basename(path) and reopened.weights("decode") == (5, 5, 2)
    assert reopened.views["decode"].prediction == t.views["decode"].prediction


def test_view_shows_the_prediction_per_source_and_who_lands_last(state):
    s = st.switch_phase(state)
    rows = view.source_rows(s)
    p = s.views["decode"].prediction
    assert [r.name for r in rows] == ["fast", "slow", "laggy"] and rows[0].selected
    assert [r.nbytes for r in rows] == [f"{x['bytes']:,.0f}" for x in p["sources"]]
    assert [r.experts for r in rows] == [f"{x['experts']:.2f}" for x in p["sources"]]
    assert [r.busy_ms for r in rows] == [f"{x['time_s'] * 1e3:.3f}" for x in p["sources"]]
    total = sum(x["bytes"] for x in p["sources"])
    assert [r.bar.count("█") for r in rows] == [round(view.BAR * x["bytes"] / total) for x in p["sources"]]
    assert [r.note.startswith("lands last +") for r in rows] == [r.name == p["lands_last"] for r in rows]
    t = st.nudge(s, 2, 10)
    assert view.source_rows(t)[2].weight == "12 (plan 2)"
    assert [label for label, _ in view.phase_tabs(t)] == ["prefill 2:1:1", "decode 5:3:12 *"]
    assert f"x{st.gain_over_solved(t):.3f}" in view.summary(t)[-1]
    assert view.table_title(s).startswith("decode at 5:3:2, per layer: ")


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


def test_a_rig_whose_model_cannot_be_read_is_tuned_on_the_named_workload_and_says_so(tmp_path):
    rig, _ = make_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, SLOW))    # no model files
    s = load_tuner(rig.root)
    assert s.message.startswith("notice: the rig's model") and s.workload["name"] == "ds4-v41"
    assert s.problem.geometry.layers == 40 and view.engine_lines(s)[0].startswith("ds4-argodrive · ds4-v41: 40 layers")


# ---- an engine with one weight vector for both phases, and switches ------------------------------

@pytest.fixture
def colibri(tmp_path):
    rig = colibri_tuner_rig(tmp_path)
    return rig, load_tuner(rig.root)


def test_a_colibri_plan_opens_with_its_weights_and_switches(colibri):
    rig, s = colibri
    plan = load_plan(os.path.join(rig.plans_dir, s.plan_name))
    assert s.engine.name == "colibri" and s.mode == frozenset({"direct"}) == s.solved_mode
    assert s.modes == (frozenset(), frozenset({"direct"}), frozenset({"direct", "stripe"}))
    for ph in ("prefill", "decode"):
        assert s.weights(ph) == plan.prefill.weights == (2, 1, 1)
        assert s.views[ph].prediction == predict(s.problem, ph, (2, 1, 1), frozenset({"direct"}))
        assert s.views[ph].prediction["switches"] == ["direct"]
    assert view.engine_lines(s) == ["colibri · glm: 4 layers x 16 experts, 4 per token · one weight vector for both phases",
                                    "switches: direct (o cycles none, direct, direct+stripe)"]


def test_colibri_weights_move_both_phases_together(colibri):
    _, s = colibri
    t = st.nudge(st.switch_phase(s), 1, 3)
    assert t.weights("prefill") == t.weights("decode") == (2, 4, 1)
    assert st.changed(t) == ("prefill", "decode")
    assert t.views["prefill"].prediction == predict(s.problem, "prefill", (2, 4, 1), frozenset({"direct"}))
    r = st.reset(t)
    assert r.views == s.views and st.changed(r) == ()


def test_colibri_switches_cycle_through_the_engines_modes_and_reset_restores_them(colibri):
    _, s = colibri
    seen = []
    t = s
    for _ in range(3):
        t = st.next_mode(t)
        seen.append(t.mode)
        for ph in ("prefill", "decode"):
            assert t.views[ph].mode == t.mode
            assert t.views[ph].prediction == predict(s.problem, ph, (2, 1, 1), t.mode)
    assert seen == [frozenset({"direct", "stripe"}), frozenset(), frozenset({"direct"})]
    striped = st.next_mode(s)
    assert st.changed(striped) == ("prefill", "decode") and striped.message == "switches: direct+stripe"
    assert st.reset(striped).mode == frozenset({"direct"}) and st.reset(striped).views == s.views


def test_a_tuned_colibri_plan_keeps_its_switches(colibri):
    rig, s = colibri
    t = st.nudge(st.next_mode(st.next_mode(s)), 0, 1)          # no switches, 3:1:1
    path = save_tuned(rig.root, t)
    plan = load_plan(path)
    assert plan.engine == "colibri" and plan.switches == frozenset()
    assert plan.prefill.weights == plan.decode.weights == (3, 1, 1)
    assert plan.provenance["tuned"]["solved_switches"] == ["direct"]
    again = load_tuner(rig.root)
    assert again.mode == frozenset() and again.views == t.views


def test_a_colibri_solution_moves_both_phases_and_the_switches_unless_the_user_changed_them(colibri):
    _, s = colibri
    sol = st.Solution({"prefill": (1, 1, 1), "decode": (1, 1, 1)}, frozenset())
    kept = st.with_solution(st.nudge(s, 0, 1), sol)            # the user changed the weights: they stay
    assert kept.weights("prefill") == kept.weights("decode") == (3, 1, 1) and kept.mode == frozenset({"direct"})
    assert kept.solved["decode"].weights == (1, 1, 1) and kept.solved_mode == frozenset()
    assert st.changed(kept) == ("prefill", "decode")
    assert st.reset(kept).mode == frozenset() and st.reset(kept).weights("decode") == (1, 1, 1)


# ---- refusals -----------------------------------------------------------------------------------

@pytest.mark.parametrize("setup, expect, code", [
    ("empty", "no iobench results", 3),
    ("other-plan", "is for sources", 2),
    ("missing-plan", "nope: no such plan file", 3),
    ("unknown-engine", "engine 'nope' is not known", 2),
    ("plan-of-another-engine", "is for ds4-argodrive, not colibri", 2),
])
def test_tune_refuses_a_rig_it_cannot_tune_with_one_line(tmp_path, setup, expect, code):
    root = tmp_path / "rig"
    args = ["tune", "--rig", str(root)]
    if setup == "empty":
        os.makedirs(root)
    else:
        rig, _ = rig_with_plan(root)
        if setup == "other-plan":
            two, _ = make_rig(tmp_path / "two", names=("fast", "slow"), models=(FAST, SLOW))
            inputs = load_inputs(two.root)
            args += ["--plan", save_plan(two, Plan(inputs.sources, Phase((1, 1)), Phase((1, 1))))]
        elif setup == "missing-plan":
            args += ["--plan", "nope"]
        elif setup == "unknown-engine":
            args += ["--engine", "nope"]
        else:
            args += ["--plan", "latest", "--engine", "colibri"]
    r = runner.invoke(planner_app, args)
    assert r.exit_code == code, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("planner: error: ") and expect in lines[0]


def test_engine_picks_the_newest_plan_for_it(tmp_path):
    rig, _ = rig_with_plan(tmp_path / "rig")
    inputs = load_inputs(rig.root)
    save_plan(rig, Plan(inputs.sources, Phase((1, 2, 3)), Phase((1, 2, 3)), engine="colibri",
                        created="2026-11-29T19:40:00.000Z", provenance=inputs.provenance))
    with pytest.raises(UsageError, match="--engine ds4-argodrive"):
        load_tuner(rig.root)                        # the newest plan is colibri's, which cannot read this GGUF
    ds4 = load_tuner(rig.root, engine="ds4-argodrive")
    assert ds4.engine.name == "ds4-argodrive" and ds4.plan_name == "20261129T193000.000Z.json"
    assert ds4.weights("decode") == PLAN_W["decode"]


def test_tuning_colibri_on_a_gguf_rig_is_refused_naming_the_engine_that_reads_it(tmp_path):
    rig, _ = tuner_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, LAGGY))
    r = runner.invoke(planner_app, ["tune", "--rig", rig.root, "--engine", "colibri"])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "--engine ds4-argodrive" in lines[0]


@pytest.mark.parametrize("module", ["planner.cli", "engine_bridge.cli"])
def test_the_tuner_without_a_terminal_says_so_and_exits_2_instead_of_drawing(tmp_path, module):
    """`planner tune </dev/null | cat` (and engine-bridge's) wrote escape codes until killed: with
    no terminal on either side it is one line and exit 2, and no screen is drawn."""
    rig, _ = rig_with_plan(tmp_path / "rig")
    r = subprocess.run([sys.executable, "-m", module, "tune", "--rig", rig.root], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "\x1b" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "needs a terminal" in lines[0] and "planner solve" in lines[0]
