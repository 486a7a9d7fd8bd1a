"""Round trips, resume, failure modes of `replicas sync` (no root; everything in tmp_path)."""

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from core import rig as rigmod
from core.errors import MismatchError, UsageError
from core.events import Progress
from replicas.cli import app
from replicas.hashing import hash_file
from replicas.journal import read_journal
from replicas.manifests import load_manifest
from replicas.stamps import stamp_state
from replicas.sync import sync
from tests.helpers import model_and_drives

MiB = 1 << 20
PIECE = 1 * MiB


@pytest.fixture
def setup(tmp_path):
    src, data, dests = model_and_drives(tmp_path, 9 * MiB + 12345, seed=1)
    return src, data, dests, str(tmp_path / "rig")


def read(p):
    with open(p, "rb") as f:
        return f.read()


def test_round_trip_two_destinations(setup):
    src, data, dests, rig = setup
    st_before = os.stat(src)
    res = sync(str(src), [str(d) for d in dests], rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 0
    assert res.source_bytes_read == len(data)          # the source is read once for both
    for d in dests:
        assert read(d / "model.gguf") == data
        assert not os.path.exists(str(d / "model.gguf") + ".partial")
        assert not os.path.exists(str(d / "model.gguf") + ".partial.journal")
        assert os.stat(d / "model.gguf").st_mtime_ns == st_before.st_mtime_ns
    assert os.stat(src).st_mtime_ns == st_before.st_mtime_ns and read(src) == data
    r = rigmod.load_rig(rig)
    m = load_manifest(r)
    assert m == hash_file(str(src), PIECE)
    assert [x.path for x in r.members] == [str(src)] + [str(d / "model.gguf") for d in dests]
    assert all(stamp_state(x.path, m, r) == "verified" for x in r.members)


def test_identical_replica_is_a_noop(setup):
    src, data, dests, rig = setup
    sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    res = sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert res.dests[0].action == "noop" and res.dests[0].bytes_written == 0
    assert res.source_bytes_read == 0                  # a trusted manifest and stamp: nothing read


def test_existing_identical_unstamped_file_is_adopted_not_rewritten(setup):
    src, data, dests, rig = setup
    (dests[0] / "model.gguf").write_bytes(data)
    ino = os.stat(dests[0] / "model.gguf").st_ino
    res = sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 0 and res.dests[0].action == "adopt" and res.dests[0].bytes_written == 0
    assert os.stat(dests[0] / "model.gguf").st_ino == ino


def test_existing_different_file_is_refused_unless_replace(setup):
    src, data, dests, rig = setup
    other = dests[0] / "model.gguf"
    other.write_bytes(b"not the model")
    with pytest.raises(UsageError, match="--replace"):
        sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert read(other) == b"not the model"
    same_size = bytearray(data)
    same_size[5] ^= 1
    other.write_bytes(bytes(same_size))
    res = sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 1 and "--replace" in res.dests[0].error
    assert read(other) == bytes(same_size)             # never overwritten without the flag
    res = sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True, replace_existing=True)
    assert res.exit_code == 0 and read(other) == data


def test_same_device_is_refused_by_default(setup):
    src, data, dests, rig = setup
    with pytest.raises(UsageError, match="same physical drive"):
        sync(str(src), [str(dests[0])], rig, piece_size=PIECE)
    assert not os.listdir(dests[0])


def test_missing_destination_is_exit_3(setup):
    src, data, dests, rig = setup
    r = CliRunner().invoke(app, ["sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device", str(src), str(dests[0].parent / "unplugged")])
    assert r.exit_code == 3
    assert "no such directory" in r.output and "Traceback" not in r.output


def test_dry_run_writes_nothing(setup):
    src, data, dests, rig = setup
    r = CliRunner().invoke(app, ["sync", "--rig", rig, "--dry-run", "--json", "--piece-size", "1M", "--allow-same-device", str(src), str(dests[0])])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["dry_run"] and doc["destinations"][0]["bytes_to_write"] == len(data)
    assert not os.listdir(dests[0]) and not os.path.exists(rig)


def _durable_bytes(journal, size):
    header, durable = read_journal(journal)
    return sum(min(PIECE, size - i * PIECE) for i in durable)


