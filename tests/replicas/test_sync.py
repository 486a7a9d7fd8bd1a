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
from replicas import fanout
from replicas.cli import app
from core.coldio import ColdReader
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
    m = load_manifest(r).files[0]
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
    r = CliRunner().invoke(app, ["sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device", str(src),
                                 str(dests[0].parent / "unplugged")])
    assert r.exit_code == 3
    assert "no such directory" in r.output and "Traceback" not in r.output


def test_dry_run_writes_nothing(setup):
    src, data, dests, rig = setup
    r = CliRunner().invoke(app, ["sync", "--rig", rig, "--dry-run", "--json", "--piece-size", "1M", "--allow-same-device",
                                 str(src), str(dests[0])])
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


class RewrittenSource(ColdReader):
    """The copy's cold reader of the source, with the user rewriting the model at a set point
    in the copy: just before the block at `at` is read ('before'), or once every block has been
    read and the reader closes ('after'). The events are ordered by the hook, not by timing."""

    def __init__(self, path, rewrite, when, at=None):
        super().__init__(path)
        self.rewrite, self.when, self.at = rewrite, when, at

    def read_into(self, buffer, offset):
        if self.when == "before" and offset == self.at:
            self.rewrite()
        return super().read_into(buffer, offset)

    def close(self):
        if self.when == "after" and self.fd >= 0:
            self.rewrite()
        super().close()


OLD_MTIME_NS = 1_600_000_000 * 10**9      # the model was written long ago: any rewrite moves its mtime


@pytest.fixture
def copied_once(setup):
    """A verified replica on the first destination (stamped, its manifest trusted); the second is empty."""
    src, data, dests, rig = setup
    os.utime(src, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    first = sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True)
    assert first.exit_code == 0
    replica = dests[0] / "model.gguf"
    return src, data, dests, rig, (read(replica), os.stat(replica).st_ino)


