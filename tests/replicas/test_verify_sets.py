"""verify, repair, status, hash and forget on models of several files: a real split GGUF set and a
real safetensors directory, replicated to two destinations. Each file is judged against its own
manifest; a bad piece is named by file and piece; a missing file is exit 3 and named while the
other files are still checked; repair re-copies only what is bad and restores a missing file."""

import functools
import json
import os
import threading

import pytest

from core import rig as rigmod
from core.errors import Interrupted
from core.events import Progress
from replicas import verify
from core.coldio import read_sequential
from replicas.manifest import manifest_from_dict
from replicas.manifests import load_manifest
from models.modelset import from_rig
from replicas.records import load_scrub, load_verdicts
from replicas.stamps import sidecar_path
from tests.replicas.helpers import SET_PIECE, flip_byte, invoke, model_rig

KINDS = ["split", "dir"]
MEMBER_KEYS = {"path", "name", "role", "state", "how", "bad", "size", "bytes_read", "seconds", "detail", "stamped",
               "pieces_checked", "files"}
FILE_KEYS = {"file", "path", "state", "how", "bad", "size", "bytes_read", "seconds", "detail", "stamped",
             "pieces_checked", "parsed", "parses"}


@pytest.fixture(params=KINDS)
def rigset(request, tmp_path):
    """(rig dir, [primary, green, white] model paths, the model where each member keeps it)."""
    rig, paths = model_rig(tmp_path, request.param)
    model = from_rig(rigmod.load_rig(rig))
    return rig, paths, [model.at(p) for p in paths]


def verify_json(rig, *args):
    r = invoke("verify", "--rig", rig, "--json", *args)
    return r.exit_code, json.loads(r.stdout)


def table_rows(text):
    """The body rows of a Rich table as printed (the header row is drawn with other characters)."""
    return [line for line in text.splitlines() if line.startswith("│")]


def biggest(model):
    """(relative path, absolute path) of the model's largest file: a shard with several pieces."""
    rel = max(model.files, key=lambda f: os.path.getsize(model.abs(f)))
    return rel, model.abs(rel)


def test_every_file_is_checked_and_the_json_keys_are_pinned(rigset):
    rig, paths, models = rigset
    code, doc = verify_json(rig, "--full")
    assert code == 0
    manifest = load_manifest(rigmod.load_rig(rig))
    assert doc["model_digest"] == manifest.digest() and doc["manifest_blake3"] is None
    assert doc["layout"] == manifest.layout
    for m, model in zip(doc["members"], models):
        assert set(m) == MEMBER_KEYS and m["state"] == "identical" and m["how"] == "full"
        assert [f["file"] for f in m["files"]] == list(model.files)
        assert [f["path"] for f in m["files"]] == list(model.paths)
        assert all(set(f) == FILE_KEYS and f["state"] == "identical" for f in m["files"])
        assert m["bytes_read"] == manifest.size == sum(f["bytes_read"] for f in m["files"])
        assert m["pieces_checked"] == manifest.count


