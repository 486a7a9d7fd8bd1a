"""Proving members identical to the manifest: quick (trust a live stamp), full (cold re-read),
sample (a random subset of pieces). Every file of the model is judged against its own
`Manifest` from the `ModelManifest`; a member is identical only when every file is. One
sequential cold reader per drive (a member's files in the model's order), drives in parallel,
each paced by --max-rate when given; a member in RAM has a reader of its own (`group_by_drive`).

What a verification finds is remembered in the rig (`records`) per file path: the verdict,
which `status` shows until a repair or a clean verify replaces it, and, while a `--full` run is
unfinished, how far it got, so `--resume` continues there.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from typing import Callable

from core.errors import Interrupted, UsageError
from core.events import Notice, Progress, Reporter, emit
from core.fsutil import FileIdentity
from core.rig import Member, Rig
from core.units import plural

from .checks import BROKEN, IDENTICAL, MISMATCH, MISSING, UNREADABLE, FileCheck, MemberCheck, VerifyReport
from core.coldio import open_cold, read_sequential
from .constants import SCRUB_SAVE_S
from .hashing import PieceHasher
from .manifest import Manifest, ModelManifest, bad_pieces
from .manifests import load_manifest
from models.modelset import member_files
from models.parsecheck import check_parses, file_format
from .records import load_scrub, load_verdicts, record_scrub, record_verdicts
from .stamps import VERIFIED, stamp_state, write_stamp
from .throttle import Clock, Pace, Pacers
from .verdict import ScrubMark, Verdict, resume_point, standing_mismatch, verdict_of_check


# Given a file's path, a sink for every byte a whole-file verify reads of it, or None.
Tap = Callable[[str], Callable[[memoryview], None] | None]


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
                phase: str = "verify", report: Reporter = None, cancel: threading.Event | None = None,
                pace: Pace | None = None,
                on_piece: Callable[[int, str], None] | None = None,
                on_bytes: Callable[[memoryview], None] | None = None) -> tuple[dict[int, str], int]:
    """Cold-read the given pieces (all by default) and hash each. Returns ({index: hex}, bytes read).

    Reads stop at end of file: pieces a short file cannot hold are simply absent. `pace` paces
    the reads (--max-rate); `on_piece(index, hex)` hears of each piece as it is hashed; `on_bytes`
    is fed every byte read, in order (another digest taken on the same read, e.g. an upstream SHA-256).
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
            for _, view in read_sequential(reader, start, end, cancel=cancel, pace=pace):
                if on_bytes is not None:
                    on_bytes(view)
                for i in h.update(view):
                    hashes[i] = h.pieces[i]
                    if on_piece is not None:
                        on_piece(i, h.pieces[i])
                done += len(view)
                emit(report, Progress(task or path, phase, done, total))
            if cancel is not None and cancel.is_set():
                raise Interrupted(f"verification of {path} cancelled")
            if h.pos == end and end == manifest.piece(hi - 1).offset + manifest.piece(hi - 1).length:
                for i in h.finish():
                    hashes[i] = h.pieces[i]
                    if on_piece is not None:
                        on_piece(i, h.pieces[i])
    return hashes, done


class ScrubBook:
    """The progress marks of one `verify --full` run, in memory, per file: where each file starts
    (the rig's marks when resuming, else the first piece), how far it has got; `save()` writes
    the changed marks to the rig (the CLI's Ctrl-C ends the run through it)."""

    def __init__(self, rig: Rig, resume: bool, report: Reporter = None):
        self.rig, self.resume, self.report = rig, resume, report
        self.marks = load_scrub(rig)
        self.changes: dict[str, ScrubMark | None] = {}
        self.lock = threading.Lock()
        self.saved = time.monotonic()

    def start(self, path: str, manifest: Manifest, ident: FileIdentity) -> tuple[int, tuple[int, ...]]:
        if not self.resume:
            return 0, ()
        key = (ident.size, ident.mtime_ns, ident.inode, ident.device)
        first, bad = resume_point(self.marks.get(path), manifest, key)
        if first >= manifest.count:
            emit(self.report, Notice(path, f"all {manifest.count} pieces were read before the interruption: "
                                           "nothing left to read"))
        elif first:      # pieces counted from 1, as a user counts them
            emit(self.report, Notice(path, f"resuming at piece {first + 1} of {manifest.count}"))
        elif path in self.marks:
            emit(self.report, Notice(path, "the file or the manifest changed since the interrupted verify: "
                                           "starting from the first piece"))
        return first, bad

    def mark(self, path: str, mark: ScrubMark | None) -> None:
        with self.lock:
            self.changes[path] = mark
            due = time.monotonic() - self.saved >= SCRUB_SAVE_S
        if due:
            self.save()      # now and then, so even a killed run keeps most of its progress

    def save(self) -> None:
        with self.lock:
            changes, self.changes = self.changes, {}
            self.saved = time.monotonic()
            # Written under the lock: two savers must not land an older set of marks last.
            record_scrub(self.rig, changes)


