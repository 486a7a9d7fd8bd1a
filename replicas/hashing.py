"""Hashing streams: whole-file BLAKE3 plus one BLAKE3 per piece, in one pass over the bytes."""

from __future__ import annotations

import threading

import blake3

from core.errors import Interrupted, MissingError, UsageError
from core.events import Progress, Reporter, emit

from core.coldio import ColdReader, open_cold, read_sequential
from core.constants import ALIGNMENT

from .constants import PIECE_SIZE
from .manifest import Manifest, piece_count


def check_piece_size(piece_size: int) -> int:
    if piece_size <= 0 or piece_size % ALIGNMENT:
        raise UsageError(f"piece size {piece_size} must be a positive multiple of {ALIGNMENT} bytes (e.g. 64M)")
    return piece_size


class PieceHasher:
    """Feed bytes in order from `start`; collects the whole-file hash and each piece's hash.

    Pieces are cut at multiples of piece_size whatever the block boundaries of the reads.
    """

    def __init__(self, piece_size: int, start: int = 0, whole: bool = True):
        self.piece_size = piece_size
        self.pos = start
        self.whole = blake3.blake3() if whole else None
        self.piece = blake3.blake3()
        self.pieces: dict[int, str] = {}

    def update(self, data) -> list[int]:
        """Returns the indices of pieces completed by this data."""
        view = memoryview(data)
        if self.whole is not None:
            self.whole.update(view)
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
                self.piece = blake3.blake3()
        return done

    def finish(self) -> list[int]:
        """Close a final partial piece; returns its index if there was one."""
        if self.pos % self.piece_size:
            i = self.pos // self.piece_size
            self.pieces[i] = self.piece.hexdigest()
            self.piece = blake3.blake3()
            return [i]
        return []


def hash_file(path: str, piece_size: int = PIECE_SIZE, report: Reporter = None,
              cancel: threading.Event | None = None, reader: ColdReader | None = None) -> Manifest:
    """Read a file once, cold, and return its manifest."""
    check_piece_size(piece_size)
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
        h = PieceHasher(piece_size)
        for off, view in read_sequential(reader, 0, size, cancel=cancel):
            h.update(view)
            emit(report, Progress(path, "hash", off + len(view), size))
        if cancel is not None and cancel.is_set():
            raise Interrupted(f"hashing {path} cancelled")
        if h.pos != size:
            raise MissingError(f"{path}: read stopped at byte {h.pos} of {size} (file shrank or drive failed)")
        h.finish()
        n = piece_count(size, piece_size)
        return Manifest(size=size, blake3=h.whole.hexdigest(), piece_size=piece_size,
                        pieces=tuple(h.pieces[i] for i in range(n)), name=path.rsplit("/", 1)[-1])
    except OSError as e:
        raise MissingError(f"{path}: read failed: {e.strerror or e}") from e
    finally:
        if own:
            reader.close()
