"""Repairing a replica: re-copy only its bad pieces from a member whose pieces verify, then
verify again. The replica's stamp is withdrawn before its bytes change, so an interrupted
repair leaves a file that quick verify will not trust; a re-run picks up the remaining pieces.
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
from .hashing import PieceHasher
from .manifest import Manifest, PieceRange
from .stamps import clear_stamp
from .verify import IDENTICAL, MemberCheck, check_member


@dataclass(frozen=True)
class RepairResult:
    path: str
    donor: str
    repaired: tuple[PieceRange, ...]
    bytes_copied: int
    after: MemberCheck
    seconds: float


def _donor_piece(donor: str, r: PieceRange, manifest: Manifest) -> bytes | None:
    """The piece's bytes from the donor if they hash to the manifest's value, else None."""
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
                  report: Reporter = None, cancel: threading.Event | None = None) -> RepairResult:
    t0 = time.monotonic()
    if target.role == "primary":
        raise UsageError(f"{target.path} is the primary (your model file); replicas never write to it — copy a verified replica over it yourself if it is damaged")
    if not os.path.exists(target.path):
        raise MissingError(f"{target.path}: no such file; run `replicas sync` to copy it again")
    before = check_member(target, manifest, rig, mode="full", report=report, cancel=cancel)
    if before.state == IDENTICAL:
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
                    data = _donor_piece(d.path, r, manifest)
                except OSError:
                    data = None
                if data is not None:
                    donor_used.add(d.path)
                    break
            if data is None:
                raise MismatchError(f"no member holds a good copy of piece {r.index} (bytes {r.offset}+{r.length}); the rig cannot repair it")
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
    after = check_member(target, manifest, rig, mode="full", report=report, cancel=cancel)
    return RepairResult(target.path, ", ".join(sorted(donor_used)), tuple(fixed), copied, after, time.monotonic() - t0)
