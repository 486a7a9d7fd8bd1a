"""What Linux's sysfs says about a block device: what it rests on (`device_links`) and who it is
across reboots (`disk_identity`, `fs_uuid`). Every function takes the sysfs root, so tests point
it at a tree recorded in a temporary folder; none raises on what cannot be read (it is left out).

A device's chain: its resolved /sys/dev/block/MAJ:MIN path (partition, disk, NVMe controller,
PCI functions and bridges, USB bus and hubs: `core.topology.path_links`), then, for an md array
or a device-mapper (LVM) volume, each member's chain (`slaves/`), and for a loop device the chain
of the device holding its backing file (`loop/backing_file`), and for an NVMe namespace under
native multipath (its path under devices/virtual/nvme-subsystem/) the chain of each path's
controller (`multipath/`).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from .topology import DM, FILE, FS, LOOP, MD, DriveTopology, Link, Topology, group_drives, merge_links, path_links

DevOf = Callable[[str], "str | None"]


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def dev_of(path: str) -> str | None:
    """'MAJ:MIN' of the file system holding `path` (None when it cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def device_dir(majmin: str, sys_root: str = "/sys") -> str:
    """The resolved sysfs folder of block device MAJ:MIN, '' when there is none (tmpfs, not Linux)."""
    real = os.path.realpath(os.path.join(sys_root, "dev", "block", majmin))
    return real if os.path.isfile(os.path.join(real, "dev")) else ""


def device_links(majmin: str, sys_root: str = "/sys", dev_of: DevOf = dev_of, _seen: frozenset = frozenset()) -> tuple[Link, ...]:
    """What block device MAJ:MIN rests on, nearest first (empty: no such block device).
    `dev_of` maps a loop device's backing file to its file system's MAJ:MIN."""
    real = device_dir(majmin, sys_root)
    if not real or majmin in _seen:
        return ()
    seen = _seen | {majmin}
    devices = os.path.realpath(os.path.join(sys_root, "devices"))
    rel = os.path.relpath(real, devices)
    parts = rel.split(os.sep) if not rel.startswith("..") else ["virtual", "block", os.path.basename(real)]
    partition = os.path.exists(os.path.join(real, "partition"))
    whole = os.path.dirname(real) if partition else real
    links = [_named(x, whole) for x in path_links(parts, partition)]
    chains = [links]
    slaves = os.path.join(whole, "slaves")
    if os.path.isdir(slaves):
        for member in sorted(os.listdir(slaves)):
            inner = _read(os.path.join(os.path.realpath(os.path.join(slaves, member)), "dev"))
            if inner:
                chains.append(list(device_links(inner, sys_root, dev_of, seen)))
    multipath = os.path.join(whole, "multipath")     # an NVMe namespace head: its paths, each under a controller
    if os.path.isdir(multipath):
        for path_dev in sorted(os.listdir(multipath)):
            rel_path = os.path.relpath(os.path.realpath(os.path.join(multipath, path_dev)), devices)
            if not rel_path.startswith(".."):
                chains.append(path_links(rel_path.split(os.sep))[1:])   # the hidden path device is one per path
    backing = _read(os.path.join(whole, "loop", "backing_file"))
    if backing:
        inner = dev_of(backing.removesuffix(" (deleted)"))
        below = device_links(inner, sys_root, dev_of, seen) if inner else ()
        if below:
            chains.append(list(below))
        elif inner:
            chains.append([Link(FS, f"fs:{inner}", f"{inner} (no block device: memory or network)")])
        else:
            chains.append([Link(FILE, f"file:{backing}", f"{backing} (not reachable here)")])
    return merge_links(*chains)


def _named(link: Link, folder: str) -> Link:
    """A virtual device's link with what sysfs says it is: 'md0 (raid0)', 'dm-0 (vg-lv)', 'loop3 (/x/img)'."""
    if link.kind == MD:
        level = _read(os.path.join(folder, "md", "level"))
        return Link(MD, link.id, f"{link.name} ({level})" if level else link.name)
    if link.kind == DM:
        name = _read(os.path.join(folder, "dm", "name"))
        return Link(DM, link.id, f"{link.name} ({name})" if name else link.name)
    if link.kind == LOOP:
        backing = _read(os.path.join(folder, "loop", "backing_file"))
        return Link(LOOP, link.id, f"{link.name} ({backing})" if backing else link.name)
    return link


# ---- identity that survives a reboot ---------------------------------------------------------------

def whole_disk_dir(majmin: str, sys_root: str = "/sys") -> str:
    """The disk's sysfs folder (a partition's parent), '' when there is none."""
    real = device_dir(majmin, sys_root)
    if real and os.path.exists(os.path.join(real, "partition")):
        return os.path.dirname(real)
    return real


def disk_identity(majmin: str, sys_root: str = "/sys") -> tuple[str, str]:
    """(serial, WWN) of the disk behind block device MAJ:MIN, as the kernel reports them; '' for
    what it does not (a loop, md or dm device has neither: its members do). Serial: `serial`
    (virtio), `device/serial` (NVMe controller, some SCSI), `device/vpd_pg80` (SCSI unit serial
    page); WWN: `wwid` (NVMe namespace: eui./nvme./uuid.), `device/wwid` (SCSI: naa./t10.)."""
    disk = whole_disk_dir(majmin, sys_root)
    if not disk:
        return "", ""
    serial = _read(os.path.join(disk, "serial")) or _read(os.path.join(disk, "device", "serial"))
    if not serial:
        serial = vpd_serial(_read_bytes(os.path.join(disk, "device", "vpd_pg80"), 256))
    wwn = _read(os.path.join(disk, "wwid")) or _read(os.path.join(disk, "device", "wwid"))
    return serial, wwn


def vpd_serial(page: bytes) -> str:
    """The unit serial number in a SCSI VPD page 0x80 (4-byte header, then the length's bytes)."""
    if len(page) < 4 or page[1] != 0x80:
        return ""
    n = int.from_bytes(page[2:4], "big")
    return page[4:4 + n].decode("ascii", "replace").strip()


def _read_bytes(path: str, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def fs_uuid(device_name: str, dev_root: str = "/dev") -> tuple[str, str]:
    """(UUID, where it came from) of the file system on /dev/NAME: the udev link in
    /dev/disk/by-uuid naming it, else the file system's own superblock (`superblock_uuid`; needs
    read access to the device, which root has). ('', '') when neither tells."""
    if not device_name:
        return "", ""
    by_uuid = os.path.join(dev_root, "disk", "by-uuid")
    try:
        for u in sorted(os.listdir(by_uuid)):
            if os.path.basename(os.path.realpath(os.path.join(by_uuid, u))) == device_name:
                return u, "by-uuid"
    except OSError:
        pass
    head = _read_bytes(os.path.join(dev_root, device_name), SUPERBLOCK_READ)
    u = superblock_uuid(head)
    return (u, "superblock") if u else ("", "")


SUPERBLOCK_READ = 0x10000 + 4096      # btrfs keeps its superblock at 64 KiB


def superblock_uuid(head: bytes) -> str:
    """The UUID blkid would print for the file system whose first bytes are `head` (pure): ext2/3/4,
    XFS, btrfs (16-byte UUIDs), FAT32 and exFAT (4-byte volume serials, XXXX-XXXX), NTFS (8-byte
    serial). '' for anything else."""
    def uuid16(b: bytes) -> str:
        h = b.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}" if any(b) else ""

    if len(head) >= 0x400 + 0x78 and head[0x438:0x43A] == b"\x53\xef":
        return uuid16(head[0x468:0x478])
    if head[:4] == b"XFSB" and len(head) >= 48:
        return uuid16(head[32:48])
    if len(head) >= 0x10000 + 0x48 and head[0x10040:0x10048] == b"_BHRfS_M":
        return uuid16(head[0x10020:0x10030])
    if head[3:11] == b"EXFAT   " and len(head) >= 104:
        return _serial4(head[100:104])
    if head[3:11] == b"NTFS    " and len(head) >= 0x50:
        return head[0x48:0x50][::-1].hex().upper()
    if head[0x52:0x5A] == b"FAT32   " and len(head) >= 0x47:
        return _serial4(head[0x43:0x47])
    return ""


def _serial4(b: bytes) -> str:
    h = b[::-1].hex().upper()
    return f"{h[:4]}-{h[4:]}"


# ---- the rig's drives --------------------------------------------------------------------------------

def sysfs_topology(named: Sequence[tuple[str, str | None]], sys_root: str = "/sys", dev_of: DevOf = dev_of) -> Topology:
    """(drive name, its file system's MAJ:MIN or None) -> each drive's chain and the groups of
    drives that share something (`core.topology.group_drives`)."""
    drives = []
    for name, majmin in named:
        if majmin is None:
            drives.append(DriveTopology(name, "", (), "cannot be read (missing?): nothing known of its drive"))
            continue
        links = device_links(majmin, sys_root, dev_of)
        if not links:
            drives.append(DriveTopology(name, "", (), f"device {majmin} is no block device (a memory or network "
                                                      "file system): shares nothing with a disk"))
            continue
        drives.append(DriveTopology(name, os.path.basename(device_dir(majmin, sys_root)), links))
    drives = tuple(drives)
    return Topology("sysfs", drives, group_drives(drives))
