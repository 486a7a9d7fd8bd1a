"""A sysfs tree recorded in a temporary folder, laid out as Linux lays it out: device folders under
devices/ (each with its `dev` file), /sys/dev/block/MAJ:MIN links to them, `partition` files,
`slaves/` links and loop devices' `loop/backing_file`."""

from __future__ import annotations

import os
from pathlib import Path


class SysTree:
    def __init__(self, root: Path):
        self.root = root
        (root / "devices").mkdir(parents=True, exist_ok=True)
        (root / "dev" / "block").mkdir(parents=True, exist_ok=True)

    def block(self, rel: str, majmin: str, files: dict[str, str] | None = None) -> Path:
        """A block device at devices/REL with number MAJ:MIN, and the files given (relative to it)."""
        d = self.root / "devices" / rel
        d.mkdir(parents=True)
        (d / "dev").write_text(majmin + "\n")
        link = self.root / "dev" / "block" / majmin
        link.symlink_to(os.path.relpath(d, link.parent))
        for name, text in (files or {}).items():
            p = d / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text + "\n")
        return d

    def partition(self, disk: Path, name: str, majmin: str) -> Path:
        return self.block(str((disk / name).relative_to(self.root / "devices")), majmin, {"partition": name[-1]})

    def member(self, holder: Path, member: Path) -> None:
        """`member` is one of `holder`'s slaves (md, dm)."""
        slaves = holder / "slaves"
        slaves.mkdir(exist_ok=True)
        (slaves / member.name).symlink_to(os.path.relpath(member, slaves))


# Paths of real machines' devices (under /sys/devices).
NVME_CTRL0 = "pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0"
NVME_CTRL1 = "pci0000:00/0000:00:1c.0/0000:3e:00.0/nvme/nvme1"
SATA = "pci0000:00/0000:00:17.0/ata{n}/host{h}/target{h}:0:0/{h}:0:0:0/block/{disk}"
USB = "pci0000:00/0000:00:14.0/usb2/2-1/{port}/{port}:1.0/host{h}/target{h}:0:0/{h}:0:0:0/block/{disk}"
