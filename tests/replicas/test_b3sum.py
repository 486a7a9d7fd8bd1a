"""b3sum's language: `replicas hash FILE...`, `hash --check`, and `verify --manifest` with a
manifest made elsewhere."""

import json
import os
import shutil
import subprocess

import pytest
import xattr

from core import rig as rigmod
from replicas import b3sum as b3mod
from core import platform
from replicas.b3sum import check_line, failures_warning, format_line, os_error_reason, parse_check_file
from tests.helpers import impure_imports, write_random
from tests.replicas.helpers import MiB, flip_byte, invoke

B3SUM = shutil.which("b3sum")
needs_b3sum = pytest.mark.skipif(B3SUM is None, reason="b3sum not installed (apt-get install b3sum); "
                                                       "the pure format tests below still run")


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Files with awkward names, addressed relative to the working directory as a user would."""
    monkeypatch.chdir(tmp_path)
    names = ["plain.bin", "with space.bin", "back\\slash.bin", "empty.bin"]
    for i, n in enumerate(names):
        write_random(tmp_path / n, 0 if n == "empty.bin" else 1 * MiB + 17 * i + 1, seed=i)
    return names


def b3sum(*args, **kw):
    return subprocess.run([B3SUM, *args], capture_output=True, text=True, **kw)


@needs_b3sum
def test_hash_prints_b3sums_lines_for_several_files(files):
    ours = invoke("hash", *files)
    assert ours.exit_code == 0, ours.output
    assert ours.stdout == b3sum(*files).stdout
    assert ours.stdout.splitlines()[2].startswith("\\")           # the escaped name, as b3sum marks it


@needs_b3sum
def test_check_reads_b3sums_files_and_answers_like_it(files, tmp_path):
    (tmp_path / "sums").write_text(b3sum(*files).stdout)
    ours = invoke("hash", "--check", "sums")
    assert ours.exit_code == 0 and ours.stdout == b3sum("--check", "sums").stdout
    assert ours.stdout.splitlines()[0] == "plain.bin: OK"
    # One changed, one gone: both FAILED, the missing one with b3sum's reason; counted together.
    flip_byte(tmp_path / files[1], 100)
    os.unlink(tmp_path / files[0])
    ours, theirs = invoke("hash", "--check", "sums"), b3sum("--check", "sums")
    assert ours.stdout == theirs.stdout
    assert ours.exit_code == theirs.returncode == 1
    assert "plain.bin: FAILED (No such file or directory (os error 2))" in ours.stdout
    assert "with space.bin: FAILED\n" in ours.stdout
    assert ours.stderr.strip().splitlines()[-1] == "replicas: WARNING: 2 computed checksums did NOT match"


def test_check_files_we_write_ourselves(files, tmp_path):
    sums = invoke("hash", *files).stdout
    (tmp_path / "sums").write_text(sums)
    r = invoke("hash", "-c", "sums", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["kind"] == "check" and doc["failed"] == 0 and [f["name"] for f in doc["files"]] == files
    os.mkdir(tmp_path / "gone")
    os.replace(tmp_path / files[3], tmp_path / "gone" / "x")
    os.mkdir(tmp_path / files[3])                                  # a directory where a file was
    r = invoke("hash", "-c", "sums")
    assert r.exit_code == 1
    assert "empty.bin: FAILED (Is a directory (os error 21))" in r.stdout
    assert "1 computed checksum did NOT match" in r.stderr


@pytest.mark.parametrize("text, words, code", [
    ("not a checksum line\n", "sums:1: not a b3sum line", 2),
    ("a" * 64 + " one-space\n", "sums:1: not a b3sum line", 2),
    ("\\" + "a" * 64 + "  bad\\escape\n", "sums:1: bad escape", 2),
    ("\n\n", "holds no checksum lines", 2),
])
def test_bad_check_files_are_one_line(tmp_path, monkeypatch, text, words, code):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sums").write_text(text)
    r = invoke("hash", "--check", "sums")
    assert r.exit_code == code and words in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_check_file_itself_missing_or_a_directory(tmp_path):
    assert invoke("hash", "--check", str(tmp_path / "nope")).exit_code == 3
    assert invoke("hash", "--check", str(tmp_path)).exit_code == 2


def test_hash_keeps_going_past_a_missing_file(files, tmp_path):
    r = invoke("hash", files[0], "nope.bin", files[1])
    assert r.exit_code == 3
    assert [line.split("  ", 1)[1] for line in r.stdout.splitlines()] == [files[0], files[1]]
    assert "nope.bin: no such file" in r.stderr


def test_the_format_module_is_pure_and_round_trips():
    assert impure_imports(b3mod) == []
    h = "0f" * 32
    for name in ("a", "a b", "back\\slash", "new\nline", "\\\\\n"):
        assert parse_check_file(format_line(h, name) + "\n", "f") == [(h, name)]
    assert format_line(h, "x\\y") == "\\" + h + "  x\\\\y"
    assert parse_check_file(h.upper() + "  a\r\n", "f") == [(h, "a")]
    assert check_line("a", True) == "a: OK"
    assert check_line("x\\y", False) == "\\x\\\\y: FAILED"
    assert check_line("a", False, os_error_reason("No such file or directory", 2)) == \
        "a: FAILED (No such file or directory (os error 2))"
    assert failures_warning("replicas", 1) == "replicas: WARNING: 1 computed checksum did NOT match"
    assert failures_warning("replicas", 3).endswith("3 computed checksums did NOT match")


# --- verify --manifest --------------------------------------------------------------------------

def test_verify_against_a_manifest_from_another_host(synced, tmp_path):
    rig, data, paths = synced
    portable = tmp_path / "from-host-a.json"
    shutil.copy(os.path.join(rig, "manifest.json"), portable)
    # Host B: copies of the model, no rig at all.
    host_b = tmp_path / "host-b"
    host_b.mkdir()
    copies = []
    for i in range(2):
        p = host_b / f"copy{i}.gguf"
        p.write_bytes(data)
        copies.append(str(p))
    flip_byte(copies[1], 4 * MiB + 3)
    no_rig = str(tmp_path / "host-b-rig")
    r = invoke("verify", "--rig", no_rig, "--manifest", portable, *copies, "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["manifest_file"] == str(portable)
    assert [m["state"] for m in doc["members"]] == ["identical", "mismatch"]
    assert [b["index"] for b in doc["members"][1]["bad"]] == [4]
    # Checked, not recorded: no stamp on those files and no rig appeared.
    for p in copies:
        with pytest.raises(OSError):
            xattr.getxattr(p, platform.stamp_xattr_name())
    assert not os.path.exists(no_rig)


def test_verify_the_rigs_members_against_another_manifest(synced, tmp_path):
    rig, data, paths = synced
    other = tmp_path / "other.bin"
    other.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    m = invoke("hash", "--json", "--piece-size", "1M", other)      # `hash --json` is a portable manifest too
    assert m.exit_code == 0
    (tmp_path / "other.json").write_text(m.stdout)
    r = invoke("verify", "--rig", rig, "--manifest", tmp_path / "other.json", "--json")
    assert r.exit_code == 1
    members = json.loads(r.stdout)["members"]
    assert all(x["state"] == "mismatch" and [b["index"] for b in x["bad"]] == [6] for x in members)
    # The rig's own verdicts are about its own manifest: status is untouched by that check.
    assert invoke("status", "--rig", rig).exit_code == 0
    # The rig's own manifest, given as a file, is the same manifest: recorded as usual.
    r = invoke("verify", "--rig", rig, "--manifest", os.path.join(rig, "manifest.json"))
    assert r.exit_code == 0


def test_verify_manifest_bad_input(synced, tmp_path):
    rig, data, paths = synced
    r = invoke("verify", "--rig", rig, "--manifest", tmp_path / "nope.json")
    assert r.exit_code == 3 and "nope.json" in r.output
    (tmp_path / "bad.json").write_text('{"schema": 1, "size": "big"}')
    r = invoke("verify", "--rig", rig, "--manifest", tmp_path / "bad.json")
    assert r.exit_code == 2 and "bad.json" in r.output and len(r.output.strip().splitlines()) == 1
    r = invoke("verify", "--rig", rig, tmp_path / "stranger.bin")  # without --manifest only members
    assert r.exit_code == 2 and "not a member" in r.output
    assert rigmod.load_rig(rig).members
