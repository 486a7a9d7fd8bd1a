"""What `replicas sync` does to each destination, decided before a byte is written (pure).

`sync.py` gathers the facts from the disk (does the target exist, is it stamped, what does the
partial's journal say, how much room is there) and asks the functions here what they mean:
no-op, adopt (verify a file that is already there), resume, a fresh copy, replace, or a refusal
naming the fix — per file of the model. How a destination's per-file results add up to one
answer, the piece and block arithmetic of the copy, the free-space rule, and the one way a source
that changed during the copy is reported live here too. No disk, no threads.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterable, Iterator, Sequence

from core.errors import EXIT_MISMATCH, EXIT_OK, MismatchError, UsageError, WriteError
from core.constants import ALIGNMENT, IO_BLOCK
from core.units import format_bytes, plural

from .constants import (
    HEADROOM_FRACTION,
    HEADROOM_MAX,
    HEADROOM_MIN,
    JOURNAL_SUFFIX,
    PARTIAL_SUFFIX,
)
from .manifest import PieceRange
from .partial import choice_to_dict

if TYPE_CHECKING:
    from core.fsutil import FileIdentity

# What happens to one destination.
COPY, RESUME, NOOP, ADOPT, REPLACE = "copy", "resume", "noop", "adopt", "replace"
# A file a partial replica does not hold (docs/replicas.md, "Partial replicas"): never touched there.
SKIP = "not-held"
RESTART_REASON = "restart (source changed)"

# The one headline of every way a copy finds its source changed (identity or bytes).
SOURCE_CHANGED = "the source changed during the copy"


@dataclass(frozen=True)
class DestPlan:
    dest_dir: str
    target: str
    action: str                     # copy / resume / noop / adopt (verify an existing file) / replace / not-held
    durable: frozenset = frozenset()  # pieces already durable in the partial (resume)
    reason: str = ""

    @property
    def partial(self) -> str:
        return self.target + PARTIAL_SUFFIX

    @property
    def journal(self) -> str:
        return self.target + JOURNAL_SUFFIX

    @property
    def writes(self) -> bool:
        return self.action in (COPY, RESUME, REPLACE)


@dataclass(frozen=True)
class SetPlan:
    """One destination of a whole model: where it ends up, where it is built, each file's plan."""

    dest_dir: str                   # the directory given on the command line
    target: str                     # the model's final path there (file, first member, directory)
    files: tuple[DestPlan, ...]     # one per model file, in the model's order
    rels: tuple[str, ...]           # the model's relative paths, same order
    staging: str = ""               # a new directory model is built here, renamed to `target` at the end
    extra: tuple[str, ...] = ()     # files in the model's tree that the model does not have (kept)

    @property
    def writes(self) -> bool:
        return any(p.writes for p in self.files)


@dataclass(frozen=True)
class DestResult:
    """What happened at one destination; for a whole model, the sum of its files' results (`files`)."""

    dest_dir: str
    target: str
    action: str
    outcome: str                    # identical / copied / failed / planned
    bytes_written: int = 0
    bytes_to_write: int = 0
    seconds: float = 0.0
    verified: bool = False
    stamped: str | None = None
    bad: tuple[PieceRange, ...] = ()
    error: str = ""
    exit_code: int = EXIT_OK
    file: str = ""                  # a file's result: its path relative to the model
    files: tuple["DestResult", ...] = ()   # a destination's result: one per model file, in order
    extra: tuple[str, ...] = ()     # files the model does not have, reported and kept
    dropped: tuple[str, ...] = ()   # a partial replica that shrank: the copies of ours it no longer holds, removed
    parses: bool | None = None      # a file read back: whether it parses as its model format (None: not parsed)


@dataclass(frozen=True)
class SyncResult:
    source: str                     # the model's path (file, first member of a split set, directory)
    size: int                       # bytes of all its files
    blake3: str                     # a one-file model: the file's BLAKE3; else the model digest
    piece_size: int
    dests: tuple[DestResult, ...]
    source_bytes_read: int
    seconds: float
    dry_run: bool = False
    digest: str = ""                # the model digest (ModelManifest.digest); "" before it is known
    layout: str = "file"
    format: str = ""
    files: tuple[str, ...] = ()     # the model's relative paths, in order
    partial: tuple = ()             # `sync --partial`: one replicas.partial.PartialChoice per destination

    KIND: ClassVar[str] = "sync"    # a result (core.results): `replicas sync --json`
    SCHEMA: ClassVar[int] = 1

    @property
    def exit_code(self) -> int:
        """A mismatch outranks every other failure; otherwise the highest code."""
        return worst_exit(d.exit_code for d in self.dests)

    def to_dict(self) -> dict:
        return sync_result_to_dict(self)


