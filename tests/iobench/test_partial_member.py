"""A rig with a partial replica through the whole flow (issue: `replicas sync --partial` used to stop
it): iobench reads the partial member in a file it holds, the planner solves with it, and a bench
result made before the partial sync leaves the new member out with a notice instead of refusing."""

import json
import os

from typer.testing import CliRunner

from core.rig import load_rig
from iobench.cli import app as iobench_app
from planner.cli import app as planner_app
from replicas.cli import app as replicas_app
from tests.planner.helpers import write_dir_model

FAST = ["--seconds", "0.05", "--repeat", "2", "--restarts", "1"]
runner = CliRunner()


def invoke(app, *args):
    return runner.invoke(app, [str(a) for a in args])


def partial_rig(tmp_path):
    model = write_dir_model(tmp_path / "m", "glm_moe_dsa", layers=4, experts=16, shards=2, dim=256, ff=256)
    root = tmp_path / "rig"
    base = ["--rig", root, "--piece-size", "64K", "--allow-same-device"]
    for d in ("green", "white"):
        (tmp_path / d).mkdir()
    assert invoke(replicas_app, "sync", *base, model, tmp_path / "green").exit_code == 0
    return str(root), model, base


def test_a_partial_member_is_measured_in_a_file_it_holds_and_planned(tmp_path):
    root, model, base = partial_rig(tmp_path)
    r = invoke(iobench_app, "run", "--rig", root, *FAST, "--json")      # before the partial sync
    assert r.exit_code == 0, r.output
    r = invoke(replicas_app, "sync", *base, "--partial", "50%", model, tmp_path / "white")
    assert r.exit_code == 0, r.output
    white = load_rig(root).replicas[-1]
    assert white.partial and len(white.holds) < len(load_rig(root).files)

    # the old bench result does not know the new member: the plan goes on without it and says so
    r = invoke(planner_app, "solve", "--rig", root, "--engine", "colibri", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    primary = load_rig(root).model.name
    assert [s["name"] for s in d["sources"]] == [primary, "green"]
    assert "replica 'white' is not in the bench result" in r.stderr and f"iobench run --rig {root}" in r.stderr

    # iobench measures it, in a file it holds
    r = invoke(iobench_app, "run", "--rig", root, *FAST, "--json")
    assert r.exit_code == 0, r.output
    drives = {x["name"]: x for x in json.loads(r.stdout)["drives"]}
    assert set(drives) == {primary, "green", "white"}
    rel = os.path.relpath(drives["white"]["path"], white.path)
    assert rel in white.holds and os.path.isfile(drives["white"]["path"])

    # and every planner command takes it
    r = invoke(planner_app, "solve", "--rig", root, "--engine", "colibri", "--json")
    assert r.exit_code == 0, r.output
    assert [s["name"] for s in json.loads(r.stdout)["sources"]] == [primary, "green", "white"]
    r = invoke(planner_app, "whatif", "--rig", root, "--engine", "colibri", "--remove", "green")
    assert r.exit_code == 0, r.output


def test_a_member_given_by_path_keeps_its_name(tmp_path):
    root, model, base = partial_rig(tmp_path)
    r = invoke(replicas_app, "sync", *base, "--partial", "50%", model, tmp_path / "white")
    assert r.exit_code == 0, r.output
    r = invoke(iobench_app, "run", "--rig", root, *FAST, tmp_path / "white" / "m", tmp_path / "green" / "m", "--json")
    assert r.exit_code == 0, r.output
    assert [x["name"] for x in json.loads(r.stdout)["drives"]] == ["white", "green"]


def test_a_scratch_file_inside_the_model_is_refused(tmp_path):
    root, model, _ = partial_rig(tmp_path)
    r = invoke(iobench_app, "scratch", "--rig", root, model, *FAST, "--size", "4M")
    assert r.exit_code == 2 and "inside the source model's folder" in r.stderr, r.output
    assert not any(n.startswith(".") or n.endswith(".bin") for n in os.listdir(model))


def test_autotune_measures_a_rig_with_a_partial_member(tmp_path):
    """The split reader opened every file of the partial member (config.json: no such file)."""
    from engine_bridge.tuning.embedded import autotune

    root, model, base = partial_rig(tmp_path)
    r = invoke(replicas_app, "sync", *base, "--partial", "50%", model, tmp_path / "white")
    assert r.exit_code == 0, r.output
    assert invoke(iobench_app, "run", "--rig", root, *FAST).exit_code == 0
    plan, path = autotune(root, engine="colibri", budget_s=600.0, trial_s=0.02, top=1, rounds=1, warmup_s=0.0,
                          rest_s=0.0)
    assert [s.name for s in plan.sources][-1] == "white"
    assert all(t["Bps"] > 0 for t in plan.provenance["autotune"]["trials"])
