"""One row per rig member: where it lives, its size and whether its stamp still holds."""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.rig import Rig

from .drives import drive_of
from .manifest import Manifest
from .stamps import MISSING, UNVERIFIED, last_verified, stamp_state


@dataclass(frozen=True)
class MemberStatus:
    name: str
    role: str
    path: str
    mount_point: str
    fs_type: str
    device: str
    disk: str
    drive_key: str
    size: int | None
    state: str                       # verified / stale / unverified / missing
    last_verified: float | None      # unix seconds of the last full verification


def member_status(rig: Rig, manifest: Manifest | None) -> list[MemberStatus]:
    rows = []
    for m in rig.members:
        size = os.path.getsize(m.path) if os.path.isfile(m.path) else None
        if size is None:
            state = MISSING
        elif manifest is None:
            state = UNVERIFIED
        else:
            state = stamp_state(m.path, manifest, rig)
        try:
            d = drive_of(m.path if size is not None else os.path.dirname(m.path))
            drive = (d.mount_point, d.fs_type, d.device, d.disk, d.key)
        except OSError:
            drive = ("", "", "", "", "")
        rows.append(MemberStatus(m.name, m.role, m.path, *drive, size, state,
                                 last_verified(m.path, rig) if size is not None else None))
    return rows