def worst_exit(codes: Iterable[int]) -> int:
    codes = [c for c in codes if c]
    return max(codes, key=lambda c: (c == EXIT_MISMATCH, c)) if codes else EXIT_OK


# How far-reaching each action is: a destination's action is its files' furthest.
_ACTION_RANK = {SKIP: -1, NOOP: 0, ADOPT: 1, COPY: 2, RESUME: 3, REPLACE: 4}


def combine_results(dest_dir: str, target: str, files: Sequence[DestResult], extra: tuple[str, ...] = (),
                    seconds: float = 0.0, dry_run: bool = False, dropped: tuple[str, ...] = ()) -> DestResult:
    """One destination's result from its files' (in the model's order). A one-file model keeps
    the file's own words; a failure of a set names its first failing file."""
    failed = [f for f in files if f.outcome == "failed"]
    if failed:
        outcome = "failed"
    elif dry_run:
        outcome = "planned"
    else:
        outcome = "copied" if any(f.outcome == "copied" for f in files) else "identical"
    if len(files) == 1:
        error = files[0].error
    else:       # a failed file first; else one that was copied but says something (it does not parse)
        said = failed or [f for f in files if f.error]
        error = ("; ".join(f"{f.file}: {f.error}" for f in said[:1])
                 + (f" (and {len(said) - 1} more files)" if len(said) > 1 else ""))
    stamps = sorted({f.stamped for f in files if f.stamped})
    return DestResult(
        dest_dir, target, max((f.action for f in files), key=lambda a: _ACTION_RANK.get(a, 0)), outcome,
        bytes_written=sum(f.bytes_written for f in files), bytes_to_write=sum(f.bytes_to_write for f in files),
        seconds=seconds, verified=any(f.action != SKIP for f in files) and all(f.verified for f in files if f.action != SKIP),
        stamped="+".join(stamps) if stamps else None,
        bad=tuple(b for f in files for b in f.bad), error=error, exit_code=worst_exit(f.exit_code for f in files),
        files=tuple(files), extra=tuple(extra), dropped=tuple(dropped))


def _piece_dict(b: PieceRange, file: str | None = None) -> dict:
    return ({"file": file} if file is not None else {}) | {"index": b.index, "offset": b.offset, "length": b.length}


def _file_dict(f: DestResult) -> dict:
    return {"file": f.file, "target": f.target, "action": f.action, "outcome": f.outcome,
            "bytes_written": f.bytes_written, "bytes_to_write": f.bytes_to_write, "verified": f.verified,
            "stamped": f.stamped, "bad": [_piece_dict(b) for b in f.bad], "error": f.error, "exit_code": f.exit_code,
            "parses": f.parses}


def sync_result_to_dict(res: SyncResult) -> dict:
    """`replicas sync --json`: the one-file keys as before, plus the model's files and, per
    destination, each file's result and the extra files it keeps."""
    dests = []
    for d in res.dests:
        bad = [_piece_dict(b, f.file) for f in d.files for b in f.bad] if d.files else [_piece_dict(b) for b in d.bad]
        dests.append({"dest_dir": d.dest_dir, "target": d.target, "action": d.action, "outcome": d.outcome,
                      "bytes_written": d.bytes_written, "bytes_to_write": d.bytes_to_write,
                      "seconds": round(d.seconds, 3), "verified": d.verified, "stamped": d.stamped, "bad": bad,
                      "error": d.error, "exit_code": d.exit_code, "extra": list(d.extra),
                      "dropped": list(d.dropped), "files": [_file_dict(f) for f in d.files]})
    return {"schema": 1, "kind": "sync", "source": res.source, "size": res.size, "blake3": res.blake3,
            "digest": res.digest, "layout": res.layout, "format": res.format, "files": list(res.files),
            "piece_size": res.piece_size, "dry_run": res.dry_run, "source_bytes_read": res.source_bytes_read,
            "seconds": round(res.seconds, 3), "exit_code": res.exit_code, "destinations": dests,
            "partial": [choice_to_dict(c) for c in res.partial]}


@dataclass(frozen=True)
class ExistingTarget:
    """What is at the target's name already."""

    regular: bool                   # a regular file, not a symlink
    size: int                       # bytes
    verified: bool                  # a live stamp for the trusted manifest