def test_a_flipped_byte_names_file_and_piece_and_repair_fixes_only_that(rigset):
    rig, paths, models = rigset
    rel, path = biggest(models[2])
    size = os.path.getsize(path)
    off = size - 3 * SET_PIECE // 2                     # inside the second-to-last piece
    piece = off // SET_PIECE
    flip_byte(path, off)
    code, doc = verify_json(rig)
    assert code == 1
    white = doc["members"][2]
    assert white["state"] == "mismatch"
    assert white["bad"] == [{"file": rel, "index": piece, "offset": piece * SET_PIECE, "length": SET_PIECE}]
    bad_file = next(f for f in white["files"] if f["file"] == rel)
    assert bad_file["state"] == "mismatch" and bad_file["how"] == "full"
    assert {f["state"] for f in white["files"] if f["file"] != rel} == {"identical"}
    assert [m["state"] for m in doc["members"][:2]] == ["identical", "identical"]
    r = invoke("verify", "--rig", rig)                   # the human form names the file's path and the piece
    assert f"{path}: bad piece {piece} at byte {piece * SET_PIECE}, {SET_PIECE} bytes" in r.stderr.splitlines()
    assert invoke("status", "--rig", rig).exit_code == 1
    r = invoke("repair", "--rig", rig, "white", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["repaired"] == white["bad"] and rep["restored"] == [] and rep["bytes_copied"] == SET_PIECE
    assert rep["after"] == "identical"
    with open(path, "rb") as a, open(models[0].abs(rel), "rb") as b:
        assert a.read() == b.read()
    assert invoke("verify", "--rig", rig).exit_code == 0
    assert invoke("status", "--rig", rig).exit_code == 0
    # The human form names the file it mended (a split set's member path is its first file, which
    # is not the one repaired here), and the member it belongs to.
    flip_byte(path, off)
    assert invoke("verify", "--rig", rig).exit_code == 1
    r = invoke("repair", "--rig", rig, "white")
    assert r.exit_code == 0, r.output
    line = " ".join(r.stdout.split())
    assert line.startswith(f"{path}: re-copied 1 piece") and line.endswith(f"{paths[2]} now identical"), line


def test_a_deleted_shard_is_exit_3_named_and_the_rest_is_still_checked(rigset):
    rig, paths, models = rigset
    rel, path = biggest(models[1])
    for m in models:                     # private shards: the restored copy must stay private too
        os.chmod(m.abs(rel), 0o600)
    os.unlink(path)
    code, doc = verify_json(rig, "--full")
    assert code == 3
    green = doc["members"][1]
    assert green["state"] == "missing"
    missing = next(f for f in green["files"] if f["file"] == rel)
    assert missing["state"] == "missing" and missing["path"] == path and "no such file" in missing["detail"]
    others = [f for f in green["files"] if f["file"] != rel]
    assert {f["state"] for f in others} == {"identical"}
    assert all(f["bytes_read"] == f["size"] for f in others)           # really read, not skipped
    assert [doc["members"][i]["state"] for i in (0, 2)] == ["identical", "identical"]
    r = invoke("verify", "--rig", rig)
    assert r.exit_code == 3 and any(line.startswith(f"{path}: missing") for line in r.stderr.splitlines())
    # status lists, under its member, only the file that is not verified.
    rows = table_rows(invoke("status", "--rig", rig).stdout)
    assert len(rows) == 4 and rel in rows[2] and "missing" in rows[2] and "green" in rows[1]
    # repair copies it whole from a member whose pieces verify, through a temporary name.
    r = invoke("repair", "--rig", rig, "green", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["restored"] == [rel] and rep["repaired"] == [] and rep["bytes_copied"] == os.path.getsize(path)
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".repair")]
    assert os.stat(path).st_mode & 0o777 == 0o600                        # the donor's mode, not 0644
    assert invoke("verify", "--rig", rig).exit_code == 0                 # stamped by repair's own verify


def test_quick_verify_rereads_only_the_touched_file(rigset):
    rig, paths, models = rigset
    rel, path = biggest(models[1])
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    code, doc = verify_json(rig)
    assert code == 0
    green = doc["members"][1]
    assert green["how"] == "stamp+full" or green["how"] == "full+stamp"
    for f in green["files"]:
        if f["file"] == rel:
            assert f["how"] == "full" and f["bytes_read"] == st.st_size and f["stamped"] == "xattr"
        else:
            assert f["how"] == "stamp" and f["bytes_read"] == 0
    assert all(m["bytes_read"] == 0 for i, m in enumerate(doc["members"]) if i != 1)
    # Re-stamped: the next quick verify reads nothing at all.
    code, doc = verify_json(rig)
    assert code == 0 and sum(m["bytes_read"] for m in doc["members"]) == 0


def test_a_mismatch_stands_per_file_until_a_clean_read(rigset):
    rig, paths, models = rigset
    rel, path = biggest(models[2])
    flip_byte(path, 10, keep_mtime=True)                 # hidden from the stamp's identity
    assert invoke("verify", "--rig", rig).exit_code == 0
    assert invoke("verify", "--rig", rig, "--full").exit_code == 1
    verdicts = load_verdicts(rigmod.load_rig(rig))
    assert verdicts[path].state == "mismatch"
    assert {verdicts[p].state for p in models[2].paths if p != path} == {"verified"}
    code, doc = verify_json(rig)                          # quick re-reads that file only, and still finds it
    assert code == 1
    assert {f["file"]: f["how"] for f in doc["members"][2]["files"]}[rel] == "full"
    st = json.loads(invoke("status", "--rig", rig, "--json").stdout)
    white = st["members"][2]
    assert white["state"] == "mismatch" and white["verdict"]["bad"] == [{"index": 0, "offset": 0, "length": SET_PIECE}]
    assert [f["state"] for f in white["files"]] == ["mismatch" if f == rel else "verified" for f in models[2].files]