def rewrite_tail(src, size, keep_mtime=False):
    def rewrite():          # the user rewrites the model's last bytes in place
        with open(src, "r+b") as f:
            f.seek(size - 10)
            f.write(b"0123456789")
        if keep_mtime:      # ... with a tool that puts the old mtime back
            os.utime(src, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    return rewrite


def assert_refused_and_nothing_renamed(excinfo, dests, rig, before):
    assert "the source changed during the copy" in str(excinfo.value)
    assert excinfo.value.exit_code == 1
    assert not os.path.exists(dests[1] / "model.gguf")                # nothing renamed into place
    replica = dests[0] / "model.gguf"
    assert (read(replica), os.stat(replica).st_ino) == before          # the verified replica untouched
    r = rigmod.load_rig(rig)
    assert [m.path for m in r.replicas] == [str(replica)]
    assert stamp_state(str(replica), load_manifest(r).files[0], r) == "verified"


@pytest.mark.parametrize("when", ["before", "after", "while-landing"])
def test_source_changed_mid_copy_is_refused_and_nothing_renamed(copied_once, monkeypatch, when):
    """Whichever check sees the change (the piece hash against the manifest, the identity checks
    during and after the copy), the refusal is the same. 'before': the last piece is rewritten
    just before it is read, so its hash differs; 'after': the model is rewritten once every
    block was read, so only the identity can tell; 'while-landing': rewritten from the progress
    of the copy, racing the reads on purpose."""
    src, data, dests, rig, before = copied_once
    rewrite = rewrite_tail(src, len(data))
    report = None
    if when == "while-landing":
        changed = []

        def report(ev):
            if isinstance(ev, Progress) and ev.phase == "copy" and ev.done >= 2 * PIECE and not changed:
                changed.append(True)
                rewrite()
    else:
        last_block = (len(data) // PIECE) * PIECE
        monkeypatch.setattr(fanout, "open_cold", lambda p: RewrittenSource(p, rewrite, when, at=last_block))
    with pytest.raises(MismatchError) as excinfo:
        sync(str(src), [str(dests[1])], rig, piece_size=PIECE, allow_same_device=True, report=report)
    assert_refused_and_nothing_renamed(excinfo, dests, rig, before)
    if when == "while-landing":
        assert changed
    elif when == "after":
        assert "modification time changed" in str(excinfo.value)


def test_changed_piece_with_the_old_mtime_is_the_same_refusal_naming_the_piece(copied_once, monkeypatch):
    """Only the hash can see bytes rewritten under an unchanged size, mtime and inode: the same
    refusal, and it names the piece and the drive check."""
    src, data, dests, rig, before = copied_once
    rewrite = rewrite_tail(src, len(data), keep_mtime=True)
    last = len(data) // PIECE
    monkeypatch.setattr(fanout, "open_cold", lambda p: RewrittenSource(p, rewrite, "before", at=last * PIECE))
    with pytest.raises(MismatchError) as excinfo:
        sync(str(src), [str(dests[1])], rig, piece_size=PIECE, allow_same_device=True)
    assert_refused_and_nothing_renamed(excinfo, dests, rig, before)
    assert f"piece {last} (bytes {last * PIECE}+{len(data) - last * PIECE})" in str(excinfo.value)
    assert "replicas verify --full" in str(excinfo.value)


def test_source_shrinking_mid_copy_is_the_same_refusal(copied_once, monkeypatch):
    """A short read is a changed source when the file shrank, not a missing drive."""
    src, data, dests, rig, before = copied_once

    def shrink():
        os.truncate(src, 4 * PIECE + 100)

    monkeypatch.setattr(fanout, "open_cold", lambda p: RewrittenSource(p, shrink, "before", at=5 * PIECE))
    with pytest.raises(MismatchError) as excinfo:
        sync(str(src), [str(dests[1])], rig, piece_size=PIECE, allow_same_device=True)
    assert_refused_and_nothing_renamed(excinfo, dests, rig, before)
    assert f"its size went from {len(data):,} to {4 * PIECE + 100:,} bytes" in str(excinfo.value)


def test_changed_source_exits_1_with_one_line_and_a_rerun_copies_the_new_contents(copied_once, monkeypatch):
    src, data, dests, rig, before = copied_once
    with monkeypatch.context() as m:
        m.setattr(fanout, "open_cold", lambda p: RewrittenSource(p, rewrite_tail(src, len(data)), "after"))
        r = CliRunner().invoke(app, ["sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device", str(src), str(dests[1])])
    assert r.exit_code == 1, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "the source changed during the copy" in lines[0] and "Traceback" not in r.output
    assert not os.path.exists(dests[1] / "model.gguf")
    res = sync(str(src), [str(dests[1])], rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 0 and res.dests[0].action == "copy"       # the old partial is started over
    assert read(dests[1] / "model.gguf") == read(src) != data


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
    monkeypatch.setattr("replicas.syncfacts.free_bytes", lambda path: 1000)
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


def test_a_read_only_destination_is_exit_4_as_the_readme_says(setup, monkeypatch):
    """The README's exit codes: 4 is 'a write failed (disk full, file too large, permission)'. A
    destination sync cannot write into is refused before a byte is read, with that code."""
    src, data, dests, rig = setup
    os.chmod(dests[0], 0o555)
    if os.geteuid() == 0:        # root writes through mode bits: the kernel's answer for a read-only mount
        real = os.access
        monkeypatch.setattr("replicas.syncfacts.os.access",
                            lambda p, mode: False if os.path.samefile(p, dests[0]) else real(p, mode))
    try:
        r = CliRunner().invoke(app, ["sync", "--rig", rig, str(src), str(dests[0]), "--allow-same-device", "-q"])
    finally:
        os.chmod(dests[0], 0o755)
    assert r.exit_code == 4, r.output
    assert "not writable" in r.output and os.listdir(dests[0]) == []
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    assert "| 4 | a write failed (disk full, file too large, permission)" in readme


def test_a_copy_keeps_the_source_files_mode(setup):
    """Shards kept 0600 (private) came out 0644 on every replica: each copy takes its source's
    permission bits (a file repair restores whole takes its donor's: test_verify_sets)."""
    src, data, dests, rig = setup
    os.chmod(src, 0o600)
    res = sync(str(src), [str(d) for d in dests], rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 0
    for d in dests:
        assert os.stat(d / "model.gguf").st_mode & 0o777 == 0o600


def test_a_destination_an_engine_cannot_be_given_is_warned_at_sync(setup, tmp_path):
    """A copy under a folder with ',' was accepted, and only export refused it later: sync asks
    the engines that read the model which characters they refuse and warns naming them."""
    from core.events import Notice
    from engines.registry import ENGINES
    from tests.helpers import write_split_gguf

    _, _, dests, rig = setup
    (src,) = write_split_gguf(tmp_path / "gguf", "m", 1, tensor_bytes=1 << 20)   # a model ds4-argodrive reads
    odd = tmp_path / "drive,2"
    odd.mkdir()
    events = []
    res = sync(str(src), [str(odd)], rig, piece_size=PIECE, allow_same_device=True, report=events.append)
    assert res.exit_code == 0                                   # allowed: only a warning
    warned = [e.message for e in events if isinstance(e, Notice) and "refuses a source path" in e.message]
    assert len(warned) == 1 and "ds4-argodrive" in warned[0] and "','" in warned[0]
    assert "," in ENGINES["ds4-argodrive"].path_forbidden       # the engine's own rule, not a list here
    events.clear()
    sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True, report=events.append)
    assert not [e for e in events if isinstance(e, Notice) and "refuses a source path" in e.message]


def test_quiet_silences_progress_and_notices_but_not_warnings(tmp_path):
    """`sync --quiet` with a destination an engine refuses: the warning still prints (it was a
    notice --quiet silenced), the ordinary notices do not."""
    from tests.helpers import write_split_gguf

    (src,) = write_split_gguf(tmp_path / "gguf", "m", 1, tensor_bytes=1 << 20)
    odd = tmp_path / "drive,2"
    odd.mkdir()
    rig = str(tmp_path / "rig")
    args = ["sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device", str(src), str(odd)]
    r = CliRunner().invoke(app, [*args[:1], "--quiet", *args[1:]])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "refuses a source path containing ','" in " ".join(r.stderr.split()), r.stderr
    again = CliRunner().invoke(app, [*args[:1], "--quiet", *args[1:]])                 # identical now: no notices
    assert again.exit_code == 0 and "identical" in again.stdout
    assert "refuses a source path" in " ".join(again.stderr.split())
