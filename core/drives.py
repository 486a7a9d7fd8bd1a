"""Which drive a file lives on: mount point, file system, device and the physical disk behind it.

Linux reads /proc/self/mountinfo and /sys/dev/block; macOS asks `diskutil info -plist` (parsed
by a pure function that is tested anywhere). Device numbers change across re-plugs and reboots,
so beside the device number (`devno`) each drive records what does not: its file system's UUID
(udev's /dev/disk/by-uuid, else the file system's own superblock: `core/sysfs.py`) and its
disk's serial and WWN as the kernel reports them. The stable key is the file system UUID, else a
hash of the serial (or WWN), else the disk name.

A loop device counts as its own disk: that is what the OS presents, and the testbed's throttled
drives are loop devices.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from typing import Sequence

from . import platform, sysfs
from .mounts import mount_of
from .topology import DISK, DriveTopology, Link, Topology, group_drives


@dataclass(frozen=True)
class DriveInfo:
    mount_point: str
    fs_type: str
    device: str          # e.g. /dev/nvme0n1p2, /dev/loop3, /dev/disk3s1
    disk: str            # physical disk behind it, e.g. nvme0n1, loop3, disk0
    key: str             # stable identity: uuid:..., serial:<sha1>, or disk:<name>
    xattrs: bool | None = None   # whether user xattrs are known to work (None: not probed)
    devno: str = ""      # 'MAJ:MIN' of the file system's device now (changes across re-plugs)
    fs_uuid: str = ""    # the file system's UUID (volume UUID on macOS), '' when unknown
    serial: str = ""     # the disk's serial number as the kernel reports it, '' when unknown
    wwn: str = ""        # the disk's world wide name (NVMe eui./nvme., SCSI naa./t10.), '' when unknown

    @property
    def disk_key(self) -> str:
        """The physical disk's identity, shared by every file system on it: its serial (or WWN),
        else its name (a loop device is its own disk), else `key`."""
        if self.serial or self.wwn:
            return identity_key("", self.serial, self.wwn, self.disk, "")
        return f"disk:{self.disk}" if self.disk else self.key

    @property
    def label(self) -> str:
        """The mount point's name ('/Volumes/Green' -> 'Green'); '' for the root file system."""
        return os.path.basename(self.mount_point.rstrip("/"))


def drive_label(path: str) -> str:
    """A human label for the drive holding `path`: its mount point's name, or, on the root file
    system, the name of the folder holding the file."""
    label = drive_of(path).label
    return label or os.path.basename(os.path.dirname(os.path.abspath(path))) or "root"


def parse_diskutil_plist(data: bytes) -> dict:
    """Pick what we need from `diskutil info -plist` (pure): mount point, fs, device, the
    physical store's disk and a stable key."""
    import plistlib          # macOS only: not loaded by every command's start-up on Linux

    d = plistlib.loads(data)
    disk = _whole_disk(d.get("ParentWholeDisk") or d.get("DeviceIdentifier", ""))
    stores = d.get("APFSPhysicalStores") or []
    if stores:  # an APFS volume lives in a container; the drive is the container's physical store
        store = stores[0].get("APFSPhysicalStore", "") if isinstance(stores[0], dict) else str(stores[0])
        disk = _whole_disk(store) or disk
    uuid = d.get("VolumeUUID") or d.get("DiskUUID")
    return {
        "mount_point": d.get("MountPoint", ""),
        "fs_type": d.get("FilesystemType") or d.get("FilesystemName", ""),
        "device": "/dev/" + d.get("DeviceIdentifier", "") if d.get("DeviceIdentifier") else "",
        "disk": disk,
        "key": f"uuid:{uuid}" if uuid else f"disk:{disk}",
        "fs_uuid": d.get("VolumeUUID") or "",
    }


def _whole_disk(ident: str) -> str:
    """'disk4s2' -> 'disk4'."""
    if not ident.startswith("disk"):
        return ""
    rest = ident[4:]
    num = ""
    for c in rest:
        if c.isdigit():
            num += c
        else:
            break
    return "disk" + num if num else ""


