"""Proving members identical to the manifest: quick (trust a live stamp), full (cold re-read),
sample (a random subset of pieces). One sequential cold reader per drive, drives in parallel.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass

from core.errors import EXIT_MISMATCH, EXIT_MISSING, EXIT_OK, Interrupted
from core.events import Progress, Reporter, emit
from core.fsutil import FileIdentity
from core.rig import Member, Rig

from .coldio import open_cold, read_sequential
from .hashing import PieceHasher
from .manifest import Manifest, PieceRange, bad_pieces
from .stamps import VERIFIED, stamp_state, write_stamp

IDENTICAL, MISMATCH, MISSING, UNREADABLE = "identical", "mismatch", "missing", "unreadable"


@dataclass(frozen=True)
class MemberCheck:
    path: str
    name: str
    role: str
    state: str                   # identical / mismatch / missing / unreadable
    how: str                     # stamp / full / sample
    bad: tuple[PieceRange, ...] = ()
    size: int | None = None      # bytes found on disk
    bytes_read: int = 0
    seconds: float = 0.0
    detail: str = ""
    stamped: str | None = None   # 'xattr' / 'sidecar' when a full verification was recorded
    pieces_checked: int = 0


@dataclass(frozen=True)
class VerifyReport:
    members: tuple[MemberCheck, ...]
    seconds: float
    sample_seed: int | None = None

    @property
    def exit_code(self) -> int:
        """1 if any member mismatches, else 3 if any is missing or unreadable, else 0."""
        states = {m.state for m in self.members}
        if MISMATCH in states:
            return EXIT_MISMATCH
        if states & {MISSING, UNREADABLE}:
            return EXIT_MISSING
        return EXIT_OK


def runs_of(indices: list[int]) -> list[tuple[int, int]]:
    """[3,4,5,9] -> [(3,6),(9,10)]: contiguous runs as half-open index ranges."""
    out = []
    for i in sorted(indices):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def hash_pieces(path: str, manifest: Manifest, indices: list[int] | None = None, *, task: str | None = None,
                phase: str = "verify", report: Reporter = None, cancel: threading.Event | None = None) -> tuple[dict[int, str], int]:
    """Cold-read the given pieces (all by default) and hash each. Returns ({index: hex}, bytes read).

    Reads stop at end of file: pieces a short file cannot hold are simply absent.
    Raises OSError (unreadable) and Interrupted.
    """
    idx = list(range(manifest.count)) if indices is None else sorted(set(indices))
    total = sum(manifest.piece(i).length for i in idx)
    hashes: dict[int, str] = {}
    done = 0
    with open_cold(path) as reader:
        for lo, hi in runs_of(idx):
            start = manifest.piece(lo).offset
            end = min(manifest.piece(hi - 1).offset + manifest.piece(hi - 1).length, reader.size)
            if start >= end:
                continue
            h = PieceHasher(manifest.piece_size, start, whole=False)
            for _, view in read_sequential(reader, start, end, cancel=cancel):
                for i in h.update(view):
                    hashes[i] = h.pieces[i]
                done += len(view)
                emit(report, Progress(task or path, phase, done, total))
            if cancel is not None and cancel.is_set():
                raise Interrupted(f"verification of {path} cancelled")
            if h.pos == end and end == manifest.piece(hi - 1).offset + manifest.piece(hi - 1).length:
                for i in h.finish():
                    hashes[i] = h.pieces[i]
    return hashes, done


def check_member(member: Member, manifest: Manifest, rig: Rig, *, mode: str = "quick", sample: float | None = None,
                 rng: random.Random | None = None, report: Reporter = None,
                 cancel: threading.Event | None = None) -> MemberCheck:
    """Verify one member. mode: 'quick' (a live stamp is trusted, else full), 'full', 'sample'."""
    t0 = time.monotonic()
    base = dict(path=member.path, name=member.name, role=member.role)
    try:
        ident = FileIdentity.of(member.path)
    except FileNotFoundError:
        return MemberCheck(**base, state=MISSING, how=mode, detail="no such file (drive unplugged or file deleted?)")
    except OSError as e:
        return MemberCheck(**base, state=UNREADABLE, how=mode, detail=e.strerror or str(e))
    if not os.path.isfile(member.path):
        return MemberCheck(**base, state=UNREADABLE, how=mode, detail="not a regular file")
    if mode == "quick" and stamp_state(member.path, manifest, rig) == VERIFIED:
        return MemberCheck(**base, state=IDENTICAL, how="stamp", size=ident.size, seconds=time.monotonic() - t0)
    how = "sample" if mode == "sample" else "full"
    indices = None
    if how == "sample":
        rng = rng or random.Random()
        k = max(1, round(manifest.count * (sample or 0) / 100)) if manifest.count else 0
        indices = sorted(rng.sample(range(manifest.count), min(k, manifest.count)))
    try:
        hashes, nread = hash_pieces(member.path, manifest, indices, report=report, cancel=cancel)
    except OSError as e:
        return MemberCheck(**base, state=UNREADABLE, how=how, size=ident.size, detail=f"read failed: {e.strerror or e}",
                           seconds=time.monotonic() - t0)
    bad = bad_pieces(manifest, hashes, ident.size)
    detail = ""
    if ident.size != manifest.size:
        detail = f"size {ident.size} bytes, manifest says {manifest.size}"
    if bad or ident.size != manifest.size:
        return MemberCheck(**base, state=MISMATCH, how=how, bad=tuple(bad), size=ident.size, bytes_read=nread,
                           seconds=time.monotonic() - t0, detail=detail, pieces_checked=len(hashes))
    stamped = None
    if how == "full" and FileIdentity.of(member.path) == ident:
        stamped = write_stamp(member.path, manifest, rig, tag_file=member.role == "replica", identity=ident)
    return MemberCheck(**base, state=IDENTICAL, how=how, size=ident.size, bytes_read=nread,
                       seconds=time.monotonic() - t0, stamped=stamped, pieces_checked=len(hashes))


def group_by_drive(members: list[Member]) -> list[list[Member]]:
    """Members sharing a physical drive are read one after another; drives run in parallel."""
    from .drives import drive_of

    groups: dict[str, list[Member]] = {}
    for m in members:
        try:
            key = drive_of(os.path.dirname(m.path) or ".").key if os.path.exists(os.path.dirname(m.path) or ".") else "missing:" + m.path
        except OSError:
            key = "missing:" + m.path
        groups.setdefault(key, []).append(m)
    return list(groups.values())


def verify_members(members: list[Member], manifest: Manifest, rig: Rig, *, mode: str = "quick", sample: float | None = None,
                   seed: int | None = None, report: Reporter = None, cancel: threading.Event | None = None) -> VerifyReport:
    t0 = time.monotonic()
    if mode == "sample" and seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    results: dict[str, MemberCheck] = {}
    errors: list[BaseException] = []

    def work(group):
        try:
            for m in group:
                rng = random.Random(f"{seed}:{m.path}") if seed is not None else None
                results[m.path] = check_member(m, manifest, rig, mode=mode, sample=sample, rng=rng, report=report, cancel=cancel)
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(g,), name="verify") for g in group_by_drive(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return VerifyReport(tuple(results[m.path] for m in members), time.monotonic() - t0,
                        seed if mode == "sample" else None)
