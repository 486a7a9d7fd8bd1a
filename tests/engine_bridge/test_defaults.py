"""Defaults that come from what the tool already knows: export takes the plan's engine and its priced
cache; launch finds a profile by name or 'latest' as plans are found; the planner plans for the
engine that reads the rig's model; the profile's model digest is labelled as what it is."""

import json
import os

from typer.testing import CliRunner

from engine_bridge.cli import app
from planner.cli import app as planner_app
from tests.engine_bridge.export_helpers import make_rig, write_plan
from tests.engine_bridge.test_launch_engine import stand_in
from tests.planner.helpers import make_dir_rig, write_dir_model

runner = CliRunner()


def test_export_needs_no_plan_or_format_the_plan_already_knows(tmp_path):
    root, paths, _ = make_rig(tmp_path, 3)
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    os.makedirs(os.path.join(root, "plans"))
    os.replace(plan, os.path.join(root, "plans", "20261129T190000.000Z.json"))
    r = runner.invoke(app, ["export", "--rig", root, "--cache-experts", "4600", "--no-fallbacks"])
    assert r.exit_code == 0, r.output
    env = r.stdout.splitlines()[0]
    assert env.endswith(".env") and "DS4_ARGODRIVE_REPLICAS" in open(env).read()
    assert "digest" in open(env).read() and "not a file's b3sum" in open(env).read()


def test_launch_finds_a_profile_by_name_or_latest(tmp_path):
    root, paths, _ = make_rig(tmp_path, 3)
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    base = ["export", "--rig", root, "--plan", plan, "--cache-experts", "4600", "--no-fallbacks"]
    assert runner.invoke(app, [*base, "--profile", "p3"]).exit_code == 0
    engine = stand_in(tmp_path)
    for ref in ("p3", "p3.json", "latest"):
        r = runner.invoke(app, ["launch", "--rig", root, "--binary", engine, "--profile", ref, "--out",
                                str(tmp_path / f"run-{ref}"), "--json"])
        assert r.exit_code == 0, (ref, r.output)
        assert json.loads(r.stdout)["profile_file"] == os.path.join(root, "profiles", "p3.json")
    r = runner.invoke(app, ["launch", "--rig", root, "--binary", engine, "--profile", "nope"])
    assert r.exit_code == 3 and "nope: no such profile file" in r.stderr


def test_the_planner_plans_for_the_engine_that_reads_the_rigs_model(tmp_path):
    model = write_dir_model(tmp_path / "m", "glm_moe_dsa", layers=4, experts=16, shards=2)
    rig, _ = make_dir_rig(tmp_path / "rig", model)
    r = runner.invoke(planner_app, ["solve", "--rig", rig.root, "--page-cache", "0", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["engine"] == "colibri"
    r = runner.invoke(planner_app, ["whatif", "--rig", rig.root, "--page-cache", "0", "--remove", "slow"])
    assert r.exit_code == 0, r.output