def as_model(manifest: Manifest | ModelManifest) -> ModelManifest:
    """A one-file Manifest is a one-file model."""
    return manifest if isinstance(manifest, ModelManifest) else ModelManifest((manifest,))


def check_file(path: str, rel: str, manifest: Manifest, rig: Rig, *, mode: str = "quick",
               indices: list[int] | None = None, report: Reporter = None, cancel: threading.Event | None = None,
               pace: Pace | None = None, trust_stamp: bool = True, stamp: bool = True, tag_file: bool = False,
               scrub: ScrubBook | None = None, tap: Tap | None = None, parse_as: str | None = None) -> FileCheck:
    """Verify one file of a member against its own manifest. mode: 'quick' (a live stamp is
    trusted, else full), 'full', 'sample' (only `indices` are read).

    trust_stamp=False makes quick re-read (a mismatch was found since the stamp); stamp=False
    records nothing on the file or in the rig; tag_file: the stamp may go in the file's xattr
    (a replica we wrote), else a sidecar. `scrub` (full mode) resumes at, and keeps, the file's
    progress mark. `tap(path)` may give a sink fed every byte of a whole-file read (`hash_pieces`'s
    `on_bytes`); a read that starts past the first byte (a resumed scrub) or a sample feeds none.
    `parse_as` (gguf / safetensors): a file whose bytes a full read found identical must also parse
    as that format (`models.parsecheck`); one that does not is BROKEN, and is not stamped.
    """
    t0 = time.monotonic()
    base = dict(file=rel, path=path)
    try:
        ident = FileIdentity.of(path)
    except FileNotFoundError:
        return FileCheck(**base, state=MISSING, how=mode, detail="no such file (drive unplugged or file deleted?)")
    except OSError as e:
        return FileCheck(**base, state=UNREADABLE, how=mode, detail=e.strerror or str(e))
    if not os.path.isfile(path):
        return FileCheck(**base, state=UNREADABLE, how=mode, detail="not a regular file")
    if mode == "quick" and trust_stamp and stamp_state(path, manifest, rig) == VERIFIED:
        return FileCheck(**base, state=IDENTICAL, how="stamp", size=ident.size, seconds=time.monotonic() - t0)
    how = "sample" if mode == "sample" else "full"
    on_piece, prior_bad = None, ()
    if how == "full":
        indices = None
    if scrub is not None and mode == "full":
        first, prior_bad = scrub.start(path, manifest, ident)
        indices = list(range(first, manifest.count)) if first else None
        done, found = [first], list(prior_bad)
        key = (ident.size, ident.mtime_ns, ident.inode, ident.device)

        def on_piece(i: int, digest: str) -> None:
            # Pieces complete in file order, so the pieces done form a prefix of the file.
            if digest != manifest.pieces[i]:
                found.append(i)
            if i == done[0]:
                done[0] = i + 1
                scrub.mark(path, ScrubMark(manifest.digest(), key, done[0], tuple(found)))
    try:
        if indices is not None and not indices:
            hashes, nread = {}, 0         # a sample that drew no piece of this file checks its size only
        else:
            sink = tap(path) if tap is not None and indices is None else None
            hashes, nread = hash_pieces(path, manifest, indices, report=report, cancel=cancel, pace=pace,
                                        on_piece=on_piece, on_bytes=sink)
    except OSError as e:
        return FileCheck(**base, state=UNREADABLE, how=how, size=ident.size, detail=f"read failed: {e.strerror or e}",
                         seconds=time.monotonic() - t0)
    if scrub is not None and on_piece is not None:
        # Done: a resume of this run skips the file (the mark goes once the whole run ends).
        scrub.mark(path, ScrubMark(manifest.digest(), key, manifest.count, tuple(found)))
    bad = bad_pieces(manifest, hashes, ident.size)
    if prior_bad:
        bad = sorted(set(bad) | {manifest.piece(i) for i in prior_bad}, key=lambda r: r.index)
    detail = ""
    if ident.size != manifest.size:
        detail = f"size {ident.size} bytes, manifest says {manifest.size}"
    if bad or ident.size != manifest.size:
        return FileCheck(**base, state=MISMATCH, how=how, bad=tuple(bad), size=ident.size, bytes_read=nread,
                         seconds=time.monotonic() - t0, detail=detail, pieces_checked=len(hashes))
    parsed = check_parses(path, parse_as) if parse_as and how == "full" else None
    if parsed is not None and not parsed.ok:
        return FileCheck(**base, state=BROKEN, how=how, size=ident.size, bytes_read=nread, seconds=time.monotonic() - t0,
                         detail=f"identical to the manifest, but does not parse as {parsed.format}: {parsed.detail}",
                         pieces_checked=len(hashes), parsed=parsed.format, parses=False)
    stamped = None
    if stamp and how == "full" and FileIdentity.of(path) == ident:
        stamped = write_stamp(path, manifest, rig, tag_file=tag_file, identity=ident)
    return FileCheck(**base, state=IDENTICAL, how=how, size=ident.size, bytes_read=nread,
                     seconds=time.monotonic() - t0, stamped=stamped, pieces_checked=len(hashes),
                     parsed=parsed.format if parsed else "", parses=True if parsed else None)


