"""Repairing a replica: re-copy only the bad pieces of its bad files from a member whose pieces
verify, copy a missing file whole (temporary name, atomic rename), then verify again. Both
verifications also parse each file (`verify.check_file`): a file whose bytes equal the manifest
but do not parse is `broken` in every copy alike, so repair names it and leaves it as it is. A file's
stamp is withdrawn before its bytes change, so an interrupted repair leaves a file that quick
verify will not trust; a re-run picks up the remaining pieces.
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
from core.fsutil import folder_lock, fsync_dir
from core.rig import Member, Rig

from .checks import BROKEN, IDENTICAL, MISMATCH, MISSING, FilePiece, MemberCheck
from core.coldio import align_up, aligned_buffer, open_cold
from core.drives import drive_of
from .hashing import PieceHasher
from .manifest import Manifest, ModelManifest, PieceRange
from models.modelset import DIR, FILE, SPLIT, member_files
from .records import record_verdicts
from .stamps import clear_stamp
from .throttle import Clock, Pace, Pacers
from .verify import as_model, check_member, verdict_changes

REPAIR_SUFFIX = ".repair"      # a missing file is rebuilt as .NAME.repair beside it, then renamed


@dataclass(frozen=True)
class RepairResult:
    path: str
    donor: str
    repaired: tuple[FilePiece, ...]                # pieces re-copied in place
    bytes_copied: int
    after: MemberCheck
    seconds: float
    restored: tuple[str, ...] = ()                 # files that were missing, copied whole


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


class _Donors:
    """Good pieces from the other members' copies of one file, the first that verifies."""

    def __init__(self, paths: list[str], manifest: Manifest, pacers: Pacers):
        self.paths, self.manifest, self.pacers = paths, manifest, pacers
        self.used: set[str] = set()

    def piece(self, r: PieceRange) -> bytes:
        for p in self.paths:
            try:
                data = _donor_piece(p, r, self.manifest, self.pacers.for_drive(_drive_key(p)))
            except OSError:
                data = None
            if data is not None:
                self.used.add(p)
                return data
        raise MismatchError(f"no member holds a good copy of piece {r.index} of {self.manifest.name or 'the model'} "
                            f"(bytes {r.offset}+{r.length}); the rig cannot repair it")


