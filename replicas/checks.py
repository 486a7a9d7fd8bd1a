"""What a verification finds (pure): per file of a member (`FileCheck`), per member
(`MemberCheck`, the roll-up of its files: identical only when every file is) and per run
(`VerifyReport`, its exit code). `replicas.verify` makes them."""

from __future__ import annotations

from dataclasses import dataclass


from .manifest import PieceRange
from .verdict import exit_code_of, rollup_state

__all__ = ["IDENTICAL", "MISMATCH", "BROKEN", "MISSING", "UNREADABLE", "FileCheck", "FilePiece", "MemberCheck", "VerifyReport",
           "join_unique"]

IDENTICAL, MISMATCH, MISSING, UNREADABLE = "identical", "mismatch", "missing", "unreadable"
# Byte-identical to the manifest, but the file does not parse as its model format says: the
# manifest was made from a broken model (docs/replicas.md, "A scrub also parses"). A failed check
# (exit 1) like a mismatch; repair cannot mend it (every copy has the same bytes).
BROKEN = "broken"


@dataclass(frozen=True)
class FilePiece:
    """A piece of one of the model's files: which file, and the piece's index and byte range."""

    file: str      # relative path in the model
    index: int
    offset: int    # bytes from the start of that file
    length: int    # bytes


@dataclass(frozen=True)
class FileCheck:
    """What verify found about one file of one member."""

    file: str                    # relative path in the model (ModelManifest names)
    path: str                    # absolute path on the member's drive
    state: str                   # identical / mismatch / broken / missing / unreadable
    how: str                     # stamp / full / sample
    bad: tuple[PieceRange, ...] = ()
    size: int | None = None      # bytes found on disk
    bytes_read: int = 0
    seconds: float = 0.0
    detail: str = ""
    stamped: str | None = None   # 'xattr' / 'sidecar' when a full verification was recorded
    pieces_checked: int = 0
    parsed: str = ""             # the format the file was parsed as after a full read ('' when not parsed)
    parses: bool | None = None   # whether it parses (None: not parsed: a raw file, a stamp, a sample, a mismatch)


@dataclass(frozen=True)
class MemberCheck:
    """What verify found about one member: every file of the model there, and their roll-up
    (identical only when every file is)."""

    path: str
    name: str
    role: str
    files: tuple[FileCheck, ...]

    @property
    def state(self) -> str:
        return rollup_state([f.state for f in self.files])

    @property
    def how(self) -> str:
        return join_unique(f.how for f in self.files)

    @property
    def bad(self) -> tuple[FilePiece, ...]:
        """Every bad piece of every file, in file order."""
        return tuple(FilePiece(f.file, b.index, b.offset, b.length) for f in self.files for b in f.bad)

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files if f.size is not None]
        return sum(sizes) if sizes else None

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self.files)

    @property
    def seconds(self) -> float:
        return sum(f.seconds for f in self.files)      # a member's files are read one after another

    @property
    def pieces_checked(self) -> int:
        return sum(f.pieces_checked for f in self.files)

    @property
    def stamped(self) -> str | None:
        return join_unique(f.stamped for f in self.files if f.stamped) or None

    @property
    def detail(self) -> str:
        if len(self.files) == 1:
            return self.files[0].detail
        return "; ".join(f"{f.file}: {f.detail}" for f in self.files if f.detail)


def join_unique(words) -> str:
    """'stamp', or 'stamp+full' when the files of a member were judged in different ways."""
    seen: list[str] = []
    for w in words:
        if w not in seen:
            seen.append(w)
    return "+".join(seen)


@dataclass(frozen=True)
class VerifyReport:
    members: tuple[MemberCheck, ...]
    seconds: float
    sample_seed: int | None = None

    @property
    def exit_code(self) -> int:
        """1 if any member mismatches or has a file that does not parse, else 3 if any file is
        missing or unreadable, else 0."""
        return exit_code_of(m.state for m in self.members)
