"""The platform seam and drive identity (macOS logic tested here without macOS); the cold readers' own
cases are in test_coldio_contract.py."""

import os
import plistlib

from core import platform
from core.drives import parse_diskutil_plist
from core.mounts import mount_for, parse_mountinfo
from tests.helpers import write_random


def test_platform_decisions_are_pure():
    assert platform.cold_open_strategy("linux") == "o_direct"
    assert platform.cold_open_strategy("darwin") == "f_nocache"
    assert platform.cold_open_strategy("freebsd13") == "fadvise"
    assert platform.stamp_xattr_name("linux").startswith("user.")
    assert platform.stamp_xattr_name("darwin") == "com.replica-tuner.stamp"
    assert platform.maxrss_bytes(1000, "linux") == 1_024_000          # Linux's ru_maxrss: KiB
    assert platform.maxrss_bytes(1000, "darwin") == 1000               # macOS's: bytes
    assert platform.maxrss_bytes(-1, "linux") == 0


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
                    "disk": "disk4", "key": "uuid:1234-ABCD", "fs_uuid": "1234-ABCD"}
