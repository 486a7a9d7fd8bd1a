"""Memory members: a replica kept in RAM (tmpfs, /dev/shm) rather than on a drive.

A copy in a memory file system is a legitimate member for an engine that takes weights per drive
(docs/replicas.md, "RAM members"): its reads never touch a drive, it takes RAM for as long as it
exists, and it vanishes at reboot. Every stage asks here whether a member is one, by the file
system its path lies on (the nearest existing folder: a RAM member gone after a reboot still lies
on the same tmpfs mount).
"""

from __future__ import annotations

import os

from .mounts import mount_of
from .units import format_bytes

MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})   # file systems with no drive behind them


def memory_fs(fs_type: str) -> bool:
    """Whether a file system of this type keeps its files in RAM."""
    return fs_type in MEMORY_FS


def nearest_existing(path: str) -> str:
    """`path`, or its nearest ancestor that exists."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def is_memory(path: str) -> bool:
    """Whether `path` (existing or not) lies on a memory file system."""
    try:
        existing = nearest_existing(path)
        entry = mount_of(os.path.realpath(existing))
        if entry is not None:
            return memory_fs(entry.fs_type)
        from .drives import drive_of       # no mountinfo (macOS): the drive lookup names the file system
        return memory_fs(drive_of(existing).fs_type)
    except OSError:
        return False


def ram_note(nbytes: int, available: int) -> str:
    """The warning every stage gives for a RAM member: what it takes and that it vanishes."""
    room = f" of {format_bytes(available)} available now" if available > 0 else ""
    return (f"a RAM member takes {format_bytes(nbytes)} of RAM{room} for as long as it exists and vanishes at "
            "reboot; `replicas sync` restores it")
