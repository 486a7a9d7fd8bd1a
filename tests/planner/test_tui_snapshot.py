"""The tuner's screen (snapshots) and its keys (a Textual pilot)."""

import asyncio

from planner.plans import load_plan
from tests.planner.helpers import FAST, SIZE, SLOW, colibri_tuner_app, no_blink, tuner_app, write_harness_results


def test_snapshot_opening_screen(tmp_path, snap_compare):
    assert snap_compare(tuner_app(tmp_path / "rig"), terminal_size=SIZE, run_before=no_blink)


def test_snapshot_decode_tuned_away_from_the_plan(tmp_path, snap_compare):
    """With the newest harness run's medians under the prediction."""
    write_harness_results(tmp_path / "rig" / "runs" / "20261129T194000Z")
    keys = ["p", "down", "down", "right_square_bracket", "right"]     # decode, laggy +11
    assert snap_compare(tuner_app(tmp_path / "rig"), terminal_size=SIZE, press=keys, run_before=no_blink)


def test_snapshot_colibri_with_its_switches(tmp_path, snap_compare):
    """One weight vector for both phases; the switches line and key; decode at O_DIRECT + stripes."""
    keys = ["p", "o", "down", "right"]                 # decode, direct -> direct+stripe, slow +1
    assert snap_compare(colibri_tuner_app(tmp_path), terminal_size=SIZE, press=keys, run_before=no_blink)


def test_the_switches_key_is_there_only_for_an_engine_with_switches(tmp_path):
    async def keys(app):
        async with app.run_test(size=SIZE) as pilot:
            shown = {b.binding.action for b in app.active_bindings.values() if b.binding.show and b.enabled}
            await pilot.press("o")
            return shown, app.state.mode

    shown, mode = asyncio.run(keys(tuner_app(tmp_path / "rig")))
    assert "switches" not in shown and mode == frozenset()
    shown, mode = asyncio.run(keys(colibri_tuner_app(tmp_path / "c")))
    assert "switches" in shown and mode == frozenset({"direct", "stripe"})


def test_keys_nudge_switch_reset_and_save(tmp_path):
    app = tuner_app(tmp_path / "rig")
    saved = asyncio.run(_nudge_switch_reset_and_save(app))
    plan = load_plan(saved)
    assert (plan.prefill.weights, plan.decode.weights) == ((2, 3, 1), (5, 1, 2))
    assert plan.provenance["tuned"]["by"] == "hand"


async def _nudge_switch_reset_and_save(app):
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "right", "right")
        assert app.state.weights("prefill") == (2, 3, 1) and app.state.cursor == 1
        await pilot.press("p", "left_square_bracket")
        assert app.state.phase == "decode" and app.state.weights("decode") == (5, 1, 2)
        await pilot.press("s")
        saved = app.state.message.removeprefix("saved ")
        assert app.state.message.startswith("saved ")
        await pilot.press("r")
        assert app.state.weights("decode") == (5, 3, 2) and app.state.weights("prefill") == (2, 3, 1)
    return saved


def test_without_a_plan_the_app_solves_in_a_worker(tmp_path):
    app = tuner_app(tmp_path / "rig", plan=False, names=("fast", "slow"), models=(FAST, SLOW))
    asyncio.run(_solve_in_worker(app))


async def _solve_in_worker(app):
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.state.solved is not None and app.state.message.startswith("solved: ")
        await pilot.press("right", "r")
        assert app.state.weights("prefill") == app.state.solved["prefill"].weights


def test_snapshot_at_80x24(tmp_path, snap_compare):
    """A new user's terminal: no header or cell cut to '…', and the footer keeps `save` and `quit`."""
    assert snap_compare(tuner_app(tmp_path / "rig"), terminal_size=(80, 24), run_before=no_blink)


def test_at_80x24_nothing_is_cut_and_quit_shows(tmp_path):
    async def screen(app):
        async with app.run_test(size=(80, 24)) as pilot:
            await no_blink(pilot)
            await pilot.pause()
            return app.export_screenshot()

    svg = asyncio.run(screen(tuner_app(tmp_path / "rig")))
    assert "…" not in svg
    for word in ("src", "share", "busy", "save", "quit"):
        assert f">{word}" in svg or f"&#160;{word}" in svg or word in svg, word
