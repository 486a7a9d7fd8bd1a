"""Builders shared by the export and launch tests: a real rig (model, copies, manifest, stamps)
and plan files written through planner.plan. No tests live here."""

from __future__ import annotations

import json
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


def write_plan(tmp_path, paths, prefill, decode, name="plan.json", created="2026-11-29T19:00:00Z"):
    plan = Plan(sources=tuple(Source(DRIVES[i] if i < len(DRIVES) else f"d{i}", p) for i, p in enumerate(paths)),
                prefill=Phase(tuple(prefill)), decode=Phase(tuple(decode)), created=created,
                provenance={"solver": "test"})
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
