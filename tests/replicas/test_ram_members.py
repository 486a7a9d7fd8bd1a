"""RAM members at the replicas layer: what sync restores with no folder given, and what it never
takes for one (a missing member on a drive is not 'gone', it is missing)."""

import os

from typer.testing import CliRunner

from core.rig import Member, Rig
from replicas.cli import app
from replicas.sync import gone_ram_dirs
from tests.helpers import write_random

runner = CliRunner()


def test_sync_without_a_folder_restores_only_ram_members_that_are_gone(tmp_path):
    gone_on_disk = Member(str(tmp_path / "unplugged" / "model.bin"), "usb", "replica")
    gone_in_ram = Member(f"/dev/shm/replica-tuner-test-none-{os.getpid()}/model.bin", "ram", "replica")
    rig = Rig(root=str(tmp_path / "rig"), model=Member(str(tmp_path / "model.bin"), "disk", "primary"),
              replicas=(gone_on_disk, gone_in_ram))
    from core.tiers import is_memory

    want = [os.path.dirname(gone_in_ram.path)] if is_memory("/dev/shm") else []
    assert gone_ram_dirs(rig) == want          # the unplugged drive is never "restored" into a folder on /


def test_sync_without_a_folder_and_nothing_to_restore_says_so(tmp_path):
    src = tmp_path / "model.bin"
    write_random(src, 1 << 20, seed=3)
    r = runner.invoke(app, ["sync", str(src), "--rig", str(tmp_path / "rig")])
    assert r.exit_code == 2 and "no RAM member of the rig is gone" in r.output
