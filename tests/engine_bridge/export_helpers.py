"""Builders shared by the export and launch tests: a real rig (model, copies, manifest, stamps)
and plan files written through planner.plan. No tests live here."""

from __future__ import annotations

import json
import random
import shutil

from core.rig import Rig, load_rig, save_rig, with_model, with_replica
from planner.plan import Phase, Plan, Source, plan_to_dict
from replicas.hashing import hash_file
from replicas.manifest import ModelManifest
from replicas.manifests import save_manifest
from replicas.verify import check_member
from tests.helpers import write_random

MODEL_BYTES = 3 * 262_144 + 81_920      # 3 blocks and a tail, like a component's shape
PIECE = 65_536
DRIVES = ("internal", "green", "white")


def make_rig(tmp_path, drives: int = 3, verify: bool = True, seed: int = 1):
    """A rig whose model lives on 'internal' and whose replicas are real copies on the other
    'drives' (folders), hashed into a manifest; replicas are fully verified (stamped) when asked."""
    root = str(tmp_path / "rig")
    paths = []
    for i, d in enumerate(DRIVES[:drives]):
        folder = tmp_path / d
        folder.mkdir()
        path = str(folder / "model.gguf")
        if i == 0:
            write_random(path, MODEL_BYTES, seed)
        else:
            shutil.copyfile(paths[0], path)
        paths.append(path)
    rig = with_model(Rig(root=root), paths[0], DRIVES[0])
    for i, p in enumerate(paths[1:], 1):
        rig = with_replica(rig, p, DRIVES[i])
    save_rig(rig)
    manifest = hash_file(paths[0], PIECE)
    save_manifest(rig, ModelManifest((manifest,)))
    rig = load_rig(root)
    if verify:
        for m in rig.replicas:
            assert check_member(m, manifest, rig, mode="full").state == "identical"
    return root, paths, manifest


def write_plan(tmp_path, paths, prefill, decode, name="plan.json", created="2026-11-29T19:00:00Z",
               engine="ds4-argodrive", **switches):
    """A plan file for `engine` (a plan exports only as its own engine's profile)."""
    plan = Plan(sources=tuple(Source(DRIVES[i] if i < len(DRIVES) else f"d{i}", p) for i, p in enumerate(paths)),
                prefill=Phase(tuple(prefill)), decode=Phase(tuple(decode)), created=created,
                provenance={"solver": "test"}, engine=engine, **switches)
    path = str(tmp_path / name)
    with open(path, "w") as f:
        json.dump(plan_to_dict(plan), f)
    return path


def write_raw_plan(tmp_path, doc: dict, name="raw-plan.json"):
    """A plan file as a dict, for rules planner.plan itself would refuse to build."""
    path = str(tmp_path / name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def raw_plan(paths, prefill, decode):
    return {"schema": 1, "kind": "plan", "engine": "ds4-argodrive", "created": "",
            "sources": [{"name": f"d{i}", "path": p} for i, p in enumerate(paths)],
            "prefill": {"weights": list(prefill), "predicted": {}},
            "decode": {"weights": list(decode), "predicted": {}},
            "baselines": {}, "alternatives": [], "provenance": {}}


def write_shard(path, tensors: dict, seed: int) -> None:
    """A safetensors shard: 8-byte little-endian header length, the JSON header, the data
    (U8 tensors of the given byte lengths, random bytes)."""
    header, offset = {}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
    with open(path, "ab") as f:
        f.write(random.Random(seed).randbytes(offset))


def make_dir_rig(tmp_path, drives: int = 3, shards: int = 2, model_type: str = "glm_moe_dsa"):
    """A rig whose model is a directory of safetensors shards (plus config and tokenizer) on
    'internal', copied whole to the other 'drives'; no manifest (verifying a directory model is
    the replicas' business). config.json names `model_type` (colibri's GLM engine by default).
    Returns the rig folder and the model directories."""
    root = str(tmp_path / "rig")
    dirs = []
    for i, d in enumerate(DRIVES[:drives]):
        folder = tmp_path / d / "glm"
        if i == 0:
            folder.mkdir(parents=True)
            for s in range(shards):
                write_shard(str(folder / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"),
                            {f"model.layers.{s}.mlp.experts.{e}.gate_proj.weight": 4096 for e in range(4)}, seed=s)
            (folder / "config.json").write_text(json.dumps({"model_type": model_type, "num_hidden_layers": 2,
                                                            "n_routed_experts": 4}))
            (folder / "tokenizer.json").write_text("{}")
        else:
            shutil.copytree(dirs[0], folder)
        dirs.append(str(folder))
    rig = with_model(Rig(root=root), dirs[0], DRIVES[0])
    for i, p in enumerate(dirs[1:], 1):
        rig = with_replica(rig, p, DRIVES[i])
    save_rig(rig)
    return root, dirs
