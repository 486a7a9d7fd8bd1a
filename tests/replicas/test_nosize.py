"""File systems that report no size (statvfs f_blocks == 0: ramfs, some network and FUSE
mounts): free space is unknown, said once, and the copy goes ahead; a write that fails there is
still exit 4 with nothing lost."""

import os
import resource
import shutil
import subprocess
import sys
import textwrap

import pytest

from core.events import Notice
from replicas.sync import sync
from tests.helpers import model_and_drives
from tests.replicas.helpers import PIECE, MiB

UNKNOWN = "free space unknown"


def read(p):
    with open(p, "rb") as f:
        return f.read()


class NoSize:
    """What statvfs says on ramfs: no blocks, no free blocks."""

    f_bsize = f_frsize = 4096
    f_blocks = f_bfree = f_bavail = f_files = f_ffree = f_favail = 0
    f_flag, f_namemax = 0, 255


def test_unknown_free_space_is_said_once_and_the_copy_goes_ahead(tmp_path, monkeypatch):
    src, data, dests = model_and_drives(tmp_path, 3 * MiB + 5, seed=5)
    monkeypatch.setattr(os, "statvfs", lambda path: NoSize())
    events = []
    res = sync(str(src), [str(d) for d in dests], str(tmp_path / "rig"), piece_size=PIECE, allow_same_device=True,
               report=events.append)
    assert res.exit_code == 0
    said = [e for e in events if isinstance(e, Notice) and UNKNOWN in e.message]
    assert len(said) == 1                               # both destinations are on one file system
    assert all(str(d) in said[0].task for d in dests)
    assert all(read(d / "model.gguf") == data for d in dests)


SCRIPT = textwrap.dedent("""
    import os, sys

    class NoSize:
        f_bsize = f_frsize = 4096
        f_blocks = f_bfree = f_bavail = f_files = f_ffree = f_favail = 0
        f_flag, f_namemax = 0, 255

    os.statvfs = lambda path: NoSize()
    from replicas.cli import main
    sys.argv = ["replicas"] + sys.argv[1:]
    main()
""")


def test_a_write_failure_where_space_is_unknown_is_exit_4_and_loses_nothing(tmp_path):
    src, data, dests = model_and_drives(tmp_path, 9 * MiB + 12345, seed=6)
    rig = str(tmp_path / "rig")
    assert sync(str(src), [str(dests[0])], rig, piece_size=PIECE, allow_same_device=True).exit_code == 0
    before = read(dests[0] / "model.gguf")
    limit = 3 * MiB

    def limit_writes():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run([sys.executable, "-c", SCRIPT, "sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device",
                        str(src), str(dests[1])], capture_output=True, text=True, preexec_fn=limit_writes,
                       cwd=os.getcwd())
    assert p.returncode == 4, p.stderr + p.stdout
    assert p.stderr.count(UNKNOWN) == 1 and "Traceback" not in p.stderr
    assert "write failed" in p.stdout + p.stderr
    assert read(src) == data and read(dests[0] / "model.gguf") == before
    assert not os.path.exists(dests[1] / "model.gguf")
    assert os.path.exists(dests[1] / "model.gguf.partial")          # durable pieces kept for a resume


@pytest.fixture
def ramfs(tmp_path):
    """A real ramfs (statvfs says 0 blocks), mounted only when the test runs as root."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a ramfs needs root and mount(8); the monkeypatched statvfs tests cover the logic")
    where = tmp_path / "ramfs"
    where.mkdir()
    p = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(where)], capture_output=True, text=True)
    if p.returncode:
        pytest.skip(f"cannot mount a ramfs here: {p.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_real_ramfs(tmp_path, ramfs):
    assert os.statvfs(ramfs).f_blocks == 0
    src, data, dests = model_and_drives(tmp_path, 2 * MiB + 1, seed=7)
    events = []
    res = sync(str(src), [str(ramfs)], str(tmp_path / "rig"), piece_size=PIECE, allow_same_device=True,
               report=events.append)
    assert res.exit_code == 0, res
    assert sum(isinstance(e, Notice) and UNKNOWN in e.message for e in events) == 1
    assert read(ramfs / "model.gguf") == data
