"""N-1 profiles: export writes, beside the chosen profile, the plan re-solved without each drive,
and launch refuses a profile whose source is gone, naming the N-1 profile to use."""

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from core.errors import MissingError
from engine_bridge.cli import app as bridge
from engine_bridge.profiles.export import export_profile, load_profile
from engine_bridge.profiles.launch import fallback_for, launch_arm
from planner.cli import app as planner
from tests.planner.helpers import FAST, SLOW, make_dir_rig, write_dir_model

runner = CliRunner()


DRIVES = ("internal", "green")


@pytest.fixture
def solved(tmp_path):
    """A colibri directory rig (a small MoE in safetensors shards) of two drives with fitted drive
    models, and a plan solved for it."""
    model = write_dir_model(tmp_path / "m", "glm_moe_dsa", layers=2, experts=8, shards=2)
    rig, _ = make_dir_rig(tmp_path / "rig", model, names=DRIVES, models=(FAST, SLOW))
    r = runner.invoke(planner, ["solve", "--rig", rig.root, "--engine", "colibri", "--cache-experts", "0",
                                "--page-cache", "0", "--json"])
    assert r.exit_code == 0, r.output
    return rig.root, [m.path for m in rig.members], json.loads(r.stdout)["path"]


def test_export_writes_one_profile_per_drive_that_could_fail(solved, tmp_path):
    root, dirs, plan = solved
    notices = []
    res = export_profile(rig_root=root, plan_path=plan, fmt="colibri", name="p", allow_unverified=True,
                         report=notices.append)
    assert [d for d, _ in res.fallbacks] == list(DRIVES) and not res.skipped
    assert [n.message for n in notices] == [f"re-solving the plan without {d} ({i + 1} of 2)" for i, d in enumerate(DRIVES)]
    listed = res.profile.provenance["fallbacks"]
    for drive, path in res.fallbacks:
        assert os.path.isfile(path) and os.path.isfile(path[:-5] + ".env")
        assert os.path.basename(path) == listed[drive]["profile"] == f"p.without-{drive}.json"
        p = load_profile(path)
        gone = dirs[DRIVES.index(drive)]
        assert p.sources == 1 and gone not in [p.primary, *p.replicas]            # the plan re-solved without it
        assert p.provenance["without"] == drive and "COLI_MODEL_MIRROR" in p.unset
    assert load_profile(res.files[-1]).provenance["fallbacks"] == listed          # the chosen one lists them
    r = runner.invoke(bridge, ["export", "--rig", root, "--plan", plan, "--format", "colibri", "--profile", "q",
                               "--allow-unverified", "--no-fallbacks"])
    assert r.exit_code == 0 and not [f for f in os.listdir(os.path.join(root, "profiles")) if f.startswith("q.without")]
    assert "re-solving" not in r.stderr
    r = runner.invoke(bridge, ["export", "--rig", root, "--plan", plan, "--format", "colibri", "--profile", "r",
                               "--allow-unverified"])
    assert r.exit_code == 0 and "export: re-solving the plan without green (2 of 2)" in r.stderr


def test_launch_names_the_n_minus_1_profile_when_a_drive_is_gone(solved, tmp_path):
    root, dirs, plan = solved
    res = export_profile(rig_root=root, plan_path=plan, fmt="colibri", name="p", allow_unverified=True)
    main = res.files[-1]
    assert fallback_for(load_profile(main), main) == ""
    shutil.move(dirs[1], str(tmp_path / "unplugged"))                             # green's drive is gone
    why = fallback_for(load_profile(main), main)
    assert f"--profile {os.path.join(os.path.dirname(main), 'p.without-green.json')}" in why
    with pytest.raises(MissingError, match="p.without-green.json"):
        launch_arm("/bin/true", main)
    r = runner.invoke(bridge, ["launch", "--binary", "/bin/true", "--profile", main, "--rig", root])
    assert r.exit_code == 3 and "p.without-green.json" in r.output
    fallback = os.path.join(os.path.dirname(main), "p.without-green.json")
    assert fallback_for(load_profile(fallback), fallback) == ""                  # that one starts
    shutil.move(dirs[0], str(tmp_path / "unplugged2"))                            # both gone: no N-1 profile covers it
    assert "no N-1 profile covers this" in fallback_for(load_profile(main), main)
