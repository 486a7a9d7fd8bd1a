"""A third engine, defined only in the tests (tests/engines/toy_engine.py: its own read pattern and a
switch of its own, `halves`), goes through every stage without a change to any file outside
engines/: the contract test holds it to its read pattern (tests/engines/test_contract.py), and here
`planner solve`, `planner simulate`, the tuner's state and `engine-bridge export --format json`
take it, each asking the engine, never naming it."""

import json
from dataclasses import replace

from typer.testing import CliRunner

from engine_bridge.cli import app as bridge_app
from planner.cli import app as planner_app
from planner.plans import latest_plan_path, load_plan, save_plan
from planner.tui import state as st
from planner.tui.load import load_tuner
from tests.engines import toy_engine
from tests.planner.helpers import tuner_rig, write_small_gguf

runner = CliRunner()


def rig_with_copies(tmp_path):
    """tuner_rig's three drives, each holding a copy of the rig's small GGUF model."""
    rig, _ = tuner_rig(tmp_path / "rig")
    for m in rig.replicas:
        write_small_gguf(m.path)    # the same header-only bytes again: a copy stays sparse (3.8 GB apparent each)
    return rig


def planner(*args):
    return runner.invoke(planner_app, list(args))


def export_json(rig, plan, out):
    return runner.invoke(bridge_app, ["export", "--rig", rig.root, "--plan", plan, "--format", "json", "-o", out,
                                      "--allow-unverified", "--no-fallbacks"])


def test_a_third_engine_defined_in_the_tests_goes_through_every_stage(tmp_path):
    rig = rig_with_copies(tmp_path)
    with toy_engine.registered():
        # planner solve: the engine's grid and both of its switch settings are searched
        r = planner("solve", "--rig", rig.root, "--engine", "toy", "--json")
        assert r.exit_code == 0, r.output
        solved = json.loads(r.stdout)
        assert solved["engine"] == "toy" and solved["schema"] == 3
        assert set(solved["switches"]) <= {toy_engine.HALVES}
        assert set(solved["provenance"]["model"]["scores"]) == {"default", toy_engine.HALVES}
        assert solved["prefill"]["weights"] == solved["decode"]["weights"]          # one vector for both phases
        assert all(1 <= w <= toy_engine.WEIGHT_MAX for w in solved["prefill"]["weights"])

        # planner simulate: its own switch priced, a switch it lacks refused by its own declaration
        base = ["simulate", "--rig", rig.root, "--engine", "toy", "--phase", "decode", "--weights", "2:1:1", "--json"]
        whole, halves = (json.loads(planner(*base, *extra).stdout) for extra in ((), ("--switch", "halves")))
        assert whole["switches"] == [] and halves["switches"] == ["halves"]
        assert sum(s["bytes"] for s in whole["sources"]) == sum(s["bytes"] for s in halves["sources"])
        assert sum(s["pieces"] for s in halves["sources"]) > sum(s["pieces"] for s in whole["sources"])
        bad = planner(*base, "--switch", "direct")
        assert bad.exit_code == 2 and "--switch direct: toy has the switches halves" in bad.output

        # the tuner's state: the plan's switches, cycled through the engine's modes, saved as a plan
        state = load_tuner(rig.root)
        assert state.engine.name == "toy" and state.modes == (frozenset(), frozenset({"halves"}))
        assert state.mode == frozenset(solved["switches"])
        other = st.next_mode(state)
        assert other.mode != state.mode and other.message == f"switches: {st.mode_text(other.mode)}"
        halved = other if other.mode else st.next_mode(other)
        tuned = st.tuned_plan(halved)
        assert tuned.engine == "toy" and tuned.switches == frozenset({"halves"})
        path = save_plan(rig, tuned)
        back = load_plan(path)
        assert back == replace(tuned, created=back.created) and latest_plan_path(rig) == path

        # engine-bridge export --format json: the engine's profile gives the environment
        out = str(tmp_path / "toy.json")
        r = export_json(rig, path, out)
        assert r.exit_code == 0, r.output
        doc = json.load(open(out))
        assert doc["engine"] == "toy" and doc["plan"]["switches"] == ["halves"]
        w = tuned.prefill.weights
        assert doc["environment"] == {
            "TOY_SOURCES": ",".join(f"{m.path}*{x}" for m, x in zip(rig.members, w)), "TOY_HALVES": "1"}
        r = export_json(rig, solved["path"], str(tmp_path / "solved.json"))
        assert r.exit_code == 0, r.output
        assert ("TOY_HALVES" in json.load(open(tmp_path / "solved.json"))["environment"]) == bool(solved["switches"])
    # gone with the block
    r = planner("solve", "--rig", rig.root, "--engine", "toy")
    assert r.exit_code == 2 and "engine 'toy' is not known" in r.output