def _sysfs_disk(majmin: str) -> tuple[str, str]:
    """(device name, physical disk name) for a block device major:minor on Linux."""
    try:
        real = os.path.realpath(f"/sys/dev/block/{majmin}")
    except OSError:
        return "", ""
    name = os.path.basename(real)
    if not os.path.exists(real):
        return "", ""
    disk = name
    if os.path.exists(os.path.join(real, "partition")):
        disk = os.path.basename(os.path.dirname(real))
    slaves = os.path.join("/sys/block", disk, "slaves")
    if os.path.isdir(slaves):  # device mapper / md: name the first member disk
        members = sorted(os.listdir(slaves))
        if members:
            inner = os.path.realpath(os.path.join(slaves, members[0]))
            partition = os.path.exists(os.path.join(inner, "partition"))
            disk = os.path.basename(os.path.dirname(inner)) if partition else os.path.basename(inner)
    return name, disk


def queue_dir(majmin: str, sys_root: str = "/sys") -> str:
    """The sysfs `queue` folder whose limits cut requests to block device MAJ:MIN on Linux: a
    partition's is its disk's; a whole disk, loop, dm or md device has its own (the top device
    the file system sits on, not the members behind it). '' when there is none."""
    real = os.path.realpath(os.path.join(sys_root, "dev", "block", majmin))
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    q = os.path.join(real, "queue")
    return q if os.path.isdir(q) else ""


def identity_key(fs_uuid: str, serial: str, wwn: str, disk: str, device_name: str) -> str:
    """The stable key (pure): uuid:<fs uuid>, else serial:<sha1 of serial or WWN>, else the disk's name."""
    if fs_uuid:
        return f"uuid:{fs_uuid}"
    if serial or wwn:
        return "serial:" + hashlib.sha1((serial or wwn).encode()).hexdigest()[:16]
    return f"disk:{disk}" if disk else f"dev:{device_name}"


def drive_of(path: str) -> DriveInfo:
    """The drive of an existing file or directory."""
    real = os.path.realpath(path)
    st = os.stat(real)
    majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    if platform.is_linux():
        entry = mount_of(real)
        name, disk = _sysfs_disk(majmin)
        if entry is None:
            return DriveInfo("/", "", "", disk, f"dev:{majmin}", devno=majmin)
        device = f"/dev/{name}" if name else entry.source
        if not name:
            return DriveInfo(entry.mount_point, entry.fs_type, device, disk or entry.source, f"dev:{majmin}", devno=majmin)
        uuid, _ = sysfs.fs_uuid(name)
        serial, wwn = sysfs.disk_identity(majmin)
        return DriveInfo(entry.mount_point, entry.fs_type, device, disk or entry.source,
                         identity_key(uuid, serial, wwn, disk, name), devno=majmin, fs_uuid=uuid, serial=serial, wwn=wwn)
    if platform.is_darwin():
        import plistlib

        try:
            out = subprocess.run(["diskutil", "info", "-plist", real], capture_output=True, check=True, timeout=20).stdout
            info = parse_diskutil_plist(out)
            return DriveInfo(info["mount_point"] or "/", info["fs_type"], info["device"], info["disk"], info["key"],
                             devno=majmin, fs_uuid=info["fs_uuid"])
        except (OSError, subprocess.SubprocessError, plistlib.InvalidFileException):
            pass
    return DriveInfo("/", "", "", f"dev{majmin}", f"dev:{majmin}", devno=majmin)


def drives_topology(named: Sequence[tuple[str, str]], sys_root: str = "/sys") -> Topology:
    """What the drives holding these files (drive name, path) share, read before anything is
    measured: on Linux from sysfs (`core/sysfs.py`: partitions, md/dm members, loop files, NVMe
    controllers, PCI bridges, USB hubs); on macOS only whether two sit on one physical disk (the
    APFS physical store `diskutil` names; controllers and hubs are not read there); elsewhere
    nothing."""
    if platform.is_linux():
        return sysfs.sysfs_topology([(name, sysfs.dev_of(path)) for name, path in named], sys_root)
    drives = []
    for name, path in named:
        disk = drive_of(path).disk if platform.is_darwin() and os.path.exists(path) else ""
        if disk:
            drives.append(DriveTopology(name, disk, (Link(DISK, f"disk:{disk}", disk),),
                                        "macOS: only the physical disk is read; a shared controller or hub is not (unconfirmed)"))
        else:
            drives.append(DriveTopology(name, "", (), "no device tree read on this system"))
    drives = tuple(drives)
    return Topology("diskutil" if platform.is_darwin() else "none", drives, group_drives(drives))