def test_status_json_lists_every_file_and_the_model_digest(rigset):
    rig, paths, models = rigset
    doc = json.loads(invoke("status", "--rig", rig, "--json").stdout)
    manifest = load_manifest(rigmod.load_rig(rig))
    assert doc["model_digest"] == manifest.digest() and doc["layout"] == manifest.layout
    for m, model in zip(doc["members"], models):
        assert m["state"] == "verified" and m["size"] == manifest.size
        assert [(f["file"], f["path"], f["size"], f["state"]) for f in m["files"]] == \
            [(f.name, p, f.size, "verified") for f, p in zip(manifest.files, model.paths)]
    r = invoke("status", "--rig", rig)
    assert f"digest {manifest.digest()[:16]}" in r.stdout
    assert len(table_rows(r.stdout)) == 3                 # one row per member: no file to list, all verified


def test_a_missing_first_file_of_a_split_set_is_restored_last(tmp_path):
    rig, paths = model_rig(tmp_path, "split")
    green = from_rig(rigmod.load_rig(rig)).at(paths[1])
    os.unlink(green.paths[0])
    os.unlink(green.paths[2])
    r = invoke("repair", "--rig", rig, "green", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["restored"] == [green.files[2], green.files[0]]
    assert invoke("verify", "--rig", rig, "--full").exit_code == 0


def test_repair_refuses_the_primary_and_a_member_whose_folder_is_gone(rigset, tmp_path):
    rig, paths, models = rigset
    r = invoke("repair", "--rig", rig, "internal")
    assert r.exit_code == 2 and "primary" in r.output
    gone = os.path.dirname(paths[2]) if models[2].layout == "gguf-split" else paths[2]
    os.rename(gone, str(tmp_path / "unplugged"))
    r = invoke("repair", "--rig", rig, "white")
    assert r.exit_code == 3 and len(r.output.strip().splitlines()) == 1 and "replicas sync" in r.output


def test_hash_a_model_prints_a_line_per_file_and_its_manifest_verifies_another_copy(rigset, tmp_path):
    rig, paths, models = rigset
    arg = paths[0] if models[0].layout == "dir" else models[0].paths[1]   # any file of a split set names the set
    r = invoke("hash", arg)
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert [line.split("  ", 1)[1] for line in lines] == list(models[0].paths)
    r = invoke("hash", arg, "--piece-size", "64K", "--json")
    doc = json.loads(r.stdout)
    assert doc["schema"] == 2 and [f["path"] for f in doc["files"]] == list(models[0].files)
    mine = load_manifest(rigmod.load_rig(rig))
    assert manifest_from_dict(doc).digest() == mine.digest() == doc["digest"]
    other = tmp_path / "other-host.json"
    other.write_text(r.stdout)
    code, v = verify_json(rig, "--manifest", str(other), paths[2])
    assert code == 0 and v["members"][0]["state"] == "identical" and v["model_digest"] == mine.digest()
    rel, path = biggest(models[2])
    flip_byte(path, 5)
    code, v = verify_json(rig, "--manifest", str(other), paths[2])
    assert code == 1 and [b["file"] for b in v["members"][0]["bad"]] == [rel]


def test_verify_against_a_manifest_takes_one_file_of_a_multi_file_model(rigset, tmp_path):
    """`verify --manifest M FILE`, FILE one file of a directory model, checks that file against
    its own entry (it reported the model's other files as 'Not a directory'); a file the manifest
    does not list is refused in one line. A file of a split set names the whole set, as everywhere."""
    rig, paths, models = rigset
    if models[0].layout != "dir":
        pytest.skip("a file of a split set names the whole set (the test above)")
    doc = invoke("hash", paths[0] if models[0].layout == "dir" else models[0].paths[0], "--piece-size", "64K", "--json")
    other = tmp_path / "other-host.json"
    other.write_text(doc.stdout)
    rel, path = biggest(models[2])
    code, v = verify_json(rig, "--manifest", str(other), path)
    assert code == 0 and v["members"][0]["state"] == "identical", v
    assert [f["file"] for f in v["members"][0]["files"]] == [rel]
    flip_byte(path, 5)
    code, v = verify_json(rig, "--manifest", str(other), path)
    assert code == 1 and [b["file"] for b in v["members"][0]["bad"]] == [rel]
    stray = tmp_path / "stray.bin"
    stray.write_bytes(b"x" * 100)
    r = invoke("verify", "--rig", rig, "--manifest", str(other), str(stray))
    assert r.exit_code == 2 and "not a file of the" in r.output and len(r.output.strip().splitlines()) == 1


def test_forget_a_set_replica_drops_the_records_of_each_file(rigset):
    rig, paths, models = rigset
    r = rigmod.load_rig(rig)
    primary_sidecars = [sidecar_path(r, p) for p in models[0].paths]
    assert all(os.path.exists(s) for s in primary_sidecars)
    assert invoke("forget", "--rig", rig, "internal").exit_code == 2           # replicas first
    gone = invoke("forget", "--rig", rig, "white")
    assert gone.exit_code == 0 and f"its {len(models[2].files)} files are left as they are" in gone.output
    after = load_verdicts(rigmod.load_rig(rig))
    assert not [p for p in after if p.startswith(os.path.dirname(paths[2]))]
    assert all(p in after for p in models[1].paths)
    assert all(os.path.exists(p) for p in models[2].paths)                     # its files stay
    assert invoke("forget", "--rig", rig, "green").exit_code == 0
    assert invoke("forget", "--rig", rig, "internal").exit_code == 0
    assert not any(os.path.exists(s) for s in primary_sidecars)
    assert load_verdicts(rigmod.load_rig(rig)) == {}


def test_an_interrupted_full_verify_resumes_in_the_file_where_it_stopped(tmp_path, monkeypatch):
    rig, paths = model_rig(tmp_path, "dir")
    # 16 KiB reads, so a shard is read in many steps; Ctrl-C pressed on the reading thread once
    # green's second shard is read up to 2 pieces (where it stops does not depend on timing).
    monkeypatch.setattr(verify, "read_sequential", functools.partial(read_sequential, block=16 << 10))
    r = rigmod.load_rig(rig)
    manifest = load_manifest(r)
    green = from_rig(r).at(paths[1])
    shard = "model-00002-of-00003.safetensors"
    cancel = threading.Event()

    def report(ev):
        if isinstance(ev, Progress) and ev.task == green.abs(shard) and ev.done >= 2 * SET_PIECE:
            cancel.set()
    with pytest.raises(Interrupted):
        verify.verify_members(list(r.members), manifest, r, mode="full", report=report, cancel=cancel)
    marks = load_scrub(r)
    before = green.files[:green.files.index(shard)]
    assert all(marks[green.abs(f)].done == manifest.file(f).count for f in before)
    assert marks[green.abs(shard)].done == 2
    assert not [p for p in marks if p.startswith(os.path.dirname(paths[2]))]      # white not reached
    rep = verify.verify_members(list(r.members), manifest, r, mode="full", resume=True)
    after = green.files[green.files.index(shard) + 1:]
    assert [m.bytes_read for m in rep.members] == [
        0, manifest.file(shard).size - 2 * SET_PIECE + sum(manifest.file(f).size for f in after), manifest.size]
    assert {m.state for m in rep.members} == {"identical"}
    assert load_scrub(r) == {}                                                     # the run ended: nothing to resume


def test_a_sample_draws_over_all_the_files_of_the_model(rigset):
    rig, paths, models = rigset
    manifest = load_manifest(rigmod.load_rig(rig))
    code, doc = verify_json(rig, "--sample", "100", "--seed", "3")
    assert code == 0 and doc["sample_seed"] == 3
    assert all(m["pieces_checked"] == manifest.count and m["bytes_read"] == manifest.size for m in doc["members"])
    code, one = verify_json(rig, "--sample", "10", "--seed", "3")
    _, again = verify_json(rig, "--sample", "10", "--seed", "3")
    want = max(1, round(manifest.count / 10))
    assert [m["pieces_checked"] for m in one["members"]] == [want] * 3
    assert [[f["pieces_checked"] for f in m["files"]] for m in one["members"]] == \
        [[f["pieces_checked"] for f in m["files"]] for m in again["members"]]


def test_a_member_whose_drive_is_gone_is_one_row_however_many_files(rigset, tmp_path):
    rig, paths, models = rigset
    gone = os.path.dirname(paths[2]) if models[2].layout == "gguf-split" else paths[2]
    os.rename(gone, str(tmp_path / "unplugged"))
    n = len(models[2].files)
    for command in ("status", "verify"):
        r = invoke(command, "--rig", rig)
        assert r.exit_code == 3                 # status and verify: one mapping of states to codes
        rows = table_rows(r.stdout)
        assert len(rows) == 3 and f"missing ({n} of {n} files)" in rows[2]
    code, doc = verify_json(rig)
    assert [f["state"] for f in doc["members"][2]["files"]] == ["missing"] * n       # --json still lists each