def test_resume_after_kill_9_copies_only_what_was_not_durable(setup):
    src, data, dests, rig = setup
    # A real kill -9 in the middle of a copy: the child kills itself once 4 pieces are durable.
    script = textwrap.dedent(f"""
        import os, signal, time
        from replicas.sync import sync
        import threading
        real_pwrite = os.pwrite
        one_at_a_time = threading.Lock()
        def slow_drive(fd, data, offset):   # a slow drive taking one write at a time: pieces land one by one
            with one_at_a_time:
                time.sleep(0.05)
            return real_pwrite(fd, data, offset)
        os.pwrite = slow_drive
        from core.events import Progress
        def report(ev):
            if isinstance(ev, Progress) and ev.phase == "copy" and ev.done >= 4 * {PIECE}:
                os.kill(os.getpid(), signal.SIGKILL)
        sync({str(src)!r}, {[str(d) for d in dests]!r}, {rig!r}, piece_size={PIECE}, allow_same_device=True, report=report)
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()
    durable = {}
    for d in dests:
        t = str(d / "model.gguf")
        assert not os.path.exists(t) and os.path.exists(t + ".partial")
        durable[t] = _durable_bytes(t + ".partial.journal", len(data))
        assert PIECE <= durable[t] < len(data)          # some pieces durable, not all
    res = sync(str(src), [str(d) for d in dests], rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 0
    for dr in res.dests:
        assert dr.action == "resume"
        assert dr.bytes_written == len(data) - durable[dr.target]   # count the bytes: durable pieces not recopied
        assert read(dr.target) == data


def test_ctrl_c_keeps_durable_pieces(setup, monkeypatch):
    src, data, dests, rig = setup
    import threading
    import time

    real_pwrite = os.pwrite
    one_at_a_time = threading.Lock()

    def slow_drive(fd, data, offset):
        with one_at_a_time:
            time.sleep(0.05)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", slow_drive)

    cancel = threading.Event()

    def report(ev):
        if isinstance(ev, Progress) and ev.phase == "copy" and ev.done >= 2 * PIECE:
            cancel.set()

    from core.errors import Interrupted
    with pytest.raises(Interrupted):
        sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True, report=report, cancel=cancel)
    t = str(dests[0] / "model.gguf")
    kept = _durable_bytes(t + ".partial.journal", len(data))
    assert kept >= 2 * PIECE and not os.path.exists(t)
    res = sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert res.dests[0].bytes_written == len(data) - kept and read(t) == data


def test_source_changed_mid_copy_is_refused_and_nothing_renamed(setup):
    src, data, dests, rig = setup
    first = sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert first.exit_code == 0
    verified_replica = read(dests[0] / "model.gguf")
    changed = {"done": False}

    def report(ev):
        if isinstance(ev, Progress) and ev.phase == "copy" and ev.done >= 2 * PIECE and not changed["done"]:
            changed["done"] = True
            with open(src, "r+b") as f:    # the user rewrites the model while we copy it
                f.seek(len(data) - 10)
                f.write(b"0123456789")

    with pytest.raises(MismatchError, match="changed during the copy"):
        sync(str(src), [str(dests[1])], rig, piece_size=PIECE, allow_same_device=True, report=report)
    assert not os.path.exists(dests[1] / "model.gguf")               # nothing renamed into place
    assert read(dests[0] / "model.gguf") == verified_replica          # the verified replica untouched


def test_write_failure_rlimit_fsize_is_exit_4_and_loses_nothing(setup, tmp_path):
    src, data, dests, rig = setup
    sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    before = read(dests[0] / "model.gguf")
    third = tmp_path / "third"
    third.mkdir()
    limit = 3 * MiB

    def limit_writes():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run([sys.executable, "-m", "replicas.cli", "sync", "--rig", rig, "--piece-size", "1M",
                        "--allow-same-device", str(src), str(third)], capture_output=True, text=True,
                       preexec_fn=limit_writes)
    assert p.returncode == 4, p.stderr + p.stdout
    assert "write failed" in p.stdout + p.stderr and "Traceback" not in p.stderr
    assert read(src) == data and read(dests[0] / "model.gguf") == before
    assert not os.path.exists(third / "model.gguf")
    assert os.path.exists(third / "model.gguf.partial")                # durable pieces kept for a resume
    res = sync(str(src), [str(third)], rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 0 and read(third / "model.gguf") == data


def test_not_enough_space_is_refused_before_writing(setup, monkeypatch):
    src, data, dests, rig = setup
    monkeypatch.setattr("replicas.sync.free_bytes", lambda path: 1000)
    with pytest.raises(Exception, match="not enough free space"):
        sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert not os.listdir(dests[0])


def test_foreign_partial_file_is_not_touched(setup):
    src, data, dests, rig = setup
    foreign = dests[0] / "model.gguf.partial"
    foreign.write_bytes(b"someone else's")
    with pytest.raises(UsageError, match="not written by replicas"):
        sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert read(foreign) == b"someone else's"
