"""`engine-bridge tune-rig` (engine_bridge/tunerig): the steps it lists without doing them, what it
reuses and why, what it redoes after a replica is deleted, resuming after Ctrl-C, its JSON, its
errors — and that fleet's node job runs the same steps. A small real GGUF on three folders of one
disk (no testbed); the real-engine trials themselves are tested in test_engine_tune.py."""

import json
import os
import shutil
import threading

import pytest
from typer.testing import CliRunner

from core.errors import Interrupted, MissingError
from core.rig import load_rig
from engine_bridge.cli import app
from engine_bridge.tunerig import steps as steps_module
from engine_bridge.tunerig.chain import Request, dry_run, tune_rig
from engine_bridge.tunerig.constants import REUSE, RUN, SKIP
from engine_bridge.tunerig.coverage import choose_measure
from engine_bridge.tunerig.settings import BenchSettings
from engine_bridge.tunerig.state import load_state
from iobench.result import load_result, result_files
from tests.fleet.helpers import QUICK, model_file
from tests.helpers import impure_imports
from tests.replicas.helpers import flip_byte, invoke

runner = CliRunner()
BENCH = ("--bench-presets", "seq,decode", "--bench-lanes", "1", "--bench-seconds", "0.2", "--bench-repeat", "1")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return model_file(tmp_path_factory.mktemp("tune-rig-model"))


def bare(tmp_path, gguf):
    """A model alone on 'internal' and two empty drive folders: (request, the drive folders)."""
    internal = tmp_path / "internal"
    internal.mkdir()
    model = internal / "model.gguf"
    shutil.copyfile(gguf, model)
    drives = []
    for n in ("green", "white"):
        (tmp_path / n).mkdir()
        drives.append(str(tmp_path / n))
    return Request(str(tmp_path / "rig"), str(model), tuple(drives), bench=QUICK, allow_same_device=True), drives


def actions(res):
    return {s.step: s.action for s in res.steps}


def test_dry_run_lists_every_step_and_writes_nothing(tmp_path, gguf):
    req, drives = bare(tmp_path, gguf)
    res = dry_run(req)
    assert [s.step for s in res.steps] == ["replicas", "verify", "measure", "solve", "export", "tune"]
    assert actions(res) == {"replicas": RUN, "verify": RUN, "measure": RUN, "solve": RUN, "export": RUN, "tune": SKIP}
    assert drives[0] in res.steps[0].why and drives[1] in res.steps[0].why
    assert res.dry_run and res.engine == "ds4-argodrive"          # the engine that reads a GGUF file
    assert not os.path.exists(req.rig) and os.listdir(drives[0]) == [] and os.listdir(drives[1]) == []


def test_a_second_run_reuses_every_step_and_says_why(tmp_path, gguf):
    req, drives = bare(tmp_path, gguf)
    first = tune_rig(req)
    assert actions(first) == {"replicas": RUN, "verify": RUN, "measure": RUN, "solve": RUN, "export": RUN, "tune": SKIP}
    rig = load_rig(req.rig)
    assert [m.name for m in rig.members] == ["internal", "green", "white"]
    assert os.path.isfile(first.profile) and len(first.fallbacks) == 3
    assert dict(first.fallbacks).keys() == {"internal", "green", "white"}
    assert actions(dry_run(req)) == {"replicas": REUSE, "verify": RUN, "measure": REUSE, "solve": REUSE,
                                     "export": REUSE, "tune": SKIP}
    benches = result_files(rig)
    second = tune_rig(req)
    assert actions(second) == {"replicas": REUSE, "verify": RUN, "measure": REUSE, "solve": REUSE, "export": REUSE,
                               "tune": SKIP}
    why = {s.step: s.why for s in second.steps}
    assert "covers internal, green, white (same drives, files unchanged since measured)" in why["measure"]
    assert "was solved on the same measurement" in why["solve"]
    assert (second.bench, second.plan, second.profile) == (first.bench, first.plan, first.profile)
    assert result_files(rig) == benches                         # nothing measured again
    # a full verify stamps every file again (their ctime moves): still the files measured
    assert invoke("verify", "--full", "--rig", req.rig).exit_code == 0
    assert actions(dry_run(req))["measure"] == REUSE

    # --redo solves and exports again on the same measurement
    again = tune_rig(Request(**{**req.__dict__, "redo": True}))
    assert actions(again)["measure"] == REUSE and actions(again)["solve"] == RUN and again.plan != first.plan


