"""`engine-bridge replay` (and the sources every engine command builds) on multi-file models: the
rig's model may be a split GGUF set or a safetensors directory; each rig member's path is the
model's path on that drive (the set's first file, the directory), and a read of an expert goes to
the same file in every source."""

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from core.rig import Member, Rig, save_rig
from engine_bridge.cli import app
from engine_bridge.moe.inputs import build_sources, resolve_model
from models.modelset import DIR, SPLIT, discover
from models.tensortable import inspect_model
from tests.models.geometry_helpers import write_moe_safetensors, write_moe_split_gguf

runner = CliRunner()
SHORT = ["--prompt-tokens", "8", "--gen-tokens", "2", "--cache-experts", "0", "--lanes", "2", "--no-hedge", "--no-reweigh",
         "--no-balance",
         "--json"]


def _copies(model, tmp_path):
    """The model copied to green/ and white/ under its own name: the replicas' model paths."""
    out = []
    for name in ("green", "white"):
        d = tmp_path / name
        d.mkdir()
        if model.layout == DIR:
            shutil.copytree(model.path, d / model.name)
        else:
            for rel in model.files:
                shutil.copyfile(model.abs(rel), d / rel)
        out.append(str(d / model.name))
    return out


def _rig(tmp_path, model, replicas):
    rig = Rig(root=str(tmp_path / "rig"), model=Member(model.path, "internal", "primary"),
              replicas=tuple(Member(p, n, "replica") for p, n in zip(replicas, ("green", "white"))),
              layout=model.layout, format=model.format, files=model.files)
    save_rig(rig)
    return rig


def _plan(tmp_path, paths, prefill, decode, engine="ds4-argodrive"):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"schema": 1, "kind": "plan", "engine": engine, "created": "",
                             "sources": [{"name": f"s{i}", "path": x} for i, x in enumerate(paths)],
                             "prefill": {"weights": list(prefill)}, "decode": {"weights": list(decode)}}))
    return str(p)


@pytest.fixture
def split_rig(tmp_path):
    # gate/up slices 256 KiB (F16), down 512 KiB (F32): a prefill run of 4 experts splits 3 ways
    parts = write_moe_split_gguf(tmp_path / "internal", "moe", layers=2, experts=4, top_k=2, dim=256, ff=512,
                                 per_part=3, seed=2)
    model = discover(str(parts[0]))
    assert model.layout == SPLIT and len(model.files) >= 3
    return model, _rig(tmp_path, model, _copies(model, tmp_path))


@pytest.fixture
def st_model(tmp_path):
    # one tensor per expert: gate/up 512 KiB (F16), down 1 MiB (F32), so each read splits 1:1:1
    d = write_moe_safetensors(tmp_path / "internal" / "Moe-HF", layers=2, experts=4, top_k=2, dim=512, ff=512,
                              shards=2, seed=3)
    model = discover(str(d))
    return model, _copies(model, tmp_path)


def _check_replay(j, paths, expect_layout):
    assert [s["path"] for s in j["sources"]] == paths
    assert all(s["bytes"] > 0 for s in j["sources"]) and not j["events"]
    assert sum(s["bytes"] for s in j["sources"]) == j["reader"]["bytes"] == j["prefill"]["bytes"] + j["decode"]["bytes"]
    assert j["model"]["layout"] == expect_layout


def test_replay_reads_a_rigs_split_set_from_every_member(split_rig, tmp_path):
    model, rig = split_rig
    paths = [m.path for m in rig.members]
    # llama.cpp, the engine that reads a split set, places whole files: 1:1:1 gives each source one
    plan = _plan(tmp_path, paths, (1, 1, 1), (1, 1, 1), engine="llama.cpp")
    r = runner.invoke(app, ["replay", "--rig", rig.root, "--plan", plan, *SHORT])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    _check_replay(j, paths, SPLIT)
    # every expert missed is read whole: its components' bytes, wherever the set keeps them
    g = inspect_model(model)
    per_expert = sum(x.length for x in g.expert_ranges(0, 0))
    assert j["prefill"]["bytes"] + j["decode"]["bytes"] == (j["misses"]) * per_expert
    # per phase, what each source was given and read adds up to the phase (replay reports it like run)
    for ph in ("prefill", "decode"):
        assert sum(s["bytes"] for s in j[ph]["sources"]) == j[ph]["bytes"] > 0
        assert [s["given_bytes"] for s in j[ph]["sources"]] == [s["bytes"] for s in j[ph]["sources"]]
    assert set(j["planned"]) == {"prefill", "decode"}
    assert all(e["kind"] == "split" for e in j["idle"])       # a healthy replay never leaves a given source unread


def test_the_sources_of_a_rig_are_each_members_copy_of_the_whole_model(split_rig, tmp_path):
    model, rig = split_rig
    plan = _plan(tmp_path, [m.path for m in rig.members], (2, 1, 1), (2, 1, 1), engine="llama.cpp")
    primary = resolve_model(None, plan, rig.root)
    assert primary == model
    s = build_sources(primary, [], 10, None, plan, rig.root)
    assert [m.files for m in s.models] == [model.files] * 3
    assert [m.path for m in s.models] == [m.path for m in rig.members]
    assert s.models[1].abs(model.files[1]) == os.path.join(os.path.dirname(rig.replicas[0].path), model.files[1])
    # --model names any member of the set: the whole set is found
    assert resolve_model(model.abs(model.files[-1]), None, rig.root) == model


def test_replay_takes_a_safetensors_directory_and_replica_directories(st_model):
    model, reps = st_model
    r = runner.invoke(app, ["replay", "--model", model.path, "--primary-weight", "1", "--replica", f"{reps[0]}*1",
                            "--replica", f"{reps[1]}*1", *SHORT])
    assert r.exit_code == 0, r.output
    _check_replay(json.loads(r.stdout), [model.path] + reps, DIR)


def test_a_replica_missing_a_shard_is_refused_naming_member_and_file(st_model):
    model, reps = st_model
    gone = os.path.join(reps[1], "model-00002-of-00002.safetensors")
    os.unlink(gone)
    r = runner.invoke(app, ["replay", "--model", model.path, "--replica", f"{reps[0]}*5", "--replica", f"{reps[1]}*5",
                            *SHORT])
    assert r.exit_code == 3, r.output
    lines = [x for x in r.stderr.splitlines() if x.startswith("engine-bridge: error")]
    assert lines == [f"engine-bridge: error: source 2 ({reps[1]}): file {gone}: no such file; a source is the model "
                     "or a replica of it on a mounted drive"]