def _write_all(fd: int, data: bytes, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


def repair_member(target: Member, donors: list[Member], manifest: Manifest | ModelManifest, rig: Rig, *,
                  report: Reporter = None, cancel: threading.Event | None = None,
                  max_rate: float | None = None, clock: Clock | None = None) -> RepairResult:
    """Re-copy the bad pieces of each bad file of a replica, and each missing file whole
    (through a temporary name and an atomic rename); never a byte of the primary. The replica's
    destination folder is locked as `replicas sync` locks it: one writer at a time."""
    if target.role == "primary":
        raise UsageError(f"{target.path} is the primary (your model file); replicas never write to it — copy a verified "
                         "replica over it yourself if it is damaged")
    dest = os.path.dirname(os.path.abspath(target.path))
    if not os.path.isdir(dest):
        return _repair(target, donors, manifest, rig, report=report, cancel=cancel, max_rate=max_rate, clock=clock)
    with folder_lock(dest, f"destination {dest}: another `replicas sync` or repair is writing into it; wait for it to "
                           "finish, then run this again"):
        return _repair(target, donors, manifest, rig, report=report, cancel=cancel, max_rate=max_rate, clock=clock)


def _repair(target: Member, donors: list[Member], manifest: Manifest | ModelManifest, rig: Rig, *,
            report: Reporter, cancel: threading.Event | None, max_rate: float | None, clock: Clock | None) -> RepairResult:
    t0 = time.monotonic()
    model = as_model(manifest)
    located = member_files(target, model)
    home = target.path if model.layout == DIR else os.path.dirname(target.path)
    if (model.layout == FILE and not os.path.exists(target.path)) or not os.path.isdir(home):
        raise MissingError(f"{target.path}: no such {'directory' if model.layout == DIR else 'file'}; "
                           "run `replicas sync` to copy it again")
    pacers = Pacers(max_rate, clock, cancel)
    pace = pacers.for_drive(_drive_key(home))
    before = check_member(target, model, rig, mode="full", report=report, cancel=cancel, pace=pace,
                          model_format=rig.format)
    if not any(f.state in (MISMATCH, MISSING) for f in before.files) and before.state in (IDENTICAL, BROKEN):
        _remember(rig, target, model, before)
        return RepairResult(target.path, "", (), 0, before, time.monotonic() - t0)
    unreadable = [f for f in before.files if f.state not in (IDENTICAL, MISMATCH, MISSING, BROKEN)]
    if unreadable:
        f = unreadable[0]
        raise MissingError(f"{f.path}: {f.state}: {f.detail}")
    donor_files = {rel: [] for rel, _, _ in located}
    for d in donors:
        for rel, p, _ in member_files(d, model):
            if rel in donor_files:
                donor_files[rel].append(p)
    # The first file of a split set is the one engines open: it is restored last, after the others.
    todo = sorted((f for f in before.files if f.state in (MISMATCH, MISSING)),
                  key=lambda f: f.path == target.path and model.layout == SPLIT)
    total = sum(model.file(f.file).size if f.state == MISSING else sum(b.length for b in f.bad) for f in todo)
    progress = _Progress(report, target.path, total)
    fixed, restored, used = [], [], set()
    for f in todo:
        if cancel is not None and cancel.is_set():
            break
        fm = model.file(f.file)
        source = _Donors(donor_files[f.file], fm, pacers)
        if f.state == MISSING:
            _restore(f.path, fm, source, pace, progress, cancel)
            restored.append(f.file)
        else:
            fixed += [FilePiece(f.file, r.index, r.offset, r.length)
                      for r in _patch(f.path, fm, f.bad, source, rig, pace, progress, cancel)]
        used |= source.used
    after = check_member(target, model, rig, mode="full", report=report, cancel=cancel, pace=pace,
                         model_format=rig.format)
    _remember(rig, target, model, after)
    return RepairResult(target.path, ", ".join(sorted(used)), tuple(fixed), progress.done, after,
                        time.monotonic() - t0, tuple(restored))


class _Progress:
    def __init__(self, report: Reporter, task: str, total: int):
        self.report, self.task, self.total, self.done = report, task, total, 0

    def add(self, n: int) -> None:
        self.done += n
        emit(self.report, Progress(self.task, "repair", self.done, self.total))


def _patch(path: str, fm: Manifest, bad: tuple[PieceRange, ...], source: _Donors, rig: Rig, pace: Pace | None,
           progress: _Progress, cancel: threading.Event | None) -> list[PieceRange]:
    """Re-copy the bad pieces of one file in place. The stamp goes before a byte changes, so an
    interrupted repair leaves a file quick verify will not trust."""
    clear_stamp(path, rig)
    fixed = []
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != fm.size:
            os.ftruncate(fd, fm.size)
        for r in bad:
            if cancel is not None and cancel.is_set():
                break
            data = source.piece(r)
            if pace is not None:
                pace(len(data))
            _write_all(fd, data, r.offset)
            fixed.append(r)
            progress.add(len(data))
        os.fsync(fd)
    except OSError as e:
        raise WriteError(f"{path}: write failed during repair: {e.strerror or e}; re-run to finish") from e
    finally:
        os.close(fd)
    return fixed


def _restore(path: str, fm: Manifest, source: _Donors, pace: Pace | None, progress: _Progress,
             cancel: threading.Event | None) -> None:
    """Copy a missing file whole from verified donor pieces: written under a hidden temporary
    name beside it, fsynced, renamed into place, the directory fsynced; a failure or Ctrl-C
    leaves no file under its final name."""
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f".{os.path.basename(path)}{REPAIR_SUFFIX}")
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise WriteError(f"{path}: cannot create it during repair: {e.strerror or e}") from e
    done = False
    try:
        os.ftruncate(fd, fm.size)
        for i in range(fm.count):
            if cancel is not None and cancel.is_set():
                return
            r = fm.piece(i)
            data = source.piece(r)
            if pace is not None:
                pace(len(data))
            _write_all(fd, data, r.offset)
            progress.add(len(data))
        os.fsync(fd)
        done = True
    except OSError as e:
        raise WriteError(f"{path}: write failed during repair: {e.strerror or e}; re-run to finish") from e
    finally:
        os.close(fd)
        if not done:
            os.unlink(tmp)
    modes = [os.stat(p).st_mode & 0o777 for p in source.paths if os.path.exists(p)]
    if modes:
        os.chmod(tmp, modes[0])           # the donor's mode, as sync keeps the source's
    os.rename(tmp, path)
    fsync_dir(folder)


def _remember(rig: Rig, target: Member, model: ModelManifest, check: MemberCheck) -> None:
    """The verdict of repair's own full verification of each file replaces the one `status` shows."""
    record_verdicts(rig, verdict_changes([target], {target.path: check}, model, time.time(), how="repair"))