def test_a_deleted_replica_is_copied_and_measured_again_alone(tmp_path, gguf):
    req, drives = bare(tmp_path, gguf)
    first = tune_rig(req)
    before = load_result(first.bench)
    os.remove(os.path.join(drives[1], "model.gguf"))
    planned = dry_run(req)
    assert actions(planned)["replicas"] == RUN and drives[1] in planned.steps[0].why and drives[0] not in \
        planned.steps[0].why.split(";")[0]
    assert actions(planned)["measure"] == RUN and planned.steps[2].why.startswith("white: its files changed")
    green_inode = os.stat(os.path.join(drives[0], "model.gguf")).st_ino
    res = tune_rig(req)
    assert actions(res) == {"replicas": RUN, "verify": RUN, "measure": RUN, "solve": RUN, "export": RUN, "tune": SKIP}
    assert os.stat(os.path.join(drives[0], "model.gguf")).st_ino == green_inode      # green was not copied again
    after = load_result(res.bench)
    assert after.settings["remeasured"] == ["white"] and after.settings["others_from"] == before.created
    assert after.drive("internal") == before.drive("internal") and after.drive("green") == before.drive("green")
    assert after.drive("white") != before.drive("white") and after.together == before.together


def test_interrupted_after_a_step_resumes_at_the_next(tmp_path, gguf):
    req, _ = bare(tmp_path, gguf)
    cancel = threading.Event()

    def ctrl_c_during(step):
        def say(line):
            if line.step == step:
                cancel.set()          # as the first Ctrl-C does (core.interrupt.cancel_on_interrupt)
        return say

    with pytest.raises(Interrupted, match="stopped after measure"):
        tune_rig(req, say=ctrl_c_during("measure"), cancel=cancel)
    rig = load_rig(req.rig)
    assert set(load_state(rig)) == {"measure"} and len(result_files(rig)) == 1
    res = tune_rig(req)
    assert actions(res) == {"replicas": REUSE, "verify": RUN, "measure": REUSE, "solve": RUN, "export": RUN,
                            "tune": SKIP}
    assert set(load_state(rig)) == {"measure", "solve", "export"}


