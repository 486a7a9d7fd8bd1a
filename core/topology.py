"""What the rig's drives share, read from the OS's device tree before anything is measured (pure).

A drive (a file system's block device) rests on a chain of things: the partition's disk, the
members of an md array or a device-mapper (LVM) volume, the file behind a loop device, the NVMe
controller of a namespace, the PCI functions and bridges (a PCIe switch, a Thunderbolt
controller's ports) up to the CPU, the USB bus and hubs of an enclosure. Two drives that rest on
one such thing may share its bandwidth: a second replica behind it can add nothing. This module
turns a sysfs device path into that chain (`path_links`) and groups drives whose chains meet
(`group_drives`); reading sysfs is `core/sysfs.py`'s job. A group is a hypothesis for iobench
to measure (docs/iobench.md): a shared controller is not always the bottleneck.

The PCI root complex (`pci0000:00`) is left out: every device hangs under it, and the CPU's root
ports below it are separate links. What sysfs does not show (a chipset's uplink to the CPU behind
its root ports, a Thunderbolt daisy chain's cable) is not seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

# Kinds of link, nearest the data first.
PARTITION = "partition"
DISK = "disk"
LOOP = "loop"
MD = "md"
DM = "dm"
VIRTUAL = "virtual"          # another block device with no hardware under it (zram, nbd, ram)
FILE = "file"                # a loop device's backing file whose device is not known
FS = "fs"                    # a file system with no block device (tmpfs): a loop file on it
NVME_NS_HEAD = "nvme-subsystem"
NVME_CTRL = "nvme-controller"
SCSI_HOST = "scsi-host"
ATA_PORT = "ata-port"
MMC_HOST = "mmc-host"
VIRTIO = "virtio"
USB_DEVICE = "usb-device"    # the enclosure's own USB device
USB_HUB = "usb-hub"
USB_BUS = "usb-bus"          # a host controller's root hub
PCI = "pci"                  # a PCI function: the controller the device talks through
PCI_BRIDGE = "pci-bridge"    # a root port, a PCIe switch port, a Thunderbolt port

KIND_TEXT = {
    PARTITION: "partition", DISK: "disk", LOOP: "loop device", MD: "md array", DM: "device-mapper volume",
    VIRTUAL: "virtual device", FILE: "file", FS: "file system", NVME_NS_HEAD: "NVMe subsystem",
    NVME_CTRL: "NVMe controller", SCSI_HOST: "SCSI host", ATA_PORT: "ATA port", MMC_HOST: "MMC host",
    VIRTIO: "virtio device", USB_DEVICE: "USB device", USB_HUB: "USB hub", USB_BUS: "USB bus",
    PCI: "PCI function", PCI_BRIDGE: "PCI bridge",
}

_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_USB_DEV = re.compile(r"^\d+-\d+(\.\d+)*$")
_BY_NAME = tuple((re.compile(pattern), kind) for pattern, kind in (
    (r"^usb\d+$", USB_BUS), (r"^nvme\d+$", NVME_CTRL), (r"^nvme-subsys\d+$", NVME_NS_HEAD), (r"^host\d+$", SCSI_HOST),
    (r"^ata\d+$", ATA_PORT), (r"^mmc\d+$", MMC_HOST), (r"^virtio\d+$", VIRTIO)))
_VIRTUAL_BLOCK = (("loop", LOOP), ("md", MD), ("dm-", DM))


@dataclass(frozen=True)
class Link:
    """One thing a drive rests on."""

    kind: str        # one of the kinds above
    id: str          # unique on this machine: its sysfs path under devices/ (or 'fs:MAJ:MIN', 'file:PATH')
    name: str        # what a user reads: 'nvme0', '2-1', '0000:3d:00.0', 'md0 (raid0)'

    def text(self) -> str:
        return f"{KIND_TEXT.get(self.kind, self.kind)} {self.name}"


@dataclass(frozen=True)
class DriveTopology:
    """A drive and what it rests on, nearest first (its own device first)."""

    name: str                    # the drive's name (a rig member, an iobench target)
    device: str                  # its block device ('nvme0n1p2'), '' when it has none
    links: tuple[Link, ...] = ()
    note: str = ""               # why little or nothing is known (no block device, not Linux)


@dataclass(frozen=True)
class Shared:
    link: Link
    drives: tuple[str, ...]      # the drives resting on it (two or more)


@dataclass(frozen=True)
class DriveGroup:
    """Drives whose chains meet: measure them together before trusting their sum."""

    name: str                    # a name for iobench's group run: 'nvme0', 'disk-sda', 'hub-2-1'
    drives: tuple[str, ...]
    shares: tuple[Shared, ...]   # the nearest shared link for each set of drives sharing one

    def reason(self) -> str:
        """'NVMe controller nvme0' or 'disk sda (a, b); USB hub 2-1 (b, c)'."""
        if len(self.shares) == 1 and set(self.shares[0].drives) == set(self.drives):
            return self.shares[0].link.text()
        return "; ".join(f"{s.link.text()} ({', '.join(s.drives)})" for s in self.shares)


@dataclass(frozen=True)
class Topology:
    source: str                  # 'sysfs', 'diskutil' (physical disk only) or 'none'
    drives: tuple[DriveTopology, ...]
    groups: tuple[DriveGroup, ...]

    def group_of(self, drive: str) -> DriveGroup | None:
        for g in self.groups:
            if drive in g.drives:
                return g
        return None


# ---- a sysfs path -> links ------------------------------------------------------------------------

def path_links(parts: Sequence[str], partition: bool = False) -> list[Link]:
    """The links along a block device's resolved sysfs path, split under `devices/`, nearest first;
    `partition`: the last component is a partition (sysfs says so with a `partition` file).
    ('pci0000:00', '0000:00:1d.0', '0000:3d:00.0', 'nvme', 'nvme0', 'nvme0n1', 'nvme0n1p2') ->
    partition nvme0n1p2, disk nvme0n1, NVMe controller nvme0, PCI function 0000:3d:00.0, PCI bridge
    0000:00:1d.0. Components that are one per device (SCSI targets and LUNs, USB interfaces, the
    `block` and `nvme` folders) and the root complex are left out."""
    parts = [p for p in parts if p]
    dev = len(parts) - (2 if partition else 1)
    out: list[Link] = []
    for i, p in enumerate(parts):
        ident = "/".join(parts[:i + 1])
        later = parts[i + 1:dev]
        kind = ""
        if i > dev:
            kind = PARTITION
        elif i == dev:
            kind = next((k for prefix, k in _VIRTUAL_BLOCK if p.startswith(prefix)), "")
            if not kind:
                kind = VIRTUAL if parts[max(0, i - 2):i] == ["virtual", "block"] else DISK
        elif _PCI.match(p):
            kind = PCI_BRIDGE if any(_PCI.match(x) for x in later) else PCI
        elif _USB_DEV.match(p):
            kind = USB_HUB if any(_USB_DEV.match(x) for x in later) else USB_DEVICE
        else:
            kind = next((k for rx, k in _BY_NAME if rx.match(p)), "")
        if kind:
            out.append(Link(kind, ident, p))
    return out[::-1]


def merge_links(*chains: Sequence[Link]) -> tuple[Link, ...]:
    """The chains one after another, each link once (the first place it appears)."""
    seen, out = set(), []
    for chain in chains:
        for link in chain:
            if link.id not in seen:
                seen.add(link.id)
                out.append(link)
    return tuple(out)


# ---- grouping ---------------------------------------------------------------------------------------

def group_drives(drives: Sequence[DriveTopology]) -> tuple[DriveGroup, ...]:
    """Drives that share any link, grouped (transitively: a shares a disk with b, b a hub with c:
    one group of three). Each group lists, per set of drives sharing something, the link nearest
    those drives (a partition pair shares its disk, and the disk's controller behind it; the disk
    is named). Drives with no links are never grouped. Groups come in the drives' order."""
    names = [d.name for d in drives]
    parent = list(range(len(drives)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    holders: dict[str, list[int]] = {}
    links: dict[str, Link] = {}
    for i, d in enumerate(drives):
        for link in d.links:
            if i not in holders.setdefault(link.id, []):
                holders[link.id].append(i)
            links[link.id] = link
    for held in holders.values():
        for j in held[1:]:
            parent[root(j)] = root(held[0])

    members: dict[int, list[int]] = {}
    for i in range(len(drives)):
        members.setdefault(root(i), []).append(i)
    groups, taken = [], set()
    for idx in sorted(members.values(), key=min):
        if len(idx) < 2:
            continue
        shared = []
        for lid, held in holders.items():
            if len(held) >= 2 and root(held[0]) == root(idx[0]):
                rank = min(list(drives[h].links).index(links[lid]) for h in held)
                shared.append((-len(held), rank, lid, tuple(sorted(held))))
        shares, seen_sets = [], set()
        for _, _, lid, held in sorted(shared):
            if held not in seen_sets:
                seen_sets.add(held)
                shares.append(Shared(links[lid], tuple(names[h] for h in held)))
        name = _group_name(shares[0].link, taken)
        taken.add(name)
        groups.append(DriveGroup(name, tuple(names[i] for i in idx), tuple(shares)))
    return tuple(groups)


_SHORT = {DISK: "disk", PARTITION: "disk", NVME_CTRL: "", NVME_NS_HEAD: "", USB_HUB: "hub", USB_BUS: "",
          USB_DEVICE: "usb", PCI: "pci", PCI_BRIDGE: "pcibridge", MD: "", DM: "", LOOP: "", FS: "fs", FILE: "file"}


def _group_name(link: Link, taken: set[str]) -> str:
    """'nvme0', 'disk-sda', 'hub-2-1', 'pci-0000-3d-00.0': a name iobench's --group accepts."""
    prefix = _SHORT.get(link.kind, link.kind)
    base = "".join(c if c.isalnum() or c in "-_." else "-" for c in (f"{prefix}-{link.name}" if prefix else link.name))
    base = base.strip("-") or "shared"
    if base == "together":
        base = "shared-together"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


# ---- JSON ---------------------------------------------------------------------------------------------

def _link_to(link: Link) -> dict:
    return {"kind": link.kind, "id": link.id, "name": link.name}


def topology_to_dict(t: Topology) -> dict:
    return {"source": t.source,
            "drives": [{"name": d.name, "device": d.device, "note": d.note, "links": [_link_to(x) for x in d.links]}
                       for d in t.drives],
            "groups": [{"name": g.name, "drives": list(g.drives), "reason": g.reason(),
                        "shares": [{"link": _link_to(s.link), "drives": list(s.drives)} for s in g.shares]}
                       for g in t.groups]}


def topology_from_dict(d: dict) -> Topology:
    """The drives are read back and grouped again (the groups follow from them)."""
    drives = tuple(DriveTopology(str(x["name"]), str(x.get("device", "")),
                                 tuple(Link(str(k["kind"]), str(k["id"]), str(k["name"])) for k in x.get("links", ())),
                                 str(x.get("note", "")))
                   for x in d.get("drives", ()))
    return Topology(str(d.get("source", "")), drives, group_drives(drives))


def topology_lines(t: Topology) -> list[str]:
    """What a person reads: one line per group, then a line for drives nothing is known about."""
    lines = [f"{', '.join(g.drives)} share {g.reason()}: measure them together (iobench run does)"
             for g in t.groups]
    if not t.groups and len(t.drives) > 1 and any(d.links for d in t.drives):
        lines.append(f"no two drives share a disk, controller, bus or hub ({t.source})")
    lines += [f"{d.name}: {d.note}" for d in t.drives if d.note]
    return lines