def sample_indices(manifest: ModelManifest, pct: float, rng: random.Random) -> list[list[int]]:
    """PCT% of the model's pieces (at least one), drawn over all its files; per file, the indices
    drawn. For a one-file model this is the draw a one-file verify always made."""
    total = manifest.count
    k = min(max(1, round(total * pct / 100)), total) if total else 0
    drawn = sorted(rng.sample(range(total), k))
    out, start = [], 0
    for f in manifest.files:
        out.append([i - start for i in drawn if start <= i < start + f.count])
        start += f.count
    return out


def check_member(member: Member, manifest: Manifest | ModelManifest, rig: Rig, *, mode: str = "quick",
                 sample: float | None = None, rng: random.Random | None = None, report: Reporter = None,
                 cancel: threading.Event | None = None, pace: Pace | None = None, trust_stamp: bool = True,
                 untrusted: frozenset[str] = frozenset(), stamp: bool = True,
                 scrub: ScrubBook | None = None, tap: Tap | None = None, model_format: str = "") -> MemberCheck:
    """Verify every file of the model where `member` keeps it (a partial replica: the files it
    holds; the others are not its own and never "missing"), in the model's order, each against
    its own manifest (`check_file`); a missing file is named and the others are still checked.

    `untrusted`: file paths whose stamp quick verify must not trust (a mismatch was found since).
    `model_format`: the model's format when the manifest does not say it (a schema-1 manifest):
    each file read whole must parse as it (`check_file`'s `parse_as`).
    """
    model = as_model(manifest)
    fmt = model.format or model_format
    located = member_files(member, model)
    if len(located) != len(model.files):    # a partial replica: draw among the files it holds
        held = {rel for rel, _, _ in located}
        model = dataclasses.replace(model, files=tuple(f for f in model.files if f.name in held)) if held else model
    draws = sample_indices(model, sample or 0, rng or random.Random()) if mode == "sample" else [None] * len(located)
    files = []
    for (rel, path, fm), indices in zip(located, draws):
        files.append(check_file(path, rel, fm, rig, mode=mode, indices=indices, report=report, cancel=cancel,
                                pace=pace, trust_stamp=trust_stamp and path not in untrusted, stamp=stamp,
                                tag_file=member.role == "replica", scrub=scrub, tap=tap,
                                parse_as=file_format(fmt, model.layout, rel)))
    return MemberCheck(member.path, member.name, member.role, tuple(files))


def group_by_drive(members: list[Member]) -> list[tuple[str, list[Member]]]:
    """Lanes of (drive key, members), read in parallel: members sharing a physical drive are read
    one after another in one lane. A member in RAM (tmpfs) has a lane of its own: there is no
    drive to share, its reading is the CPU's hashing, and lanes side by side keep both cores busy
    while one of them tears down the map of a file it has finished (docs/replicas.md, "Hashing at
    the drives' pace"). The key is the drive's, also for those lanes: --max-rate paces a drive."""
    from core.drives import drive_of
    from core.tiers import is_memory

    lanes: list[tuple[str, list[Member]]] = []
    shared: dict[str, list[Member]] = {}
    for m in members:
        try:
            folder = os.path.dirname(m.path) or "."
            exists = os.path.exists(folder)
            key = drive_of(folder).key if exists else "missing:" + m.path
            in_ram = exists and is_memory(folder)
        except OSError:
            key, in_ram = "missing:" + m.path, False
        if in_ram:
            lanes.append((key, [m]))
        elif key in shared:
            shared[key].append(m)
        else:
            shared[key] = [m]
            lanes.append((key, shared[key]))
    return lanes