@dataclass(frozen=True)
class PartialState:
    """What the journal next to an existing NAME.partial says."""

    ours: bool                      # the journal has our header (else the partial is someone else's)
    same_source: bool               # ... naming this source identity and piece size
    durable: frozenset = frozenset()


# ---------------------------------------------------------------------------------------------
# Decisions.

def target_plan(dest_dir: str, target: str, existing: ExistingTarget | None, source_size: int,
                replace_existing: bool) -> DestPlan:
    """What the file at the target's name (if any) allows: NOOP and ADOPT are final; COPY and
    REPLACE still depend on a partial left by an earlier run (`partial_plan`)."""
    if existing is None:
        return DestPlan(dest_dir, target, COPY)
    if not existing.regular:
        raise UsageError(f"{target} exists and is not a regular file; move it away")
    if existing.verified:
        return DestPlan(dest_dir, target, NOOP, reason="identical replica already there (stamp)")
    if replace_existing:
        return DestPlan(dest_dir, target, REPLACE)
    if existing.size == source_size:
        return DestPlan(dest_dir, target, ADOPT, reason="a file of the same size is there: verifying it")
    raise UsageError(f"{target} exists and differs from the source (size {existing.size} vs {source_size}); "
                     "pass --replace to overwrite it")


def partial_plan(plan: DestPlan, partial: PartialState) -> DestPlan:
    """A writing plan given the NAME.partial already there: resume its durable pieces, start over
    when the source or piece size changed, refuse a partial that is not ours."""
    if not partial.ours:
        raise UsageError(f"{plan.partial} exists but has no journal of ours; it was not written by replicas — "
                         "remove it or move it away")
    if not partial.same_source:
        return DestPlan(plan.dest_dir, plan.target, plan.action, reason=RESTART_REASON)
    if partial.durable:
        return DestPlan(plan.dest_dir, plan.target, RESUME if plan.action == COPY else plan.action,
                        frozenset(partial.durable), reason=f"resuming: {plural(len(partial.durable), 'piece')} already durable")
    return plan


def drive_clash(key, source_key, earlier: dict, members: dict, target_real: str, source: str) -> str | None:
    """Who already sits on the destination's physical drive `key`: the source, an earlier
    destination (`earlier`: key -> dest dir) or another replica (`members`: real path -> key);
    None when nobody does. A replica there would add no bandwidth."""
    if key == source_key:
        return f"the source {source}"
    if key in earlier:
        return f"destination {earlier[key]}"
    clash = None
    for path, k in members.items():
        if k == key and path != target_real:
            clash = f"replica {path}"
    return clash


# ---------------------------------------------------------------------------------------------
# Space.

def headroom(size: int) -> int:
    """Free bytes kept beyond the file's own bytes (file-system metadata, other writers)."""
    return int(min(HEADROOM_MAX, max(HEADROOM_MIN, size * HEADROOM_FRACTION)))


def set_space_needed(files: Iterable[tuple[int, int]]) -> int:
    """Free bytes one destination of a model needs: each file still to write, `(size, bytes its
    partial already holds)`, needs the rest, plus headroom for all of them together (for one
    file: the same as `space_needed`)."""
    files = list(files)
    if not files:
        return 0
    return sum(max(0, s - a) for s, a in files) + headroom(sum(s for s, _ in files))


def extra_files(model_files: Iterable[str], found: Iterable[str],
                ours: Iterable[str] = (PARTIAL_SUFFIX, JOURNAL_SUFFIX)) -> tuple[str, ...]:
    """The files found in a destination's model tree that the model does not have, sorted; a
    model file's own NAME.partial and journal (an interrupted copy of ours) are not extra."""
    model = set(model_files)
    mine = model | {f + suffix for f in model for suffix in ours}
    return tuple(sorted(f for f in found if f not in mine))


def space_needed(size: int, allocated: Iterable[int]) -> int:
    """Free bytes one file system needs for its destinations, whose partials already hold
    `allocated` bytes each (a resume needs only the rest), plus headroom for each."""
    return sum(max(0, size - a) + headroom(size) for a in allocated)


def check_space(dest_dirs: Sequence[str], need: int, have: int | None) -> str | None:
    """WriteError when one file system (holding `dest_dirs`) has fewer than `need` bytes free.

    `have` is None when the file system reports no size at all (statvfs f_blocks == 0: ramfs,
    some network and FUSE mounts): the copy goes ahead, and the returned notice says so; a
    write that then fails is still a write failure (exit 4) that loses nothing.
    """
    if have is None:
        return (f"the file system reports no size (ramfs, a network or FUSE mount?): free space unknown, "
                f"copying anyway ({format_bytes(need)} needed with headroom)")
    if need > have:
        raise WriteError(f"not enough free space on {', '.join(dest_dirs)}: needs {format_bytes(need)} (with headroom), "
                         f"has {format_bytes(have)}; free some space or choose another drive")
    return None


