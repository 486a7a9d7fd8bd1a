"""verify, repair, status, hash and the rig file: what users see and the exit codes."""

import json
import os
import random
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from core import rig as rigmod
from replicas.cli import app
from replicas.sync import sync
from tests.helpers import model_and_drives, write_random

MiB = 1 << 20
PIECE = MiB
runner = CliRunner()


@pytest.fixture
def rig3(tmp_path):
    """A primary and two verified replicas."""
    src, data, dests = model_and_drives(tmp_path, 6 * MiB + 777, seed=2)
    rig = str(tmp_path / "rig")
    assert sync(str(src), [str(d) for d in dests], rig, piece_size=PIECE, allow_same_device=True).exit_code == 0
    return rig, data, [str(src)] + [str(d / "model.gguf") for d in dests]


def invoke(*args):
    return runner.invoke(app, list(args))


def test_quick_verify_trusts_live_stamps_and_reads_nothing(rig3):
    rig, data, paths = rig3
    r = invoke("verify", "--rig", rig, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [m["how"] for m in doc["members"]] == ["stamp"] * 3
    assert all(m["bytes_read"] == 0 for m in doc["members"])


def test_full_verify_rereads_everything(rig3):
    rig, data, paths = rig3
    doc = json.loads(invoke("verify", "--rig", rig, "--full", "--json").stdout)
    assert [m["bytes_read"] for m in doc["members"]] == [len(data)] * 3
    assert {m["state"] for m in doc["members"]} == {"identical"}


def test_flipped_byte_at_random_offset_names_the_right_piece(rig3):
    rig, data, paths = rig3
    off = random.Random(7).randrange(len(data))
    with open(paths[2], "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))
    r = invoke("verify", "--rig", rig, "--json")       # mtime moved: the stamp is stale, quick re-reads
    assert r.exit_code == 1
    bad = json.loads(r.stdout)["members"][2]
    assert bad["state"] == "mismatch" and bad["how"] == "full"
    assert bad["bad"] == [{"file": "model.gguf", "index": off // PIECE, "offset": off // PIECE * PIECE,
                           "length": min(PIECE, len(data) - off // PIECE * PIECE)}]
    r = invoke("verify", "--rig", rig)                  # the human form names piece, offset, length
    assert f"bad piece {off // PIECE} at byte {off // PIECE * PIECE}" in r.output


def test_changed_after_stamping_with_mtime_restored(rig3):
    rig, data, paths = rig3
    st = os.stat(paths[1])
    with open(paths[1], "r+b") as f:
        f.seek(3 * MiB + 5)
        f.write(b"\0\1\2")
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    # Quick verify keys on (size, mtime_ns, inode, device) by design (docs/replicas.md): it cannot see this.
    assert invoke("verify", "--rig", rig).exit_code == 0
    # --full and a sample that covers the piece do.
    r = invoke("verify", "--rig", rig, "--full", "--json")
    assert r.exit_code == 1
    assert [b["index"] for b in json.loads(r.stdout)["members"][1]["bad"]] == [3]
    r = invoke("verify", "--rig", rig, paths[1], "--sample", "100", "--json")
    assert r.exit_code == 1


def test_truncated_replica_is_a_mismatch_with_the_missing_pieces(rig3):
    rig, data, paths = rig3
    os.truncate(paths[2], 2 * MiB + 10)
    r = invoke("verify", "--rig", rig, "--json")
    assert r.exit_code == 1
    m = json.loads(r.stdout)["members"][2]
    assert m["state"] == "mismatch" and "size" in m["detail"]
    assert [b["index"] for b in m["bad"]] == [2, 3, 4, 5, 6]


def test_missing_drive_is_exit_3_and_the_others_are_still_checked(rig3):
    rig, data, paths = rig3
    shutil.move(os.path.dirname(paths[1]), os.path.dirname(paths[1]) + "-unplugged")
    r = invoke("verify", "--rig", rig, "--full", "--json")
    assert r.exit_code == 3
    states = [m["state"] for m in json.loads(r.stdout)["members"]]
    assert states == ["identical", "missing", "identical"]


def test_mismatch_outranks_missing(rig3):
    rig, data, paths = rig3
    os.unlink(paths[1])
    os.truncate(paths[2], 10)
    assert invoke("verify", "--rig", rig).exit_code == 1


def test_repair_recopies_only_bad_pieces(rig3):
    rig, data, paths = rig3
    with open(paths[1], "r+b") as f:
        f.seek(MiB + 1)
        f.write(b"XX")
        f.seek(5 * MiB)
        f.write(b"YY")
    r = invoke("repair", paths[1], "--rig", rig, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [p["index"] for p in doc["repaired"]] == [1, 5] and doc["bytes_copied"] == 2 * MiB
    assert doc["after"] == "identical"
    with open(paths[1], "rb") as f:
        assert f.read() == data
    assert invoke("verify", "--rig", rig).exit_code == 0


def test_repair_a_truncated_replica_and_refuse_the_primary(rig3):
    rig, data, paths = rig3
    os.truncate(paths[2], MiB)
    assert invoke("repair", paths[2], "--rig", rig, "--from", paths[1]).exit_code == 0
    with open(paths[2], "rb") as f:
        assert f.read() == data
    r = invoke("repair", paths[0], "--rig", rig)
    assert r.exit_code == 2 and "primary" in r.output


def test_status_states(rig3):
    rig, data, paths = rig3
    os.utime(paths[1], ns=(1, 1))
    os.unlink(paths[2])
    doc = json.loads(invoke("status", "--rig", rig, "--json").stdout)
    assert [m["state"] for m in doc["members"]] == ["verified", "stale", "missing"]
    assert doc["members"][0]["fs_type"] and doc["members"][0]["mount_point"]
    assert doc["members"][0]["last_verified"] is not None
    assert doc["members"][0]["devno"] and {"fs_uuid", "serial", "wwn"} <= set(doc["members"][0])
    r = invoke("status", "--rig", rig)
    assert r.exit_code == 3 and "stale" in r.output          # a member's file is missing: verify's code too
    assert invoke("verify", "--rig", rig).exit_code == 3
    t = doc["topology"]
    if t["source"] == "sysfs" and t["drives"][0]["links"]:     # all three in one folder: one disk (the missing one's folder)
        g, = t["groups"]
        assert g["drives"] == [m["name"] for m in doc["members"]]
        assert f"share {g['reason']}" in " ".join(r.output.split())


def test_status_gives_the_code_verify_gives(rig3):
    """A file of another size than the manifest's cannot be identical (1); a stale stamp alone is 0."""
    rig, data, paths = rig3
    os.utime(paths[1], ns=(1, 1))
    assert invoke("status", "--rig", rig).exit_code == 0
    os.truncate(paths[2], MiB)
    r = invoke("status", "--rig", rig, "--json")
    assert r.exit_code == 1 and [m["state"] for m in json.loads(r.stdout)["members"]][2] == "mismatch"


@pytest.mark.parametrize("text, key", [
    ("schema = 1\n[model]\npath = 'relative/model.gguf'\nname = 'a'\n", "model.path"),
    ("schema = 1\n[model]\npath = '/m'\nname = 'a'\n[[replica]]\npath = '/r'\nname = 'a'\n", "replica[0].name"),
    ("schema = 1\n[model\n", "not valid TOML"),
    ("schema = 7\n", "schema"),
    ("schema = 1\ncolour = 'blue'\n", "colour"),
])
def test_malformed_rig_toml_is_one_line_exit_2(tmp_path, text, key):
    rig = tmp_path / "rig"
    rig.mkdir()
    (rig / "rig.toml").write_text(text)
    r = invoke("status", "--rig", str(rig))
    assert r.exit_code == 2
    assert str(rig / "rig.toml") in r.output and key in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_a_rig_toml_that_is_a_folder_says_so(tmp_path):
    (tmp_path / "rig" / "rig.toml").mkdir(parents=True)
    r = invoke("status", "--rig", str(tmp_path / "rig"))
    assert r.exit_code == 2 and "rig.toml: a folder where a file was expected" in r.output, r.output
    assert "permissions" not in r.output and len(r.output.strip().splitlines()) == 1


def test_init_writes_a_rig_that_loads(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"x" * 4092)      # a GGUF by its magic: init refuses what is no model
    rig = str(tmp_path / "rig")
    assert invoke("init", "--rig", rig, "--model", str(model), "--name", "internal").exit_code == 0
    r = rigmod.load_rig(rig)
    assert r.model.path == str(model) and r.model.name == "internal"
    assert invoke("init", "--rig", rig, "--model", str(tmp_path / "nope")).exit_code == 3


def test_rig_from_environment(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"x" * 4092)      # a GGUF by its magic: init refuses what is no model
    monkeypatch.setenv("REPLICA_TUNER_RIG", str(tmp_path / "envrig"))
    assert invoke("init", "--model", str(model)).exit_code == 0
    assert os.path.exists(tmp_path / "envrig" / "rig.toml")


def test_hash_json_and_bad_input(tmp_path):
    p = tmp_path / "f.bin"
    data = write_random(p, 3 * MiB + 5, seed=3)
    doc = json.loads(invoke("hash", str(p), "--piece-size", "1M", "--json").stdout)
    assert doc["size"] == len(data) and doc["piece_size"] == MiB and len(doc["pieces"]) == 4
    assert invoke("hash", str(tmp_path)).exit_code == 2
    assert invoke("hash", str(tmp_path / "nope")).exit_code == 3
    r = invoke("hash", str(p), "--piece-size", "1000")
    assert r.exit_code == 2 and "multiple of 4096" in r.output


@pytest.mark.skipif(shutil.which("b3sum") is None, reason="b3sum not installed (apt-get install b3sum)")
@pytest.mark.parametrize("size", [0, 1, 4095, 1 << 20, 5 * MiB + 3])
def test_hash_agrees_with_b3sum(tmp_path, size):
    p = tmp_path / "f.bin"
    write_random(p, size, seed=size)
    ours = invoke("hash", str(p)).stdout
    theirs = subprocess.run(["b3sum", str(p)], capture_output=True, text=True, check=True).stdout
    assert ours == theirs
