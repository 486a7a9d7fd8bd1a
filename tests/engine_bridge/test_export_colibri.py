"""engine-bridge export --format colibri: directories, COLI_MODEL plus SNAP, one weight per drive,
striping only when the plan stripes (end to end from `planner solve --engine colibri`), and every
colibri rule refused with its reason."""

import json
import os
import shutil
import subprocess
from dataclasses import replace

from typer.testing import CliRunner

from engine_bridge.cli import app
from engine_bridge.profiles.export import load_profile
from engine_bridge.profiles.profile import request_of
from engine_bridge.profiles.rules import SourceFacts, check_sources
from engines.colibri.mirror_env import mirror_list, parse_disk_weights
from iobench.drivemodel import DriveModel
from planner.cli import app as planner_app
from tests.engine_bridge.export_helpers import DRIVES, make_dir_rig, make_rig, write_plan, write_shard
from tests.planner.helpers import FAST, write_dir_model
from tests.planner.helpers import make_dir_rig as make_planner_dir_rig

runner = CliRunner()


def colibri_plan(*args, **kw):
    """A plan solved for colibri (`export_helpers.write_plan` for this engine)."""
    return write_plan(*args, engine="colibri", **kw)


def export(root, plan, out, *args):
    return runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "colibri", "-o", out, *args])


def test_a_directory_model_with_two_replicas_line_by_line(tmp_path):
    root, (d0, d1, d2) = make_dir_rig(tmp_path, 3)
    plan = colibri_plan(tmp_path, [d0, d1, d2], (9, 3, 3), (10, 6, 6))
    out = str(tmp_path / "colibri.env")
    r = export(root, plan, out, "--allow-unverified")
    assert r.exit_code == 0, r.output
    # colibri takes no named profiles: the summary line says nothing of one (it said "named profile -")
    assert "profile 'plan-colibri' (colibri, 3 sources) written:" in r.stderr and "named profile" not in r.stderr
    assert open(out).read().splitlines() == [
        "# colibri profile 'plan-colibri', exported by replica-tuner (engine-bridge export)",
        "# colibri: the coli launcher reads COLI_MODEL, the engine binary SNAP (both the model directory); "
        "COLI_MODEL_MIRROR lists mirror directories (';'-separated);",
        "# COLI_DISK_WEIGHTS are the plan's base weights 9:3:3 (colibri places whole experts by a hash of "
        "(layer, expert); it has no separate decode split)",
        "# engine: colibri's glm (c/colibri.c), which its launcher runs for this model's config.json model_type",
        f"# plan: {plan}",
        f"# WARNING: exported with --allow-unverified; not verified against the manifest: {d1}, {d2}",
        "# load with: . FILE   (the unset lines clear colibri variables this profile does not want: "
        "an inherited mirror list, a split layout, striping)",
        f"export COLI_MODEL='{d0}'",
        f"export SNAP='{d0}'",
        f"export COLI_MODEL_MIRROR='{d1};{d2}'",
        "export COLI_DISK_WEIGHTS='9,3,3'",
        "unset COLI_MIR_STRIPE",
        "unset COLI_MODEL_DIRS",
        "unset DIRECT",
        "unset SNAP_MIRROR",
    ]
    doc = json.load(open(str(tmp_path / "colibri.json")))
    assert doc["engine"] == "colibri" and doc["variant"] == "glm" and doc["argv"] == [] and doc["cache_experts"] is None
    assert doc["primary"] == d0 and doc["replicas"] == [d1, d2] and doc["replica_weights"] == [3, 3]
    # What colibri itself would make of the variables: its mirror list and its weights.
    env = doc["environment"]
    assert mirror_list(env["COLI_MODEL_MIRROR"]) == (d1, d2)
    assert parse_disk_weights(env["COLI_DISK_WEIGHTS"], 3) == (9.0, 3.0, 3.0)
    got = subprocess.run(["sh", "-c", '. "$1"; printf "%s|%s|%s" "$COLI_MODEL_MIRROR" "$SNAP" "${SNAP_MIRROR-unset}"',
                          "sh", out], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "SNAP_MIRROR": "/old", "DIRECT": "1"}).stdout
    assert got == f"{d1};{d2}|{d0}|unset"


def test_unverified_directory_replicas_are_refused_without_the_flag(tmp_path):
    root, dirs = make_dir_rig(tmp_path, 2)
    plan = colibri_plan(tmp_path, dirs, (2, 1), (2, 1))
    r = export(root, plan, str(tmp_path / "c.env"))
    assert r.exit_code == 2 and "\n" not in r.stderr.strip()
    assert f"replica {dirs[1]} has never been verified against the manifest" in r.stderr


