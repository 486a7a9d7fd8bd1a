"""Reading a drive's queue limits from sysfs: a fake tree in tmp_path with a partition, a loop
device and a device-mapper device over members with other limits."""

import os
import sys

import pytest

from iobench import devlimits
from iobench.devlimits import queue_limits, sysfs_limits
from iobench.iounit import QUEUE_KEYS

KiB = 1 << 10


def write_queue(folder, **values):
    q = folder / "queue"
    q.mkdir(parents=True)
    for k, v in values.items():
        (q / k).write_text(f"{v}\n")


NVME = dict(max_sectors_kb=128, max_hw_sectors_kb=128, max_segments=33, max_segment_size=4294967295,
            logical_block_size=512, physical_block_size=512, optimal_io_size=0, minimum_io_size=512,
            rotational=0, nr_requests=1023)
LOOP = dict(max_sectors_kb=1280, max_hw_sectors_kb=1280, max_segments=128, max_segment_size=65536,
            logical_block_size=512, physical_block_size=512, optimal_io_size=0, minimum_io_size=512,
            rotational=1, nr_requests=128)
DM = dict(LOOP, max_sectors_kb=512, max_segments=64, nr_requests=256)


@pytest.fixture
def sys_tree(tmp_path):
    """/sys/devices/... with nvme0n1 (partition nvme0n1p2), loop3 and dm-0 (over nvme0n1p2), and
    /sys/dev/block/MAJ:MIN links to them, as the kernel lays them out."""
    root = tmp_path / "sys"
    nvme = root / "devices/pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1"
    write_queue(nvme, **NVME)
    part = nvme / "nvme0n1p2"
    part.mkdir()
    (part / "partition").write_text("2\n")
    loop = root / "devices/virtual/block/loop3"
    write_queue(loop, **LOOP)
    dm = root / "devices/virtual/block/dm-0"
    write_queue(dm, **DM)
    (dm / "slaves").mkdir()
    os.symlink(part, dm / "slaves" / "nvme0n1p2")
    links = root / "dev/block"
    links.mkdir(parents=True)
    for majmin, target in (("259:0", nvme), ("259:2", part), ("7:3", loop), ("253:0", dm)):
        os.symlink(os.path.relpath(target, links), links / majmin)
    return root


def test_a_partition_reads_its_disks_queue(sys_tree):
    q = sysfs_limits("259:2", str(sys_tree))
    assert q.source == "sysfs" and q.device == "nvme0n1"
    assert (q.max_sectors_kb, q.max_segments, q.nr_requests, q.rotational) == (128, 33, 1023, False)
    assert q.request_bytes == 128 * KiB                  # 33 pages would be 132 KiB: max_sectors binds
    assert sysfs_limits("259:0", str(sys_tree)) == q     # the whole disk: the same queue


def test_a_loop_device_reads_its_own_queue(sys_tree):
    q = sysfs_limits("7:3", str(sys_tree))
    assert q.device == "loop3" and q.rotational is True
    assert {k: getattr(q, k) for k in QUEUE_KEYS if k != "rotational"} == {k: v for k, v in LOOP.items() if k != "rotational"}
    assert q.request_bytes == 512 * KiB and q.units() == (512 * KiB, 1280 * KiB)


def test_device_mapper_reads_the_top_devices_queue_not_its_members(sys_tree):
    q = sysfs_limits("253:0", str(sys_tree))
    assert q.device == "dm-0" and (q.max_sectors_kb, q.max_segments, q.nr_requests) == (512, 64, 256)
    assert q.request_bytes == 64 * 4096


def test_a_device_without_a_queue_or_with_unreadable_files(sys_tree):
    assert sysfs_limits("8:99", str(sys_tree)).source == "unknown"           # no such device
    loop = sys_tree / "devices/virtual/block/loop3/queue"
    os.remove(loop / "max_segments")
    (loop / "nr_requests").unlink()
    (loop / "nr_requests").mkdir()                                            # read fails: left out
    q = sysfs_limits("7:3", str(sys_tree))
    assert q.max_segments is None and q.nr_requests is None and q.max_sectors_kb == 1280
    assert q.request_bytes == 1280 * KiB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sysfs path is Linux's")
def test_queue_limits_of_a_file_follow_its_device_number(tmp_path, sys_tree):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"\0" * 4096)
    st = os.stat(f)
    majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    links = sys_tree / "dev/block"
    if (links / majmin).exists():
        (links / majmin).unlink()
    os.symlink(os.path.relpath(sys_tree / "devices/virtual/block/loop3", links), links / majmin)
    q = queue_limits(str(f), sys_root=str(sys_tree))
    assert q.device == "loop3" and q.request_bytes == 512 * KiB
    assert queue_limits(str(tmp_path / "gone"), sys_root=str(sys_tree)).source == "unknown"


def test_macos_asks_ioreg_for_the_whole_disk(monkeypatch):
    """The macOS path (unconfirmed on a real Mac): ioreg's output for the drive's whole disk."""
    calls = []

    class Done:
        stdout = ('+-o IOBlockStorageDriver  <class IOBlockStorageDriver>\n  | {\n'
                  '  |   "IOMaximumByteCountRead" = 2097152\n  | }\n'
                  '  +-o Media  <class IOMedia>\n      {\n        "BSD Name" = "disk4"\n      }\n')

    def fake_run(args, **kw):
        calls.append(args)
        return Done()

    monkeypatch.setattr(devlimits.subprocess, "run", fake_run)
    monkeypatch.setattr(devlimits.platform, "is_linux", lambda: False)
    monkeypatch.setattr(devlimits.platform, "is_darwin", lambda: True)
    q = queue_limits(__file__, disk="disk4")
    assert calls and calls[0][0] == "ioreg"
    assert (q.source, q.device, q.max_sectors_kb, q.request_bytes) == ("ioreg", "disk4", 2048, 2 * 1024 * KiB)
    assert queue_limits(__file__, disk="").source == "unknown"