def test_json_is_one_result_with_its_steps(tmp_path, gguf):
    req, drives = bare(tmp_path, gguf)
    argv = ["tune-rig", "--rig", req.rig, "--model", req.model, "--drive", drives[0], "--drive", drives[1],
            "--allow-same-device", *BENCH, "--json"]
    r = runner.invoke(app, [*argv, "--dry-run"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["schema"], doc["kind"], doc["dry_run"]) == (1, "tune-rig", True)
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert list(doc) == ["schema", "kind", "rig", "model", "engine", "dry_run", "steps", "bench", "plan", "profile",
                         "fallbacks", "predicted_tok_s", "weights", "engine_trials", "seconds"]
    assert [s["step"] for s in doc["steps"]] == ["replicas", "verify", "measure", "solve", "export", "tune"]
    assert set(doc["steps"][0]) == {"step", "action", "why", "seconds"}
    assert doc["engine"] == "ds4-argodrive" and doc["engine_trials"] is None
    assert set(doc["weights"]) == {"internal", "green", "white"} and doc["predicted_tok_s"]["decode"] > 0
    assert set(doc["fallbacks"]) == {"internal", "green", "white"}


def test_bad_input_is_one_line_and_its_exit_code(tmp_path, gguf):
    req, drives = bare(tmp_path, gguf)
    base = ["tune-rig", "--rig", req.rig, "--allow-same-device", *BENCH]
    r = runner.invoke(app, base)                                          # no model anywhere
    assert r.exit_code == 2 and "has no model" in r.output
    r = runner.invoke(app, [*base, "--model", req.model, "--drive", str(tmp_path / "nowhere")])
    assert r.exit_code == 3 and "not a directory" in r.output
    assert runner.invoke(app, [*base, "--model", req.model, "--drive", drives[0], "--drive", drives[1]]).exit_code == 0
    other = tmp_path / "other.gguf"
    shutil.copyfile(gguf, other)
    r = runner.invoke(app, [*base, "--model", str(other)])
    assert r.exit_code == 2 and "holds model" in r.output
    r = runner.invoke(app, [*base, "--", "2"])
    assert r.exit_code == 2 and "are for --binary" in r.output
    # a replica damaged in place: verify fails (exit 1) and nothing after it runs
    flip_byte(os.path.join(drives[1], "model.gguf"), 7)
    r = runner.invoke(app, base)
    assert r.exit_code == 1 and "repair with `replicas repair" in r.output
    # a replica gone with no drive folder given to copy it to again: exit 3
    os.remove(os.path.join(drives[1], "model.gguf"))
    with pytest.raises(MissingError, match="white"):
        tune_rig(Request(req.rig, bench=QUICK))


def test_coverage_rules():
    def ident(drive="uuid:a", inode=1, ctime=5, how="sync"):
        return {"drive": drive, "files": [["model.gguf", 10, 5, inode, 9, ctime, how]]}

    members = [("internal", "/d/i/m.gguf", ident()), ("green", "/d/g/m.gguf", ident("uuid:g"))]
    drives = [("internal", "/d/i/m.gguf", "uuid:a"), ("green", "/d/g/m.gguf", "uuid:g")]
    rec = {"internal": ident(), "green": ident("uuid:g")}
    assert choose_measure(members, None, None).names == ("internal", "green")
    assert choose_measure(members, drives, rec, "b.json").action == REUSE
    assert "made outside this chain" in choose_measure(members, drives, None, "b.json").why
    moved = [members[0], ("green", "/d/g/m.gguf", ident("uuid:other"))]
    assert choose_measure(moved, drives, rec).names == ("internal", "green")          # another drive: all
    copied = [members[0], ("green", "/d/g/m.gguf", ident("uuid:g", inode=2))]
    assert choose_measure(copied, drives, rec).names == ("green",)                     # a new copy: alone
    # a copy that got the deleted file's inode number and its source's mtime: its ctime and verdict tell
    recopied = [members[0], ("green", "/d/g/m.gguf", ident("uuid:g", ctime=6, how="sync"))]
    assert choose_measure(recopied, drives, rec).names == ("green",)
    restamped = [members[0], ("green", "/d/g/m.gguf", ident("uuid:g", ctime=6, how="full"))]   # verify --full stamped it
    assert choose_measure(restamped, drives, rec).action == REUSE
    added = members + [("white", "/d/w/m.gguf", ident("uuid:w"))]
    assert choose_measure(added, drives, rec).names == ("internal", "green", "white")  # a new drive: all
    folder = [("internal", "/d/i/model", ident())]
    assert choose_measure(folder, [("internal", "/d/i/model/x.safetensors", "uuid:a")], {"internal": ident()}).action \
        == REUSE                                                                        # a folder model: a file in it
    assert choose_measure(members, drives, rec, always=True).action == RUN


def test_the_pure_parts_import_no_io():
    from engine_bridge.tunerig import coverage, settings

    assert impure_imports(coverage) == [] and impure_imports(settings) == []


def test_fleets_node_job_runs_the_same_steps(tmp_path, gguf, monkeypatch):
    from fleet.job import BenchSettings as FleetBench
    from fleet.job import NodeJob
    from fleet.node import run_node
    from replicas.manifest import model_manifest_to_dict
    from replicas.manifests import load_manifest

    assert FleetBench is BenchSettings
    req, _ = bare(tmp_path, gguf)
    tune_rig(req)                       # the rig as tune-rig left it: fleet reuses its measurement
    calls = []
    for name in ("verify_rig", "plan_rig"):
        real = getattr(steps_module, name)

        def spy(*a, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(*a, **kw)
        monkeypatch.setattr(steps_module, name, spy)
    rig = load_rig(req.rig)
    job = NodeJob("n1", req.rig, model_manifest_to_dict(load_manifest(rig)), "ds4-argodrive", bench=QUICK)
    res = run_node(job)
    assert res.status == "ok", res.problems
    assert calls == ["verify_rig", "plan_rig"]
    assert res.bench == result_files(rig)[-1]          # the chain's reuse rule: the measurement covers the drives


def test_a_copy_interrupted_resumes_from_its_durable_pieces(tmp_path, gguf):
    req, drives = bare(tmp_path, gguf)
    cancel = threading.Event()
    cancel.set()                              # Ctrl-C as the copy starts
    with pytest.raises(Interrupted, match="the copy stopped"):
        tune_rig(req, cancel=cancel)
    assert not os.path.exists(os.path.join(drives[0], "model.gguf"))       # no half copy under the final name
    res = tune_rig(req)
    assert actions(res)["replicas"] == RUN and actions(res)["export"] == RUN
    assert [m.name for m in load_rig(req.rig).members] == ["internal", "green", "white"]


def test_a_colibri_rig_of_more_drives_than_the_split_presets_take_is_measured_with_the_others(tmp_path, colibri_dir):
    """colibri reads up to five mirrors; iobench's prefill and decode presets cut reads as
    ds4-argodrive does, over at most three drives: the chain measures seq, says so, and goes on."""
    internal = tmp_path / "internal"
    internal.mkdir()
    shutil.copytree(colibri_dir / "model", internal / "model")
    drives = []
    for n in ("green", "white", "blue"):
        (tmp_path / n).mkdir()
        drives.append(str(tmp_path / n))
    req = Request(str(tmp_path / "rig"), str(internal / "model"), tuple(drives), bench=QUICK, allow_same_device=True)
    res = tune_rig(req)
    assert res.engine == "colibri" and actions(res)["measure"] == RUN and actions(res)["solve"] == RUN
    why = {s.step: s.why for s in res.steps}
    assert "seq only: decode cut each read over at most 3 drives as ds4-argodrive does, and the rig has 4" \
        in why["measure"]
    assert set(load_result(res.bench).settings["presets"]) == {"seq"}
    assert len(load_rig(req.rig).members) == 4 and os.path.isfile(res.profile)
