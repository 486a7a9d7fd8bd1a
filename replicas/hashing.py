"""Hashing streams: whole-file BLAKE3 and/or one BLAKE3 per piece, in one pass over the bytes.

Every hasher spreads its work over all cores (`blake3`'s multithreaded update, the same tree
parallelism b3sum uses), and each caller asks only for the digests it needs: `replicas hash`
prints the whole-file BLAKE3 only, a verification compares piece hashes only (they cover every
byte, so the whole-file digest adds nothing there), and only a new manifest needs both
(docs/replicas.md, "Hashing at the drives' pace").
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import blake3

from core.errors import Interrupted, MissingError, UsageError
from core.events import Progress, Reporter, emit

from core.coldio import ColdReader, open_cold, read_sequential
from core.constants import ALIGNMENT

from .constants import PIECE_SIZE

if TYPE_CHECKING:
    from .manifest import Manifest


def check_piece_size(piece_size: int) -> int:
    if piece_size <= 0 or piece_size % ALIGNMENT:
        raise UsageError(f"piece size {piece_size} must be a positive multiple of {ALIGNMENT} bytes (e.g. 64M)")
    return piece_size


def new_hasher():
    """A BLAKE3 hasher that hashes each update on every core (the GIL is released meanwhile)."""
    return blake3.blake3(max_threads=blake3.blake3.AUTO)


class PieceHasher:
    """Feed bytes in order from `start`; collects the whole-file hash (`whole`) and/or each
    piece's hash (`pieces`).

    Pieces are cut at multiples of piece_size whatever the block boundaries of the reads.
    """

    def __init__(self, piece_size: int, start: int = 0, whole: bool = True, pieces: bool = True):
        self.piece_size = piece_size
        self.pos = start
        self.whole = new_hasher() if whole else None
        self.piece = new_hasher() if pieces else None
        self.pieces: dict[int, str] = {}

    def restart(self, pos: int) -> None:
        """Continue at `pos` (a piece boundary), after a gap nobody needed hashed."""
        self.pos = pos
        if self.piece is not None:
            self.piece = new_hasher()

    def update(self, data) -> list[int]:
        """Returns the indices of pieces completed by this data."""
        view = memoryview(data)
        if self.whole is not None:
            self.whole.update(view)
        if self.piece is None:
            self.pos += len(view)
            return []
        done = []
        while len(view):
            room = self.piece_size - self.pos % self.piece_size
            chunk = view[:room]
            self.piece.update(chunk)
            self.pos += len(chunk)
            view = view[len(chunk):]
            if self.pos % self.piece_size == 0:
                done.append(self.pos // self.piece_size - 1)
                self.pieces[done[-1]] = self.piece.hexdigest()
                self.piece = new_hasher()
        return done

    def finish(self) -> list[int]:
        """Close a final partial piece; returns its index if there was one."""
        if self.piece is not None and self.pos % self.piece_size:
            i = self.pos // self.piece_size
            self.pieces[i] = self.piece.hexdigest()
            self.piece = new_hasher()
            return [i]
        return []


def hash_file(path: str, piece_size: int = PIECE_SIZE, report: Reporter = None,
              cancel: threading.Event | None = None, reader: ColdReader | None = None) -> Manifest:
    """Read a file once, cold, and return its manifest (whole-file and piece hashes)."""
    from .manifest import Manifest, piece_count    # here: `replicas hash` of plain files never needs it

    check_piece_size(piece_size)
    size, h = _hash_stream(path, PieceHasher(piece_size), report, cancel, reader)
    return Manifest(size=size, blake3=h.whole.hexdigest(), piece_size=piece_size,
                    pieces=tuple(h.pieces[i] for i in range(piece_count(size, piece_size))),
                    name=path.rsplit("/", 1)[-1])


def hash_whole(path: str, report: Reporter = None, cancel: threading.Event | None = None,
               reader: ColdReader | None = None) -> str:
    """Read a file once, cold, and return its BLAKE3 (hex, what b3sum prints): each byte hashed
    once, on every core."""
    _, h = _hash_stream(path, PieceHasher(PIECE_SIZE, pieces=False), report, cancel, reader)
    return h.whole.hexdigest()


def _hash_stream(path: str, h: PieceHasher, report: Reporter, cancel: threading.Event | None,
                 reader: ColdReader | None) -> tuple[int, PieceHasher]:
    """Feed every byte of the file at `path` to `h`; (size, h). One error line for a file that
    is missing, a directory, unreadable or shrinks while it is read."""
    own = reader is None
    try:
        reader = reader or open_cold(path)
    except FileNotFoundError:
        raise MissingError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a file") from None
    except PermissionError:
        raise MissingError(f"{path}: permission denied") from None
    try:
        size = reader.size
        for off, view in read_sequential(reader, 0, size, cancel=cancel):
            h.update(view)
            emit(report, Progress(path, "hash", off + len(view), size))
        if cancel is not None and cancel.is_set():
            raise Interrupted(f"hashing {path} cancelled")
        if h.pos != size:
            raise MissingError(f"{path}: read stopped at byte {h.pos} of {size} (file shrank or drive failed)")
        h.finish()
        return size, h
    except OSError as e:
        raise MissingError(f"{path}: read failed: {e.strerror or e}") from e
    finally:
        if own:
            reader.close()
