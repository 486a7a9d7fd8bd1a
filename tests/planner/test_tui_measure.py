"""The tuner's measuring key: trials beside predictions in the pure state, the view and the app."""

import asyncio

import pytest

from planner.plans import load_plan
from planner.tui import state as st
from planner.tui import view
from planner.tui.app import NO_MEASURE, TunerApp
from planner.tui.load import load_tuner, save_tuned, solve_weights
from tests.planner.helpers import SIZE, colibri_tuner_app, no_blink, tuner_app

MEASURED = 123.4e6


@pytest.fixture
def state(tmp_path):
    tuner_app(tmp_path / "rig")                       # writes the rig and its plan
    return load_tuner(str(tmp_path / "rig"))


def test_trials_are_kept_per_phase_and_weights_with_their_median(state):
    s = st.start_trial(state)
    assert s.measuring and s.message == "measuring prefill 2:1:1 …"
    s = st.with_trial(s, "prefill", (2, 1, 1), 100e6)
    s = st.with_trial(st.start_trial(s), "prefill", (2, 1, 1), 140e6)
    s = st.with_trial(s, "prefill", (1, 1, 1), 90e6)
    s = st.with_trial(s, "decode", (5, 3, 2), 10e6)
    assert not s.measuring
    rows = st.trial_summary(s, "prefill")
    assert [(w, m, med, n) for w, m, med, n, _ in rows] == [((2, 1, 1), frozenset(), 120e6, 2),
                                                            ((1, 1, 1), frozenset(), 90e6, 1)]
    assert rows[0][4] == s.views["prefill"].prediction["throughput_Bps"]
    assert rows[1][4] == st.set_weights(s, (1, 1, 1)).views["prefill"].prediction["throughput_Bps"]
    failed = st.with_trial(st.start_trial(s), "decode", (5, 3, 2), None, "measuring failed: gone")
    assert failed.trials == s.trials and failed.message == "measuring failed: gone" and not failed.measuring


def test_view_shows_measured_beside_predicted_for_the_phase_on_screen(state):
    assert view.trial_lines(state) == []
    s = st.with_trial(state, "prefill", (2, 1, 1), 100e6)
    pred = s.views["prefill"].prediction["throughput_Bps"]
    lines = view.trial_lines(s)
    assert lines[0].startswith("measured here") and "2:1:1" in lines[1] and lines[1].endswith("◀")
    assert f"prediction {100 * (pred / 100e6 - 1):+.1f} %" in lines[1]
    assert view.trial_lines(st.switch_phase(s)) == []


def test_a_saved_plan_keeps_the_trials_of_its_weights(state, tmp_path):
    s = st.with_trial(st.with_trial(state, "prefill", (2, 1, 1), 100e6), "prefill", (2, 1, 1), 110e6)
    s = st.with_trial(s, "prefill", (1, 1, 1), 50e6)
    plan = load_plan(save_tuned(str(tmp_path / "rig"), s))
    m = plan.prefill.measured
    assert m["throughput_Bps"] == 105e6 and m["runs_Bps"] == [100e6, 110e6] and m["picked_by"] == "hand"
    assert [c["weights"] for c in m["candidates"]] == [[2, 1, 1], [1, 1, 1]]
    assert plan.decode.measured == {}


def _app(tmp_path, measure):
    tuner_app(tmp_path / "rig")
    root = str(tmp_path / "rig")
    return TunerApp(load_tuner(root), save=lambda s: save_tuned(root, s), solve=solve_weights, subtitle="rig",
                    measure=measure)


def test_m_measures_the_weights_on_screen_in_a_worker(tmp_path):
    seen = []

    def measure(s):
        # what engine_bridge's measurer builds its reads from
        seen.append((s.phase, s.weights(), s.mode, s.problem.engine.name, [x.name for x in s.sources]))
        return MEASURED

    app = _app(tmp_path, measure)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("p", "m")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert seen == [("decode", (5, 3, 2), frozenset(), "ds4-argodrive", ["fast", "slow", "laggy"])]
            assert app.state.trials == (st.TrialRun("decode", (5, 3, 2), MEASURED),)
            assert app.state.message == "measured decode 5:3:2"
    asyncio.run(go())


def test_colibri_trials_are_kept_with_their_switches(tmp_path):
    seen = []

    def measure(s):
        seen.append((s.phase, s.weights(), s.mode))
        return MEASURED if "stripe" in s.mode else MEASURED / 2

    app = colibri_tuner_app(tmp_path, measure=measure)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("m")
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.press("o", "m")                           # direct -> direct+stripe, measured again
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert seen == [("prefill", (2, 1, 1), frozenset({"direct"})),
                            ("prefill", (2, 1, 1), frozenset({"direct", "stripe"}))]
            rows = st.trial_summary(app.state)
            assert [(m, med) for _, m, med, _, _ in rows] == [(frozenset({"direct"}), MEASURED / 2),
                                                              (frozenset({"direct", "stripe"}), MEASURED)]
            lines = view.trial_lines(app.state)
            assert "2:1:1 direct " in lines[1] and lines[2].endswith("◀") and "2:1:1 direct+stripe" in lines[2]
    asyncio.run(go())


def test_m_without_a_measurer_says_where_measuring_is(tmp_path):
    app = _app(tmp_path, None)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("m")
            assert app.state.message == NO_MEASURE and app.state.trials == ()
    asyncio.run(go())


def test_a_failing_measurement_is_a_message_not_a_crash(tmp_path):
    def measure(s):
        raise OSError("the drive went away")

    app = _app(tmp_path, measure)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("m")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.state.message == "measuring failed: the drive went away" and not app.state.measuring
    asyncio.run(go())


def test_snapshot_measured_beside_predicted(tmp_path, snap_compare):
    async def measure_then_wait(pilot):
        await no_blink(pilot)
        await pilot.press("m")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(_app(tmp_path, lambda s: MEASURED), terminal_size=SIZE, run_before=measure_then_wait)
