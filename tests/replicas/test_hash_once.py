"""Hashing once, at the drives' pace (docs/replicas.md, "Hashing at the drives' pace"): the
digests every path computes equal b3sum's and the manifest's, from a drive (O_DIRECT) and from
RAM (a map of a tmpfs file); `replicas hash` of plain files answers as the full command does; a
corrupted byte is named to its piece."""

import json
import os
import shutil
import subprocess
import sys
import threading

import blake3
import pytest

from core.coldio import open_cold, read_sequential
from replicas.hashing import PieceHasher, hash_file, hash_whole
from tests.helpers import write_random
from tests.replicas.helpers import MiB, PIECE, flip_byte, invoke

B3SUM = shutil.which("b3sum")
SHM = "/dev/shm"
needs_b3sum = pytest.mark.skipif(B3SUM is None, reason="b3sum not installed (apt-get install b3sum)")
needs_shm = pytest.mark.skipif(not os.path.isdir(SHM) or not os.access(SHM, os.W_OK), reason="no writable /dev/shm (tmpfs)")


@pytest.fixture
def ram_dir(tmp_path):
    """A folder in RAM (tmpfs), removed after the test."""
    d = os.path.join(SHM, f"replica-tuner-test-{os.getpid()}-{tmp_path.name}")
    os.makedirs(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def plain_pieces(data: bytes, piece: int) -> tuple[str, ...]:
    return tuple(blake3.blake3(data[o:o + piece]).hexdigest() for o in range(0, len(data), piece))


@needs_b3sum
@needs_shm
@pytest.mark.parametrize("size", [0, 1, 4096, 3 * MiB + 4096, 5 * MiB + 12345])
def test_digests_equal_b3sums_and_each_pieces_own_from_a_drive_and_from_ram(tmp_path, ram_dir, size):
    disk = tmp_path / "model.bin"
    data = write_random(disk, size, seed=size)
    ram = os.path.join(ram_dir, "model.bin")
    shutil.copyfile(disk, ram)
    with open_cold(str(disk)) as r:
        assert not r.in_memory
    with open_cold(ram) as r:
        assert r.in_memory                                      # tmpfs: served from a map of the file
    want = subprocess.run([B3SUM, "--no-names", str(disk)], capture_output=True, text=True).stdout.strip()
    for path in (str(disk), ram):
        m = hash_file(path, PIECE)
        assert m.blake3 == want == hash_whole(path)
        assert m.pieces == plain_pieces(data, PIECE)             # each piece: the BLAKE3 of its own bytes
        assert m.size == size


@needs_shm
def test_ram_reads_are_paced_cancelled_and_cut_like_reads(ram_dir):
    path = os.path.join(ram_dir, "f")
    data = write_random(path, 3 * MiB + 100, seed=3)
    paced = []
    with open_cold(path) as r:
        got = [(off, bytes(v)) for off, v in read_sequential(r, MiB, r.size, block=MiB, pace=paced.append)]
        assert [off for off, _ in got] == [MiB, 2 * MiB, 3 * MiB]
        assert b"".join(b for _, b in got) == data[MiB:]
        assert paced == [MiB, MiB, 100]                           # each block paid before it is served
        cancel = threading.Event()
        seen = []
        for off, _ in read_sequential(r, 0, r.size, block=MiB, cancel=cancel):
            seen.append(off)
            cancel.set()
        assert seen == [0]


def test_piece_hasher_asked_for_one_digest_computes_that_one():
    data = os.urandom(3 * 4096 + 5)
    whole = PieceHasher(4096, pieces=False)
    assert whole.update(data) == [] and whole.finish() == [] and whole.pos == len(data)
    assert whole.whole.hexdigest() == blake3.blake3(data).hexdigest() and whole.pieces == {}
    pieces = PieceHasher(4096, whole=False)
    assert pieces.update(data) == [0, 1, 2] and pieces.finish() == [3]
    assert tuple(pieces.pieces[i] for i in range(4)) == plain_pieces(data, 4096) and pieces.whole is None


def run_console_script(*args, cwd):
    """`replicas ARGS` as the console script runs it (stderr a pipe, so no progress is drawn)."""
    return subprocess.run([sys.executable, "-c", "from replicas.main import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, env={**os.environ, "REPLICAS_PROGRESS": ""})


def test_the_console_scripts_quick_hash_prints_what_the_full_command_prints(tmp_path, monkeypatch):
    names = ["plain.bin", "with space.bin", "back\\slash.bin", "empty.bin"]
    for i, n in enumerate(names):
        write_random(tmp_path / n, 0 if n == "empty.bin" else MiB + 7 * i, seed=i)
    quick = run_console_script("hash", *names, cwd=tmp_path)
    monkeypatch.chdir(tmp_path)         # restored after the test: later tests (and Ray's workers) need the repository's
    full = invoke("hash", *names)
    assert quick.returncode == full.exit_code == 0
    assert quick.stdout == full.stdout and quick.stdout.splitlines()[2].startswith("\\")
    # A missing file, or an option: the full command answers (the same lines, errors and code).
    missing = run_console_script("hash", "plain.bin", "gone.bin", cwd=tmp_path)
    full = invoke("hash", "plain.bin", "gone.bin")
    assert missing.returncode == full.exit_code == 3
    assert missing.stdout == full.stdout and missing.stderr.strip() == "replicas: error: gone.bin: no such file"
    doc = json.loads(run_console_script("hash", "--json", "plain.bin", cwd=tmp_path).stdout)
    assert doc["kind"] == "manifest" and len(doc["pieces"]) == 1


def test_a_corrupted_byte_is_named_to_its_piece(synced):
    rig, data, paths = synced
    flip_byte(paths[2], 3 * PIECE + 777)
    r = invoke("verify", "--rig", rig, "--full", "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    bad = {m["path"]: m["bad"] for m in doc["members"]}
    assert bad[paths[0]] == bad[paths[1]] == []
    assert bad[paths[2]] == [{"file": "model.gguf", "index": 3, "offset": 3 * PIECE, "length": PIECE}]
    assert f"{paths[2]}: bad piece 3 at byte {3 * PIECE}" in invoke("verify", "--rig", rig, "--full").stderr
