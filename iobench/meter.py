"""Bytes a block device has delivered, from the kernel's own counter (Linux /sys/.../stat).

The trial engine samples this at the edges of each window, so a drive's rate is what the device
delivered in the window, not an estimate from request lifetimes (which is off by up to the bytes
in flight, a lot at 16 lanes of 32 MiB). It also tells the page cache apart: bytes the
application got that the device never delivered came from memory.

Where there is no such counter (macOS, a file system with no block device such as tmpfs or
overlay) the meter is None and the engine falls back to crediting requests by overlap.
"""

from __future__ import annotations

import os

SECTOR = 512   # the stat file counts 512-byte sectors whatever the device's block size


def parse_block_stat(text: str) -> int:
    """Bytes read, from the text of /sys/block/<dev>/stat (field 3 is sectors read)."""
    fields = text.split()
    if len(fields) < 3:
        raise ValueError(f"block stat has {len(fields)} fields, expected at least 3")
    return int(fields[2]) * SECTOR


class DeviceMeter:
    def __init__(self, stat_path: str, key: str):
        self.stat_path = stat_path
        self.key = key             # 'MAJ:MIN' of the device: streams sharing it share the meter

    def read_bytes(self) -> int:
        with open(self.stat_path) as f:
            return parse_block_stat(f.read())


def device_meter(path: str) -> DeviceMeter | None:
    """The meter of the block device holding `path`, or None when it has none we can read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    stat_path = f"/sys/dev/block/{key}/stat"
    try:
        meter = DeviceMeter(stat_path, key)
        meter.read_bytes()
    except (OSError, ValueError):
        return None
    return meter

