"""The queue limits of the drive under a file, as the OS reports them (Linux sysfs; macOS ioreg,
unconfirmed). The arithmetic on them is in `iounit`.

Linux: the `queue` folder of the device the file system sits on (`core.drives.queue_dir`:
a partition's disk, a loop device's own, a dm or md device's own, not its members'). macOS:
`ioreg`'s block storage driver of the APFS physical store's whole disk (`DriveInfo.disk`); this
path is written from IOKit's property names and has not been tried on a Mac. Anywhere else, or
when nothing can be read, the limits are 'unknown' and the drive model measures its unit.
"""

from __future__ import annotations

import os
import subprocess

from core import platform
from core.drives import queue_dir

from .iounit import QUEUE_KEYS, QueueLimits, limits_from_ioreg, limits_from_sysfs

IOREG_TIMEOUT_S = 20


def sysfs_limits(majmin: str, sys_root: str = "/sys") -> QueueLimits:
    """The limits of block device MAJ:MIN from `sys_root` (a fake tree in tests)."""
    q = queue_dir(majmin, sys_root)
    if not q:
        return QueueLimits(source="unknown")
    values = {}
    for key in QUEUE_KEYS:
        try:
            with open(os.path.join(q, key)) as f:
                values[key] = f.read()
        except OSError:
            continue
    return limits_from_sysfs(values, device=os.path.basename(os.path.dirname(q)))


def ioreg_limits(disk: str) -> QueueLimits:
    """macOS (unconfirmed): the maximum read of whole disk `disk` from `ioreg`."""
    if not disk:
        return QueueLimits(source="unknown")
    try:
        out = subprocess.run(["ioreg", "-r", "-c", "IOBlockStorageDriver", "-l", "-w0"], capture_output=True,
                             check=True, timeout=IOREG_TIMEOUT_S, text=True).stdout
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return QueueLimits(source="unknown", device=disk)
    return limits_from_ioreg(out, disk)


def queue_limits(path: str, disk: str = "", sys_root: str = "/sys") -> QueueLimits:
    """The queue limits of the drive holding `path` (`disk`: its whole disk on macOS, from
    `core.drives.drive_of`). Never raises: what cannot be read is 'unknown'."""
    try:
        st = os.stat(path)
    except OSError:
        return QueueLimits(source="unknown")
    if platform.is_linux():
        return sysfs_limits(f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", sys_root)
    if platform.is_darwin():
        return ioreg_limits(disk)
    return QueueLimits(source="unknown")
