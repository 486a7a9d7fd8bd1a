"""A file the user named is never overwritten or appended to unless the tool wrote it, and a place
that cannot be written fails before the work (core.fsutil.check_output): standin, export -o and
the default profile names, run/replay --csv and --trace-out."""

import os

import pytest
from typer.testing import CliRunner

from engine_bridge.cli import app
from tests.engine_bridge.export_helpers import make_rig, write_plan

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def refused(r, code, *words):
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1, r.output
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_standin_replaces_only_its_own_stand_in(tmp_path):
    mine = tmp_path / "my-engine"
    mine.write_text("#!/bin/sh\necho my real engine\n")
    refused(invoke("standin", mine, "--engine", "ds4-argodrive"), 2, "exists and was not written by replica-tuner",
            "--force")
    assert mine.read_text() == "#!/bin/sh\necho my real engine\n"
    link = tmp_path / "link"
    os.symlink(mine, link)                              # a link to a real binary: the link is not ours either
    refused(invoke("standin", link, "--engine", "ds4-argodrive"), 2, "exists")
    assert os.path.islink(link)
    ours = tmp_path / "standin"
    assert invoke("standin", ours, "--engine", "ds4-argodrive").exit_code == 0
    assert invoke("standin", ours, "--engine", "colibri").exit_code == 0          # its own: replaced
    assert invoke("standin", mine, "--engine", "colibri", "--force").exit_code == 0
    refused(invoke("standin", tmp_path / "nope" / "s", "--engine", "colibri"), 3, "does not exist")
    assert not (tmp_path / "nope").exists()


def test_export_never_writes_over_a_users_file(tmp_path):
    root, paths, _ = make_rig(tmp_path, 3)
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    base = ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive", "--cache-experts", "4600"]
    notes = tmp_path / "notes.env"
    notes.write_text("my notes\n")
    refused(invoke(*base, "-o", notes), 2, str(notes), "not written by replica-tuner")
    assert notes.read_text() == "my notes\n" and not (tmp_path / "notes.json").exists()
    (tmp_path / "p.json").write_text("{}\n")        # the JSON companion a user already has: refused too
    refused(invoke(*base, "-o", tmp_path / "p.env"), 2, str(tmp_path / "p.json"))
    assert not (tmp_path / "p.env").exists()
    os.makedirs(os.path.join(root, "profiles"))
    hand = os.path.join(root, "profiles", "mine.env")
    with open(hand, "w") as f:
        f.write("export X=1\n")
    refused(invoke(*base, "--profile", "mine"), 2, hand)
    assert open(hand).read() == "export X=1\n"
    r = invoke(*base, "-o", tmp_path / "ok.env")
    assert r.exit_code == 0, r.output
    assert invoke(*base, "-o", tmp_path / "ok.env").exit_code == 0                 # its own: replaced


@pytest.mark.parametrize("command", ["run", "replay"])
def test_run_outputs_are_checked_before_the_run(tmp_path, command):
    """No rig, no model: the output check comes first, so nothing runs for minutes and then fails."""
    refused(invoke(command, "--rig", tmp_path / "rig", "--csv", tmp_path / "nope" / "x.csv"), 3, "x.csv",
            "does not exist")
    readme = tmp_path / "README.md"
    readme.write_text("# my notes\n")
    refused(invoke(command, "--rig", tmp_path / "rig", "--csv", readme), 2, "not written by replica-tuner")
    assert readme.read_text() == "# my notes\n"
    if command == "run":
        refused(invoke(command, "--rig", tmp_path / "rig", "--trace-out", readme), 2, "--trace-out")


def exported_p3(tmp_path) -> str:
    """A rig of three members with a profile 'p3' exported from a plan: its root."""
    root, paths, _ = make_rig(tmp_path, 3)
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    assert invoke("export", "--rig", root, "--plan", plan, "--cache-experts", "4600", "--profile", "p3",
                  "--no-fallbacks").exit_code == 0
    return root


def test_launch_out_never_writes_into_a_users_folder(tmp_path):
    from tests.engine_bridge.test_launch_engine import stand_in

    root = exported_p3(tmp_path)
    mine = tmp_path / "mylaunch"
    mine.mkdir()
    (mine / "stdout.txt").write_text("keep\n")
    refused(invoke("launch", "--rig", root, "--binary", stand_in(tmp_path), "--profile", "p3", "--out", mine), 2,
            "holds files launch did not write")
    assert (mine / "stdout.txt").read_text() == "keep\n"
    ours = tmp_path / "run"
    for _ in range(2):               # a launch folder of ours may be used again
        assert invoke("launch", "--rig", root, "--binary", stand_in(tmp_path), "--profile", "p3", "--out", ours).exit_code == 0


def test_launch_of_a_profile_file_runs_in_the_rig_it_was_exported_into(tmp_path, monkeypatch):
    """Without --rig, a profile given as a file of another rig's profiles/ runs (and would record
    its calibration) in that rig, not in ./rig."""
    import json

    from tests.engine_bridge.test_launch_engine import stand_in

    root = exported_p3(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("REPLICA_TUNER_RIG", raising=False)
    r = invoke("launch", "--binary", stand_in(tmp_path), "--profile", os.path.join(root, "profiles", "p3.json"),
               "--json")
    assert r.exit_code == 0, r.output
    run_dir = json.loads(r.stdout)["run_dir"]
    assert run_dir.startswith(os.path.join(root, "runs") + os.sep) and not (elsewhere / "rig").exists()