def test_striping_variables_only_when_the_plan_stripes(tmp_path):
    root, dirs = make_dir_rig(tmp_path, 2)
    plan = colibri_plan(tmp_path, dirs, (2, 1), (2, 1))
    doc = json.load(open(plan))
    out = str(tmp_path / "s.env")
    # the plan's switches (schema 3), and a plan of schema 2 that has only its "stripe" key (before
    # "direct" was recorded: it striped with O_DIRECT on): the same profile
    for striped in ({**doc, "switches": ["direct", "stripe"]},
                    {**{k: v for k, v in doc.items() if k != "switches"}, "schema": 2, "stripe": True}):
        json.dump(striped, open(plan, "w"))
        assert export(root, plan, out, "--allow-unverified").exit_code == 0
        lines = [x for x in open(out).read().splitlines() if not x.startswith("#")]
        assert lines == [f"export COLI_MODEL='{dirs[0]}'", f"export SNAP='{dirs[0]}'", f"export COLI_MODEL_MIRROR='{dirs[1]}'",
                         "export COLI_DISK_WEIGHTS='2,1'", "export DIRECT='1'", "export COLI_MIR_STRIPE='1'",
                         "unset COLI_MODEL_DIRS", "unset SNAP_MIRROR"]
        assert any("O_DIRECT, the only path that stripes" in x for x in open(out).read().splitlines())
    json.dump({**doc, "switches": "yes"}, open(plan, "w"))
    r = export(root, plan, out, "--allow-unverified")
    assert r.exit_code == 2 and "key 'switches' must be a list of switch names" in r.stderr
    json.dump({**{k: v for k, v in doc.items() if k != "switches"}, "schema": 2, "stripe": "yes"}, open(plan, "w"))
    r = export(root, plan, out, "--allow-unverified")
    assert r.exit_code == 2 and "key 'stripe' must be true or false" in r.stderr


def test_one_drive_sets_the_model_and_unsets_every_mirror_key(tmp_path):
    root, dirs = make_dir_rig(tmp_path, 1)
    plan = colibri_plan(tmp_path, dirs, (1,), (1,))
    out = str(tmp_path / "one.env")
    assert export(root, plan, out).exit_code == 0
    assert [x for x in open(out).read().splitlines() if not x.startswith("#")] == [
        f"export COLI_MODEL='{dirs[0]}'", f"export SNAP='{dirs[0]}'", "unset COLI_DISK_WEIGHTS", "unset COLI_MIR_STRIPE",
        "unset COLI_MODEL_DIRS", "unset COLI_MODEL_MIRROR", "unset DIRECT", "unset SNAP_MIRROR"]