def too_many_sources(members: int, engine: str, max_sources: int) -> str | None:
    """The warning when the rig will hold more copies of the model than the engine reads from
    (allowed: a plan chooses which to use); None when it does not."""
    if members <= max_sources:
        return None
    return (f"the rig will hold {members} copies of the model; {engine} reads at most {max_sources} "
            f"(the primary and {max_sources - 1} replicas): allowed, and plans choose which to use")


# ---------------------------------------------------------------------------------------------
# Pieces and blocks.

def piece_bytes(pieces: Iterable[int], size: int, piece_size: int) -> int:
    """Bytes held by the given pieces of a file of `size` bytes."""
    return sum(min(piece_size, size - i * piece_size) for i in pieces)


def bytes_to_write(plan: DestPlan, size: int, piece_size: int) -> int:
    """Bytes a plan will write: all but its durable pieces; nothing unless it writes."""
    return size - piece_bytes(plan.durable, size, piece_size) if plan.writes else 0


def copy_block(piece_size: int) -> int:
    """The I/O size of the copy, bytes: the largest aligned divisor of the piece size up to
    IO_BLOCK, so every block belongs to exactly one piece."""
    if piece_size <= IO_BLOCK:
        return piece_size
    units = piece_size // ALIGNMENT
    for d in range(IO_BLOCK // ALIGNMENT, 0, -1):
        if units % d == 0:
            return d * ALIGNMENT
    return ALIGNMENT


def blocks_per_piece(pieces: Iterable[int], size: int, piece_size: int, block: int) -> dict[int, int]:
    """{piece: how many copy blocks it takes}: a piece is durable once that many have landed."""
    return {i: -(-min(piece_size, size - i * piece_size) // block) for i in pieces}


def pieces_to_read(count: int, manifest_known: bool, needs: Sequence[set]) -> set[int]:
    """Which pieces the one pass over the source reads: every piece when the manifest is still
    to be computed, else those some destination needs."""
    if not manifest_known:
        return set(range(count))
    return set().union(*needs) if needs else set()


def blocks_to_read(pieces: Iterable[int], size: int, piece_size: int, block: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of every copy block of the given pieces, in file order, bytes."""
    for i in sorted(pieces):
        start = i * piece_size
        end = min(start + piece_size, size)
        for off in range(start, end, block):
            yield off, min(block, end - off)


# ---------------------------------------------------------------------------------------------
# What went wrong, in one line.

def identity_change(before: "FileIdentity", now: "FileIdentity") -> str | None:
    """How the source's identity differs from the one it had when the copy started, in words;
    None when size, mtime and inode all still match."""
    if now.inode != before.inode:
        return "it was replaced by another file (inode)"
    if now.size != before.size:
        return f"its size went from {before.size:,} to {now.size:,} bytes"
    if now.mtime_ns != before.mtime_ns:
        return "its modification time changed"
    return None


def piece_differs(piece: PieceRange) -> str:
    """A piece read from the source whose hash is not the trusted manifest's, its identity unchanged."""
    return (f"piece {piece.index} (bytes {piece.offset}+{piece.length}) no longer matches the manifest while its size, "
            "mtime and inode stayed the same; if nothing rewrote it, its drive returns bad data: run `replicas verify --full`")


def source_changed(source: str, how: str) -> MismatchError:
    """The one refusal for a source that changed while it was being copied, whichever check saw it."""
    return MismatchError(f"source {source}: {SOURCE_CHANGED} ({how}); no replica was renamed into place — "
                         "re-run to copy the new contents")


_WRITE_HINTS = {
    errno.ENOSPC: "the drive is full",
    errno.EFBIG: "the file is larger than this process or file system may write (RLIMIT_FSIZE / FAT32?)",
    errno.EROFS: "the file system is read-only",
    errno.EIO: "the drive reported an I/O error",
    errno.EACCES: "permission denied",
}


def write_error_text(e: BaseException) -> str:
    """One line for a destination's write failure, with what the errno usually means."""
    if isinstance(e, OSError):
        hint = _WRITE_HINTS.get(e.errno, "")
        return f"write failed: {e.strerror or e}" + (f" ({hint})" if hint else "")
    return str(e)
