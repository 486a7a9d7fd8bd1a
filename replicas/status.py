"""One row per rig member, and one per file of the model there: where it lives, its size,
whether its stamp still holds, and what the last verification found (a mismatch stands until
`repair` or a clean verify clears it). A member rolls its files up: verified only when every
file is. Reads no data."""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.rig import Member, Rig

from core.drives import drive_of, drives_topology
from core.tiers import is_memory, nearest_existing
from core.topology import Topology
from .manifest import Manifest, ModelManifest
from models.modelset import member_files, member_set
from .records import load_verdicts
from .stamps import MISSING, UNVERIFIED, last_verified, stamp_state
from .verdict import (
    BROKEN,
    GONE,
    MISMATCH,
    STATUS_ORDER,
    Verdict,
    rollup_state,
    rollup_verdict,
    standing_broken,
    standing_mismatch,
)


@dataclass(frozen=True)
class FileStatus:
    file: str                        # relative path in the model
    path: str                        # absolute path on the member's drive
    size: int | None                 # bytes, None when missing
    state: str                       # verified / stale / unverified / missing / mismatch / broken
    last_verified: float | None      # unix seconds of the file's last full verification
    verdict: Verdict | None = None   # what the last verification against this file's manifest found


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
    size: int | None                 # bytes of the files found, None when none is there
    state: str                       # the worst of its files' states
    last_verified: float | None      # the oldest of its files' last full verifications (None: one never was)
    verdict: Verdict | None = None   # its files' verdicts rolled up (verdict.rollup_verdict)
    files: tuple[FileStatus, ...] = ()
    holds: tuple[str, ...] | None = None   # a partial replica: the files it holds (None: every file)
    devno: str = ""                  # the drive's device number now ('MAJ:MIN'); the next three survive a reboot
    fs_uuid: str = ""
    serial: str = ""
    wwn: str = ""
    memory: bool = False             # a RAM member (tmpfs): its files vanish at reboot, 'gone' rather than 'missing'

    @property
    def bad_pieces(self) -> int:
        return len(self.verdict.bad) if self.verdict else 0


def _file_status(rel: str, path: str, fm: Manifest | None, verdicts: dict[str, Verdict], rig: Rig,
                 memory: bool = False) -> FileStatus:
    size = os.path.getsize(path) if os.path.isfile(path) else None
    verdict = verdicts.get(path)
    if fm is None or (verdict is not None and verdict.manifest != fm.digest()):
        verdict = None   # judged against another manifest: says nothing about this one
    if size is None:
        state = GONE if memory else MISSING
    elif fm is None:
        state = UNVERIFIED
    elif standing_mismatch(verdict, fm) or size != fm.size:      # a file of another size cannot be identical
        state = MISMATCH
    elif standing_broken(verdict, fm):
        state = BROKEN
    else:
        state = stamp_state(path, fm, rig)
    return FileStatus(rel, path, size, state, last_verified(path, rig) if size is not None else None, verdict)


def _files_of(rig: Rig, member: Member, manifest: ModelManifest | None) -> list[tuple[str, str, Manifest | None]]:
    if manifest is not None:
        return member_files(member, manifest)
    model = member_set(rig, member)
    if len(model.files) == 1 and model.layout == "file":
        return [(model.files[0], member.path, None)]
    return [(rel, model.abs(rel), None) for rel in model.files if member.holds_file(rel)]


def member_status(rig: Rig, manifest: ModelManifest | Manifest | None) -> list[MemberStatus]:
    if isinstance(manifest, Manifest):
        manifest = ModelManifest((manifest,))
    verdicts = load_verdicts(rig)
    rows = []
    for m in rig.members:
        memory = is_memory(m.path)
        files = tuple(_file_status(rel, p, fm, verdicts, rig, memory) for rel, p, fm in _files_of(rig, m, manifest))
        sizes = [f.size for f in files if f.size is not None]
        times = [f.last_verified for f in files]
        try:
            d = drive_of(_where(m))
            drive, ident = (d.mount_point, d.fs_type, d.device, d.disk, d.key), (d.devno, d.fs_uuid, d.serial, d.wwn)
        except OSError:
            drive, ident = ("", "", "", "", ""), ("", "", "", "")
        rows.append(MemberStatus(m.name, m.role, m.path, *drive, sum(sizes) if sizes else None,
                                 rollup_state([f.state for f in files], STATUS_ORDER),
                                 None if None in times else min(times), rollup_verdict([f.verdict for f in files]),
                                 files, m.holds, *ident, memory))
    return rows


def _where(m: Member) -> str:
    """The member's path, or the nearest folder that would hold it while it is missing (a RAM
    member's own folder goes with the rest of tmpfs at reboot)."""
    return m.path if os.path.exists(m.path) else nearest_existing(m.path)


def members_topology(rig: Rig) -> Topology:
    """What the members' drives share (a disk, an md/dm array, a loop file's disk, an NVMe
    controller, a PCI bridge, a USB hub), read from the OS (`core.drives.drives_topology`)."""
    return drives_topology([(m.name, _where(m)) for m in rig.members])