def test_a_gguf_model_is_refused_with_one_line(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    plan = colibri_plan(tmp_path, paths, (2, 1), (2, 1))
    r = export(root, plan, str(tmp_path / "c.env"))
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"{paths[0]} is not a directory of safetensors shards, which is all colibri loads" in r.stderr


def test_a_single_shard_member_stands_for_its_folder_end_to_end(tmp_path):
    # the rule itself is engines.colibri.colibri_profile.source_view (tests/engines); here the export
    # looks at real folders: a lone shard with its tokenizer and config is its folder
    folders = []
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        folders.append(tmp_path / d)
    write_shard(str(folders[0] / "model.safetensors"), {"w": 4096}, seed=1)
    (folders[0] / "tokenizer.json").write_text("{}")
    (folders[0] / "config.json").write_text('{"model_type": "glm_moe_dsa"}')
    shutil.copyfile(folders[0] / "model.safetensors", folders[1] / "model.safetensors")
    root, _ = make_dir_rig(tmp_path / "rig", 1)
    plan = colibri_plan(tmp_path, [str(f / "model.safetensors") for f in folders], (2, 1), (2, 1))
    out = str(tmp_path / "one.env")
    r = export(root, plan, out, "--allow-unverified")
    assert r.exit_code == 0, r.output
    doc = json.load(open(str(tmp_path / "one.json")))
    assert doc["primary"] == str(folders[0]) and doc["replicas"] == [str(folders[1])]
    shutil.copyfile(folders[0] / "model.safetensors", folders[1] / "other.safetensors")
    r = export(root, plan, out, "--allow-unverified")
    assert r.exit_code == 2 and "colibri would load every shard in" in r.stderr


def test_every_colibri_rule_is_refused_with_its_reason(tmp_path):
    root, (d0, d1, d2) = make_dir_rig(tmp_path, 3)
    os.remove(os.path.join(d1, "model-00002-of-00002.safetensors"))          # partial mirror
    with open(os.path.join(d2, "model-00001-of-00002.safetensors"), "ab") as f:   # a shard of another size
        f.write(b"x")
    os.remove(os.path.join(d0, "tokenizer.json"))
    plan = colibri_plan(tmp_path, [d0, d1, d2], (9, 3, 3), (10, 6, 6))
    r = export(root, plan, str(tmp_path / "c.env"), "--allow-unverified")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "breaks 3 engine rules" in r.stderr
    assert f"model directory {d0} has no tokenizer.json; colibri's coli launcher refuses it" in r.stderr
    assert f"replica {d1} lacks 1 of 2 shards (model-00002-of-00002.safetensors)" in r.stderr
    assert f"replica {d2}/model-00001-of-00002.safetensors is" in r.stderr and "colibri would skip it" in r.stderr


def test_a_mirror_directory_with_colibris_separator_or_the_model_itself(tmp_path):
    root, (d0, d1) = make_dir_rig(tmp_path, 2)
    odd = str(tmp_path / "a;b")
    shutil.move(os.path.dirname(d1), odd)
    plan = colibri_plan(tmp_path, [d0, os.path.join(odd, "glm")], (1, 1), (1, 1))
    r = export(root, plan, str(tmp_path / "c.env"), "--allow-unverified")
    assert r.exit_code == 2 and "';'" in r.stderr and "separator in COLI_MODEL_MIRROR" in r.stderr
    plan = colibri_plan(tmp_path, [d0, d0], (1, 1), (1, 1), name="same.json")
    r = export(root, plan, str(tmp_path / "c.env"), "--allow-unverified")
    assert r.exit_code == 2 and "is the model directory itself; colibri ignores it" in r.stderr


def test_the_member_colibri_runs_for_the_models_config_sets_the_rules(tmp_path):
    # GLM-5.3 (glm5_next): its env file names it, and a striped plan is refused (only GLM stripes)
    root, dirs = make_dir_rig(tmp_path, 2, model_type="glm5_next")
    plan = colibri_plan(tmp_path, dirs, (2, 1), (2, 1))
    out = str(tmp_path / "g53.env")
    assert export(root, plan, out, "--allow-unverified").exit_code == 0
    assert "# engine: colibri's glm53 (c/glm53.c), which its launcher runs for this model's config.json model_type" in \
        open(out).read().splitlines()
    assert json.load(open(str(tmp_path / "g53.json")))["variant"] == "glm53"
    doc = json.load(open(plan))
    doc["switches"] = ["direct", "stripe"]
    json.dump(doc, open(plan, "w"))
    r = export(root, plan, out, "--allow-unverified")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert ("switches: the plan stripes reads, but colibri's glm53 engine (c/glm53.c, model_type 'glm5_next') never "
            "stripes") in r.stderr


def test_a_model_type_colibri_does_not_run_is_refused(tmp_path):
    root, dirs = make_dir_rig(tmp_path, 2, model_type="olmoe")
    plan = colibri_plan(tmp_path, dirs, (2, 1), (2, 1))
    r = export(root, plan, str(tmp_path / "c.env"), "--allow-unverified")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"sources[0]: model directory {dirs[0]}: model_type 'olmoe' runs colibri's olmoe engine" in r.stderr


def test_a_missing_model_directory_is_exit_3(tmp_path):
    # (More than 4 mirrors cannot reach export: a plan holds at most colibri's 5 sources.)
    root, (d0, d1) = make_dir_rig(tmp_path, 2)
    plan = colibri_plan(tmp_path, [str(tmp_path / "gone"), d1], (1, 1), (1, 1), name="gone.json")
    r = export(root, plan, str(tmp_path / "c.env"), "--allow-unverified")
    assert r.exit_code == 3 and f"model {tmp_path / 'gone'} does not exist" in r.stderr


def test_rules_on_facts_blank_edges_long_paths_and_the_mirror_list_length():
    shards = (("model.safetensors", 10),)
    primary = SourceFacts(0, "/m", directory="/m", shards=shards, tokenizer=True, device=1, inode=1,
                          config="ok", model_type="glm_moe_dsa")

    def mirror(i, d):
        return SourceFacts(i, d, directory=d, shards=shards, device=1, inode=10 + i, state="verified")

    assert check_sources([primary, mirror(1, "/g")], (1, 1), (1, 1), engine="colibri") == []
    v = check_sources([primary, mirror(1, "/g ")], (1, 1), (1, 1), engine="colibri")
    assert [x.rule for x in v] == ["edge-blank"]
    long = "/" + "x" * 2040
    v = check_sources([primary, mirror(1, long)], (1, 1), (1, 1), engine="colibri")
    assert [x.rule for x in v] == ["path-length"]
    many = [primary] + [mirror(i, "/" + str(i) * 1100) for i in range(1, 5)]
    assert "mirror-list-length" in [x.rule for x in check_sources(many, (1,) * 5, (1,) * 5, engine="colibri")]
    v = check_sources([primary, mirror(1, "/g")], (1, 1), (1,), engine="colibri")
    assert [x.rule for x in v] == ["weight-count"]


def _solve_colibri(root):
    r = runner.invoke(planner_app, ["solve", "--rig", root, "--engine", "colibri", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _v41_rig(tmp_path, models):
    """A rig whose model is a small DeepSeek V4.1 directory (config.json model_type deepseek_v41, 4
    layers x 16 experts) copied whole to two more drives, with an iobench result of `models`."""
    model = write_dir_model(tmp_path / "v41", "deepseek_v41")
    rig, _ = make_planner_dir_rig(tmp_path / "rig", model, names=DRIVES, models=models)
    return rig.root, [rig.model.path] + [m.path for m in rig.replicas]



def test_a_profile_exported_before_the_switches_list_asks_for_what_its_plan_had(tmp_path):
    """A profile keeps a copy of its plan; one exported from a schema-2 plan has a key per switch
    there, and launch reads the request back through the engine's switches."""
    root, dirs = make_dir_rig(tmp_path, 2)
    plan = colibri_plan(tmp_path, dirs, (2, 1), (2, 1))
    doc = json.load(open(plan))
    json.dump({**doc, "switches": ["direct", "stripe"]}, open(plan, "w"))
    out = str(tmp_path / "p.env")
    assert export(root, plan, out, "--allow-unverified").exit_code == 0
    profile = load_profile(str(tmp_path / "p.json"))
    assert request_of(profile).switches == frozenset({"direct", "stripe"})
    old = dict(profile.plan)
    del old["switches"]
    assert request_of(replace(profile, plan={**old, "schema": 2, "stripe": True})).switches == frozenset({"direct", "stripe"})
    assert request_of(replace(profile, plan={**old, "schema": 2, "direct": True, "stripe": False})).switches == {"direct"}

def test_a_solved_colibri_plan_exports_end_to_end_with_two_replicas(tmp_path):
    # colibri runs a DeepSeek V4.1 model on its V4.1 engine, which never stripes, so the plan has one
    # weight vector for both phases and no stripe, and the profile says so. The rig's own small model:
    # the named workload ds4-v41 (the released model's geometry) takes the same path at tens of
    # seconds per solve
    root, dirs = _v41_rig(tmp_path, (FAST, FAST, FAST))
    solved = _solve_colibri(root)
    assert solved["geometry"]["arch"] == "deepseek_v41"
    assert "stripe" not in solved["switches"] and solved["prefill"]["weights"] == solved["decode"]["weights"]
    out = str(tmp_path / "twins.env")
    # --no-fallbacks: the N-1 re-solves are tested in test_fallback_profiles.py
    r = export(root, solved["path"], out, "--allow-unverified", "--no-fallbacks")
    assert r.exit_code == 0, r.output
    w = solved["prefill"]["weights"]
    lines = [x for x in open(out).read().splitlines() if not x.startswith("#")]
    assert lines[:4] == [f"export COLI_MODEL='{dirs[0]}'", f"export SNAP='{dirs[0]}'",
                         f"export COLI_MODEL_MIRROR='{dirs[1]};{dirs[2]}'", f"export COLI_DISK_WEIGHTS='{','.join(map(str, w))}'"]
    assert "unset COLI_MIR_STRIPE" in lines
    doc = json.load(open(str(tmp_path / "twins.json")))
    assert parse_disk_weights(doc["environment"]["COLI_DISK_WEIGHTS"], 3) == tuple(map(float, w))
    # a drive 8x slower gets a small share of the whole experts
    root2, dirs2 = _v41_rig(tmp_path / "mixed", (FAST, FAST, DriveModel(lat_s=100e-6, stream_bw=20e6, bw_max=25e6)))
    solved = _solve_colibri(root2)
    assert "stripe" not in solved["switches"]
    shares = [s["share"] for s in solved["prefill"]["predicted"]["sources"]]
    assert shares[2] < shares[0] / 4 and shares[2] < shares[1] / 4
    out = str(tmp_path / "whole.env")
    assert export(root2, solved["path"], out, "--allow-unverified", "--no-fallbacks").exit_code == 0
    lines = [x for x in open(out).read().splitlines() if not x.startswith("#")]
    assert f"export COLI_DISK_WEIGHTS='{','.join(map(str, solved['prefill']['weights']))}'" in lines
    assert "unset COLI_MIR_STRIPE" in lines