def against(rig: Rig, other: ModelManifest | None = None, where: str = "", any_files: bool = False) -> tuple[ModelManifest, bool]:
    """The manifest a verify of `rig` checks against and whether it records (stamps, verdicts):
    the rig's own, or `other` (from `where`: another host's manifest.json, `replicas hash --json`).
    Stamps and verdicts are about the rig's own manifest, so another one only checks, unless it is
    the same, file for file. A manifest of another model layout than the rig's is refused
    (UsageError) unless `any_files` (the files to check are given one by one)."""
    own = load_manifest(rig, required=other is None)
    manifest = other if other is not None else own
    record = own is not None and [f.digest() for f in own.files] == [f.digest() for f in manifest.files]
    if other is not None and rig.model is not None and rig.format and manifest.format and \
            (rig.layout, tuple(rig.files)) != (manifest.layout, manifest.names) and not any_files:
        raise UsageError(f"{where or 'the manifest'} describes a {manifest.layout} model of "
                         f"{plural(len(manifest.files), 'file')}, the rig's model is a {rig.layout} of "
                         f"{plural(len(rig.files), 'file')}; give the matching manifest")
    return manifest, record


def verify_members(members: list[Member], manifest: Manifest | ModelManifest, rig: Rig, *, mode: str = "quick",
                   sample: float | None = None, seed: int | None = None, report: Reporter = None,
                   cancel: threading.Event | None = None, max_rate: float | None = None, clock: Clock | None = None,
                   resume: bool = False, record: bool = True, tap: Tap | None = None) -> VerifyReport:
    """Check members, one thread per physical drive (and per member in RAM), each member's files
    in the model's order.
    `max_rate` (bytes/s, per drive) paces the reads by `clock` (the wall clock by default).
    `record` (the manifest is the rig's own): stamp files that verify, remember each file's
    verdict in the rig, and in full mode keep the progress of an interrupted run for `resume`.
    A quick run re-reads a file whose last verdict is a mismatch: its stamp may predate the damage.
    `tap`: see `check_file` (each drive's thread feeds the sinks of its own files).
    """
    t0 = time.monotonic()
    model = as_model(manifest)
    if mode == "sample" and seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    results: dict[str, MemberCheck] = {}
    errors: list[BaseException] = []
    verdicts = load_verdicts(rig) if record else {}
    scrub = ScrubBook(rig, resume, report) if record and mode == "full" else None
    pacers = Pacers(max_rate, clock, cancel)

    def work(key, group):
        try:
            for m in group:
                rng = random.Random(f"{seed}:{m.path}") if seed is not None else None
                untrusted = frozenset(p for _, p, fm in member_files(m, model)
                                      if standing_mismatch(verdicts.get(p), fm))
                results[m.path] = check_member(m, model, rig, mode=mode, sample=sample, rng=rng, report=report,
                                               cancel=cancel, pace=pacers.for_drive(key), untrusted=untrusted,
                                               stamp=record and m.role in ("primary", "replica"), scrub=scrub,
                                               tap=tap, model_format=rig.format)
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k, g), name="verify") for k, g in group_by_drive(members)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if scrub is not None and not errors:
            for m in members:
                for _, p, _ in member_files(m, model):
                    scrub.mark(p, None)      # the run is over: nothing is left to resume
    finally:
        if scrub is not None:
            scrub.save()
        if record:
            record_verdicts(rig, verdict_changes(members, results, model, time.time()))
    if errors:
        raise errors[0]
    return VerifyReport(tuple(results[m.path] for m in members), time.monotonic() - t0,
                        seed if mode == "sample" else None)


def verdict_changes(members: list[Member], results: dict[str, MemberCheck], model: ModelManifest,
                    now: float, how: str | None = None) -> dict[str, Verdict]:
    """The verdict each checked file of the rig's members leaves, keyed by the file's path."""
    changes = {}
    for m in members:
        c = results.get(m.path)
        if c is None or m.role not in ("primary", "replica"):
            continue
        for f in c.files:
            v = verdict_of_check(f.state, now, model.file(f.file), how or f.how, f.bad, f.detail)
            if v:
                changes[f.path] = v
    return changes
