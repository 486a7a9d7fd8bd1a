"""One row per rig member: where it lives, its size, whether its stamp still holds, and what the
last verification found (a mismatch stands until `repair` or a clean verify clears it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.rig import Rig

from .drives import drive_of
from .manifest import Manifest
from .records import load_verdicts
from .stamps import MISSING, UNVERIFIED, last_verified, stamp_state
from .verdict import MISMATCH, Verdict, standing_mismatch


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
    state: str                       # verified / stale / unverified / missing / mismatch
    last_verified: float | None      # unix seconds of the last full verification
    verdict: Verdict | None = None   # what the last verification against this manifest found

    @property
    def bad_pieces(self) -> int:
        return len(self.verdict.bad) if self.verdict else 0


def member_status(rig: Rig, manifest: Manifest | None) -> list[MemberStatus]:
    verdicts = load_verdicts(rig)
    rows = []
    for m in rig.members:
        size = os.path.getsize(m.path) if os.path.isfile(m.path) else None
        verdict = verdicts.get(m.path)
        if manifest is None or (verdict is not None and verdict.manifest != manifest.digest()):
            verdict = None   # judged against another manifest: says nothing about this one
        if size is None:
            state = MISSING
        elif manifest is None:
            state = UNVERIFIED
        elif standing_mismatch(verdict, manifest):
            state = MISMATCH
        else:
            state = stamp_state(m.path, manifest, rig)
        try:
            d = drive_of(m.path if size is not None else os.path.dirname(m.path))
            drive = (d.mount_point, d.fs_type, d.device, d.disk, d.key)
        except OSError:
            drive = ("", "", "", "", "")
        rows.append(MemberStatus(m.name, m.role, m.path, *drive, size, state,
                                 last_verified(m.path, rig) if size is not None else None, verdict))
    return rows
