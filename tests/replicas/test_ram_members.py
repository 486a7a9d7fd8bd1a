"""RAM members at the replicas layer: what sync restores with no folder given, and what it never
takes for one (a missing member on a drive is not 'gone', it is missing)."""

import os
import shutil
import tempfile

import pytest
from typer.testing import CliRunner

from core.drives import drive_of
from core.rig import Member, Rig
from core.tiers import is_memory
from replicas.cli import app
from replicas.sync import gone_ram_dirs
from replicas.verify import group_by_drive
from tests.helpers import write_random

runner = CliRunner()


def test_sync_without_a_folder_restores_only_ram_members_that_are_gone(tmp_path):
    gone_on_disk = Member(str(tmp_path / "unplugged" / "model.bin"), "usb", "replica")
    gone_in_ram = Member(f"/dev/shm/replica-tuner-test-none-{os.getpid()}/model.bin", "ram", "replica")
    rig = Rig(root=str(tmp_path / "rig"), model=Member(str(tmp_path / "model.bin"), "disk", "primary"),
              replicas=(gone_on_disk, gone_in_ram))
    want = [os.path.dirname(gone_in_ram.path)] if is_memory("/dev/shm") else []
    assert gone_ram_dirs(rig) == want          # the unplugged drive is never "restored" into a folder on /


def test_sync_without_a_folder_and_nothing_to_restore_says_so(tmp_path):
    src = tmp_path / "model.bin"
    write_random(src, 1 << 20, seed=3)
    r = runner.invoke(app, ["sync", str(src), "--rig", str(tmp_path / "rig")])
    assert r.exit_code == 2 and "no RAM member of the rig is gone" in r.output


def test_members_in_ram_each_get_a_lane_keyed_by_their_drive(tmp_path):
    """verify reads members on one drive one after another, but a member in RAM has a lane of its
    own (no drive to share; lanes side by side keep the cores hashing), keyed by the drive it is
    on, so --max-rate still paces that drive as one."""
    if not (os.path.isdir("/dev/shm") and is_memory("/dev/shm")):
        pytest.skip("no tmpfs at /dev/shm")
    ram = tempfile.mkdtemp(prefix="replica-tuner-test-lanes-", dir="/dev/shm")
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        disk = [Member(str(tmp_path / d / "model.bin"), d, "replica") for d in ("a", "b")]
        in_ram = [Member(os.path.join(ram, f"m{i}.bin"), f"ram{i}", "replica") for i in range(2)]
        gone = Member(str(tmp_path / "unplugged" / "model.bin"), "usb", "replica")
        lanes = group_by_drive([disk[0], in_ram[0], disk[1], in_ram[1], gone])
        ram_key = drive_of(ram).key
        assert (ram_key, [in_ram[0]]) in lanes and (ram_key, [in_ram[1]]) in lanes
        if is_memory(str(tmp_path)):
            assert sum(1 for _, ms in lanes if ms in ([disk[0]], [disk[1]])) == 2
        else:
            assert (drive_of(str(tmp_path)).key, disk) in lanes
        assert ("missing:" + gone.path, [gone]) in lanes
        assert sorted(m.path for _, ms in lanes for m in ms) == sorted(m.path for m in disk + in_ram + [gone])
    finally:
        shutil.rmtree(ram)
