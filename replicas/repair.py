"""Repairing a replica: re-copy only its bad pieces from a member whose pieces verify, then
verify again. The replica's stamp is withdrawn before its bytes change, so an interrupted
repair leaves a file that quick verify will not trust; a re-run picks up the remaining pieces.
The verdict the final verification reaches replaces the one `status` shows. `max_rate` paces
each drive's reads and writes (bytes/s).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from core.errors import MismatchError, MissingError, UsageError, WriteError
from core.events import Progress, Reporter, emit
from core.rig import Member, Rig

from .coldio import align_up, aligned_buffer, open_cold
from .drives import drive_of
from .hashing import PieceHasher
from .manifest import Manifest, PieceRange
from .records import record_verdicts
from .stamps import clear_stamp
from .throttle import Clock, Pace, Pacers
from .verdict import verdict_of_check
from .verify import IDENTICAL, MemberCheck, check_member


@dataclass(frozen=True)
class RepairResult:
    path: str
    donor: str
    repaired: tuple[PieceRange, ...]
    bytes_copied: int
    after: MemberCheck
    seconds: float


def _drive_key(path: str) -> str:
    try:
        return drive_of(path).key
    except OSError:
        return "path:" + path


def _donor_piece(donor: str, r: PieceRange, manifest: Manifest, pace: Pace | None = None) -> bytes | None:
    """The piece's bytes from the donor if they hash to the manifest's value, else None."""
    if pace is not None:
        pace(r.length)
    buf = aligned_buffer(align_up(r.length))
    with open_cold(donor) as reader:
        n = reader.read_into(memoryview(buf)[:align_up(r.length)], r.offset)
    if n < r.length:
        return None
    data = bytes(memoryview(buf)[:r.length])
    h = PieceHasher(manifest.piece_size, r.offset, whole=False)
    h.update(data)
    h.finish()
    return data if h.pieces.get(r.index) == manifest.pieces[r.index] else None


def repair_member(target: Member, donors: list[Member], manifest: Manifest, rig: Rig, *,
                  report: Reporter = None, cancel: threading.Event | None = None,
                  max_rate: float | None = None, clock: Clock | None = None) -> RepairResult:
    t0 = time.monotonic()
    if target.role == "primary":
        raise UsageError(f"{target.path} is the primary (your model file); replicas never write to it — copy a verified replica over it yourself if it is damaged")
    if not os.path.exists(target.path):
        raise MissingError(f"{target.path}: no such file; run `replicas sync` to copy it again")
    pacers = Pacers(max_rate, clock, cancel)
    pace = pacers.for_drive(_drive_key(target.path))
    before = check_member(target, manifest, rig, mode="full", report=report, cancel=cancel, pace=pace)
    if before.state == IDENTICAL:
        _remember(rig, target, manifest, before)
        return RepairResult(target.path, "", (), 0, before, time.monotonic() - t0)
    if before.state != "mismatch":
        raise MissingError(f"{target.path}: {before.state}: {before.detail}")
    bad = list(before.bad)
    clear_stamp(target.path, rig)
    fd = os.open(target.path, os.O_WRONLY | os.O_CLOEXEC)
    copied, fixed, donor_used = 0, [], set()
    try:
        if os.fstat(fd).st_size != manifest.size:
            os.ftruncate(fd, manifest.size)
        for r in bad:
            if cancel is not None and cancel.is_set():
                break
            data = None
            for d in donors:
                try:
                    data = _donor_piece(d.path, r, manifest, pacers.for_drive(_drive_key(d.path)))
                except OSError:
                    data = None
                if data is not None:
                    donor_used.add(d.path)
                    break
            if data is None:
                raise MismatchError(f"no member holds a good copy of piece {r.index} (bytes {r.offset}+{r.length}); the rig cannot repair it")
            if pace is not None:
                pace(len(data))
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], r.offset + done)
            copied += len(data)
            fixed.append(r)
            emit(report, Progress(target.path, "repair", copied, sum(b.length for b in bad)))
        os.fsync(fd)
    except OSError as e:
        raise WriteError(f"{target.path}: write failed during repair: {e.strerror or e}; re-run to finish") from e
    finally:
        os.close(fd)
    after = check_member(target, manifest, rig, mode="full", report=report, cancel=cancel, pace=pace)
    _remember(rig, target, manifest, after)
    return RepairResult(target.path, ", ".join(sorted(donor_used)), tuple(fixed), copied, after, time.monotonic() - t0)


def _remember(rig: Rig, target: Member, manifest: Manifest, check: MemberCheck) -> None:
    """The verdict of repair's own full verification replaces the one `status` shows."""
    v = verdict_of_check(check.state, time.time(), manifest, "repair", check.bad, check.detail)
    if v is not None:
        record_verdicts(rig, {target.path: v})
