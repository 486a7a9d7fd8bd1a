"""One node's job, run here without a cluster: what it finds, what it keeps, what a rerun redoes."""

import hashlib
import json
import os

from core.rig import load_rig
from fleet.constants import MISMATCH, MISSING, OK
from fleet.job import NodeJob
from fleet.node import run_node
from replicas.checks import FilePiece
from replicas.manifest import model_manifest_to_dict
from replicas.manifests import load_manifest
from replicas.upstream import upstream_to_dict
from replicas.upstreams import record_upstream
from tests.fleet.helpers import PIECE, QUICK, node_rig
from tests.replicas.helpers import flip_byte

def _job(rig, **kw):
    manifest = load_manifest(load_rig(rig))
    return NodeJob("n1", rig, model_manifest_to_dict(manifest), "ds4-argodrive", bench=QUICK, **kw)


def _sums(tmp_path, model, digest=None):
    with open(model, "rb") as f:
        real = hashlib.sha256(f.read()).hexdigest()
    path = tmp_path / "SHA256SUMS"
    path.write_text(f"{digest or real}  model.gguf\n")
    return str(path)


def test_a_node_verifies_measures_solves_exports_and_a_rerun_reuses_it(tmp_path, model):
    rig = node_rig(tmp_path / "n1", model)
    manifest = load_manifest(load_rig(rig))
    upstream = upstream_to_dict(record_upstream(_sums(tmp_path, model), manifest))
    job = _job(rig, upstream=upstream)
    first = run_node(job)
    assert first.status == OK and not first.reused, first.problems
    assert first.upstream == "match"
    assert [d.state for d in first.drives] == ["identical"] * 3
    assert all(d.seq_Bps > 0 and d.decode_weight is not None for d in first.drives)
    with open(first.profile[:-len(".env")] + ".json") as f:
        profile = json.load(f)
    assert profile["id"] == "fleet-n1" and len(profile["replicas"]) == 2 and not profile["unverified"]
    assert first.prefill_tok_s > 0 and first.decode_tok_s > 0

    again = run_node(job)
    assert again.reused and again.drives == first.drives and again.plan == first.plan
    forced = run_node(_job(rig, upstream=upstream, force=True))
    assert not forced.reused and forced.status == OK
    assert forced.bench == first.bench            # the rig's measurement covers its drives: not measured again


def test_a_damaged_replica_is_named_by_its_piece_and_nothing_is_planned(tmp_path, model):
    rig = node_rig(tmp_path / "n1", model)
    flip_byte(tmp_path / "n1" / "white" / "model.gguf", 2 * PIECE + 7)
    res = run_node(_job(rig))
    assert res.status == MISMATCH and not res.plan and not res.profile
    white = res.drives[2]
    assert (white.name, white.state, white.bad) == ("white", "mismatch", (FilePiece("model.gguf", 2, 2 * PIECE, PIECE),))
    assert any("replicas repair" in p for p in res.problems)
    assert not os.path.exists(os.path.join(rig, "bench"))
    assert not run_node(_job(rig)).reused         # a node that did not finish is redone


def test_a_node_without_the_model_or_with_another_upstream_says_so(tmp_path, model):
    missing = run_node(NodeJob("n2", str(tmp_path / "nowhere"), {}, "ds4-argodrive"))
    assert missing.status == MISSING and "no rig at" in missing.problems[0] and "\n" not in missing.problems[0]

    rig = node_rig(tmp_path / "n1", model)
    manifest = load_manifest(load_rig(rig))
    wrong = upstream_to_dict(record_upstream(_sums(tmp_path, model, "0" * 64), manifest))
    res = run_node(_job(rig, upstream=wrong))
    assert res.status == MISMATCH and res.upstream == "mismatch"
    assert any(f"is not the published {'0' * 64}" in p for p in res.problems)

    os.remove(tmp_path / "n1" / "green" / "model.gguf")
    gone = run_node(_job(rig))
    assert gone.status == MISSING and gone.drives[1].state == "missing"
