"""The model's upstream digests: read from a Hugging Face snapshot, a sha256sum file or an OCI
manifest, and each member checked against them in its own pass (`replicas upstream`, `verify --upstream`)."""

import hashlib
import json
import os
import shutil
import subprocess

import pytest

from core.errors import MissingError, RigError
from core.rig import load_rig
from replicas.manifests import load_manifest
from replicas.upstream import GIT_SHA1, SHA256, Upstream, UpstreamFile, judge_upstream, parse_oci, parse_sums
from replicas.upstreams import digest_file, record_upstream
from tests.replicas.helpers import flip_byte, invoke, model_rig


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hf_snapshot(root, model_dir, small=4096):
    """A Hugging Face cache entry for the files of `model_dir`, as the hub lays it out: the bytes in
    blobs/<etag> (SHA-256 for a large, LFS file; the git blob SHA-1 for a small one), each file of
    snapshots/REV a relative symlink to its blob. Returns the snapshot folder."""
    repo = os.path.join(str(root), "models--org--moe")
    snap = os.path.join(repo, "snapshots", "0123abcd")
    os.makedirs(os.path.join(repo, "blobs"))
    for dirpath, _, names in os.walk(model_dir):
        for name in names:
            src = os.path.join(dirpath, name)
            rel = os.path.relpath(src, model_dir)
            with open(src, "rb") as f:
                data = f.read()
            etag = hashlib.sha256(data).hexdigest() if len(data) > small else _git_sha1(data)
            shutil.copyfile(src, os.path.join(repo, "blobs", etag))
            link = os.path.join(snap, rel)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.relpath(os.path.join(repo, "blobs", etag), os.path.dirname(link)), link)
    return snap


