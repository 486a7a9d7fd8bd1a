"""The cold-read seam and the platform logic (macOS logic tested here without macOS)."""

import os
import plistlib
import random

import pytest

from replicas import platform
from replicas.coldio import ColdReader, aligned_buffer, read_range, read_sequential
from replicas.drives import mount_for, parse_diskutil_plist, parse_mountinfo
from tests.helpers import write_random


@pytest.fixture(params=["o_direct", "fadvise"])
def reader_factory(request, monkeypatch):
    """Every way of opening a file cold passes the same tests."""
    how = request.param
    if how == "fadvise":
        monkeypatch.setattr(platform, "open_direct", lambda p: (os.open(p, os.O_RDONLY), "fadvise"))
    return ColdReader


@pytest.mark.parametrize("size", [1, 4095, 4096, 1 << 20, (3 << 20) + 1234])
def test_read_range_equals_plain_reads(tmp_path, reader_factory, size):
    p = tmp_path / "f"
    data = write_random(p, size, seed=size)
    rng = random.Random(size)
    with reader_factory(str(p)) as r:
        for _ in range(25):
            off = rng.randrange(size)
            length = rng.randrange(1, size - off + 1)
            assert bytes(read_range(r, off, length)) == data[off:off + length]
        assert bytes(read_range(r, size - 1, 100)) == data[-1:]       # short at end of file


def test_read_sequential_streams_the_whole_file_in_order(tmp_path, reader_factory):
    p = tmp_path / "f"
    data = write_random(p, (5 << 20) + 77, seed=5)
    with reader_factory(str(p)) as r:
        got = b"".join(bytes(v) for _, v in read_sequential(r, 0, r.size, block=1 << 20, depth=3))
    assert got == data


def test_buffers_are_page_aligned():
    import ctypes

    b = aligned_buffer(10)
    assert len(b) == 4096
    assert ctypes.addressof(ctypes.c_char.from_buffer(b)) % 4096 == 0


def test_o_direct_is_used_on_linux_when_the_file_system_allows(tmp_path):
    if not platform.is_linux():
        pytest.skip("Linux only")
    p = tmp_path / "f"
    write_random(p, 8192)
    with ColdReader(str(p)) as r:
        assert r.how in ("o_direct", "fadvise") and r.direct == (r.how == "o_direct")


def test_platform_decisions_are_pure():
    assert platform.cold_open_strategy("linux") == "o_direct"
    assert platform.cold_open_strategy("darwin") == "f_nocache"
    assert platform.cold_open_strategy("freebsd13") == "fadvise"
    assert platform.stamp_xattr_name("linux").startswith("user.")
    assert platform.stamp_xattr_name("darwin") == "com.replica-tuner.stamp"


def test_resident_fraction_sees_the_page_cache(tmp_path):
    p = tmp_path / "f"
    write_random(p, 1 << 20)
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
        platform.drop_cached(fd)
        cold = platform.resident_fraction(str(p))
        os.read(fd, 1 << 20)
        warm = platform.resident_fraction(str(p))
    finally:
        os.close(fd)
    assert warm == 1.0 and cold < warm


MOUNTINFO = """\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 7:3 / /mnt/green\\040drive rw,relatime shared:9 - ext4 /dev/loop3 rw
31 22 259:1 / /mnt/white rw - xfs /dev/nvme0n1p1 rw
"""


def test_mountinfo_parsing_and_longest_prefix():
    entries = parse_mountinfo(MOUNTINFO)
    assert entries[1].mount_point == "/mnt/green drive" and entries[1].majmin == "7:3"
    assert mount_for("/mnt/green drive/model.gguf", entries).source == "/dev/loop3"
    assert mount_for("/mnt/whitecap/x", entries).mount_point == "/"
    assert mount_for("/mnt/white/x", entries).fs_type == "xfs"


def test_diskutil_plist_picks_the_apfs_physical_store():
    plist = plistlib.dumps({
        "MountPoint": "/Volumes/Green", "FilesystemType": "apfs", "DeviceIdentifier": "disk5s1",
        "ParentWholeDisk": "disk5", "APFSPhysicalStores": [{"APFSPhysicalStore": "disk4s2"}],
        "VolumeUUID": "1234-ABCD",
    })
    info = parse_diskutil_plist(plist)
    assert info == {"mount_point": "/Volumes/Green", "fs_type": "apfs", "device": "/dev/disk5s1",
                    "disk": "disk4", "key": "uuid:1234-ABCD"}