def test_a_hugging_face_snapshot_ties_every_member_to_what_was_published(tmp_path):
    rig, (primary, green, white) = model_rig(tmp_path, "dir")
    snap = hf_snapshot(tmp_path / "hf", primary)
    res = invoke("upstream", snap, "--rig", rig, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    algos = {f["path"]: f["algorithm"] for f in doc["files"]}
    assert set(algos) == set(load_manifest(load_rig(rig)).names)           # every file has its published digest
    assert SHA256 in algos.values() and GIT_SHA1 in algos.values()

    # Quick: the stamps are live, so verify reads nothing and the digests take a pass of their own;
    # --full: they ride on verify's own read of every byte.
    size = load_manifest(load_rig(rig)).size
    for how, extra in (([], size), (["--full"], 0)):
        res = invoke("verify", "--rig", rig, *how, "--upstream", os.path.join(rig, "upstream.json"), "--json")
        assert res.exit_code == 0, res.output
        ups = json.loads(res.stdout)["upstream"]
        assert [(u["state"], u["own_pass_bytes"]) for u in ups.values()] == [("match", extra)] * 3
    shard = next(p for p, a in algos.items() if a == SHA256 and p.endswith(".safetensors"))
    flip_byte(os.path.join(green, shard), 1000)
    res = invoke("verify", "--rig", rig, "--upstream", os.path.join(rig, "upstream.json"), "--json")
    assert res.exit_code == 1
    ups = json.loads(res.stdout)["upstream"]
    assert ups[primary]["state"] == "match" and ups[white]["state"] == "match"
    assert ups[green]["state"] == "mismatch" and shard in ups[green]["problems"][0]


def test_the_git_blob_digest_is_the_one_git_computes(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed: nothing to compare the git blob SHA-1 with")
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "moe"}\n')
    want = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()
    assert digest_file(str(path), GIT_SHA1) == (want, path.stat().st_size)


def test_a_sums_file_and_an_oci_manifest(tmp_path):
    rig, (primary, _, _) = model_rig(tmp_path, "split")
    manifest = load_manifest(load_rig(rig))
    digests = {}
    for f in manifest.files:
        with open(os.path.join(os.path.dirname(primary), f.name), "rb") as fh:
            digests[f.name] = hashlib.sha256(fh.read()).hexdigest()
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("# published\n" + "".join(f"{h} *./{n}\n" for n, h in digests.items()))
    up = record_upstream(str(sums), manifest)
    assert {f.path: f.digest for f in up.files} == digests

    first, *rest = manifest.files
    layers = [{"mediaType": "application/octet-stream", "digest": f"sha256:{digests[f.name]}", "size": f.size,
               "annotations": {"org.opencontainers.image.title": f.name}} for f in rest]
    layers.append({"digest": f"sha256:{digests[first.name]}", "size": first.size})     # no title: matched by size
    oci = tmp_path / "manifest.json"
    oci.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    assert {f.path: f.digest for f in record_upstream(str(oci), manifest).files} == digests


def test_what_is_refused():
    with pytest.raises(RigError, match=r"SUMS:2: not a sha256sum line"):
        parse_sums("a" * 64 + "  x\nnot a line\n", "SUMS")
    with pytest.raises(RigError, match="not sha256:HEX"):
        parse_oci({"layers": [{"digest": "md5:abc"}]}, "oci.json", {})
    with pytest.raises(RigError, match="not an OCI image manifest"):
        parse_oci({"config": {}}, "oci.json", {})


def test_a_source_listing_none_of_the_files_is_refused(tmp_path):
    rig, _ = model_rig(tmp_path, "split")
    sums = tmp_path / "SUMS"
    sums.write_text("b" * 64 + "  other.bin\n")
    with pytest.raises(RigError, match="lists none of the model's files"):
        record_upstream(str(sums), load_manifest(load_rig(rig)))
    with pytest.raises(MissingError, match="no such file of published digests"):
        record_upstream(str(tmp_path / "absent"), load_manifest(load_rig(rig)))


def test_judging_names_each_file():
    up = Upstream((UpstreamFile("a", SHA256, "1" * 64), UpstreamFile("b", SHA256, "2" * 64)))
    assert judge_upstream(up, {"a": "1" * 64, "b": "2" * 64}, "/m").state == "match"
    gone = judge_upstream(up, {"a": "1" * 64, "b": None}, "/m")
    assert gone.state == "missing" and gone.problems == (f"/m: b: missing or unreadable, its upstream sha256 is {'2' * 64}",)
    bad = judge_upstream(up, {"a": "3" * 64, "b": None}, "/m")
    assert bad.state == "mismatch" and len(bad.problems) == 2


def test_a_partial_replica_is_checked_on_the_files_it_holds(tmp_path):
    """A partial replica never holds some files: they are not 'missing' from it (models.modelset.member_files)."""
    from tests.planner.helpers import write_dir_model

    primary = str(write_dir_model(tmp_path / "internal" / "moe", "glm_moe_dsa", shards=2, dim=256, ff=256))
    rig = str(tmp_path / "rig")
    for d in ("green", "blue"):
        (tmp_path / d).mkdir()
        res = invoke("sync", "--rig", rig, "--piece-size", "64K", "--allow-same-device",
                     *(["--partial", "50%"] if d == "blue" else []), primary, tmp_path / d)
        assert res.exit_code == 0, res.output
    part = next(m for m in load_rig(rig).replicas if m.partial)
    snap = hf_snapshot(tmp_path / "hf", primary)
    assert invoke("upstream", snap, "--rig", rig).exit_code == 0
    for how in ([], ["--full"]):
        res = invoke("verify", "--rig", rig, *how, "--upstream", os.path.join(rig, "upstream.json"), "--json")
        assert res.exit_code == 0, res.output
        ups = json.loads(res.stdout)["upstream"]
        assert ups[part.path]["state"] == "match" and ups[part.path]["problems"] == []
    held = sorted(f for f in part.holds if f.endswith(".safetensors"))[0]
    flip_byte(os.path.join(part.path, held), 1000)
    res = invoke("verify", "--rig", rig, "--upstream", os.path.join(rig, "upstream.json"), "--json")
    assert res.exit_code == 1
    assert json.loads(res.stdout)["upstream"][part.path]["state"] == "mismatch"
