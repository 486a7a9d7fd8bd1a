"""Content identity of the model file: size, whole-file BLAKE3, piece size, piece hashes (pure).

A piece is `piece_size` bytes except the last, which holds the remainder. A mismatch is reported
per piece with its index, byte offset and length, so repair can re-copy only those bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from core.errors import RigError

from .constants import MANIFEST_SCHEMA


@dataclass(frozen=True)
class PieceRange:
    index: int
    offset: int   # bytes
    length: int   # bytes


@dataclass(frozen=True)
class Manifest:
    size: int                     # bytes
    blake3: str                   # whole-file BLAKE3, hex (what b3sum prints)
    piece_size: int               # bytes
    pieces: tuple[str, ...]       # BLAKE3 of each piece, hex
    name: str = ""                # file name of the model (informational)
    schema: int = MANIFEST_SCHEMA

    def __post_init__(self):
        if len(self.pieces) != piece_count(self.size, self.piece_size):
            raise ValueError(f"manifest has {len(self.pieces)} piece hashes; size {self.size} at piece size {self.piece_size} needs {piece_count(self.size, self.piece_size)}")

    def piece(self, index: int) -> PieceRange:
        return piece_range(index, self.size, self.piece_size)

    @property
    def count(self) -> int:
        return len(self.pieces)

    def digest(self) -> str:
        """A short identity of the whole manifest, stored in stamps (hex SHA-256 of its canonical JSON)."""
        return hashlib.sha256(json.dumps(manifest_to_dict(self), sort_keys=True).encode()).hexdigest()[:32]


def piece_count(size: int, piece_size: int) -> int:
    if piece_size <= 0:
        raise ValueError("piece size must be positive")
    return max(0, -(-size // piece_size))


def piece_range(index: int, size: int, piece_size: int) -> PieceRange:
    n = piece_count(size, piece_size)
    if not 0 <= index < n:
        raise IndexError(f"piece {index} out of range 0..{n - 1}")
    offset = index * piece_size
    return PieceRange(index, offset, min(piece_size, size - offset))


def pieces_in(offset: int, length: int, piece_size: int) -> range:
    """Indices of the pieces that overlap bytes [offset, offset+length)."""
    if length <= 0:
        return range(0)
    return range(offset // piece_size, (offset + length - 1) // piece_size + 1)


def bad_pieces(manifest: Manifest, hashes: dict[int, str], size: int | None = None) -> list[PieceRange]:
    """Pieces whose hash differs from the manifest, plus pieces a short file (size) cannot hold.

    `hashes` maps piece index -> hex hash for the pieces that were read; others are not judged
    unless the file is too short to contain them.
    """
    bad = []
    for i in range(manifest.count):
        r = manifest.piece(i)
        if size is not None and r.offset + r.length > size:
            bad.append(r)
        elif i in hashes and hashes[i] != manifest.pieces[i]:
            bad.append(r)
    return bad


def manifest_to_dict(m: Manifest) -> dict:
    return {
        "schema": m.schema,
        "name": m.name,
        "size": m.size,
        "blake3": m.blake3,
        "piece_size": m.piece_size,
        "pieces": list(m.pieces),
    }


def manifest_from_dict(d: dict, where: str = "manifest.json") -> Manifest:
    if not isinstance(d, dict):
        raise RigError(f"{where}: expected a JSON object; re-create it with `replicas sync` or `replicas hash --json`")
    if d.get("schema") != MANIFEST_SCHEMA:
        raise RigError(f"{where}: schema {d.get('schema')!r} is not {MANIFEST_SCHEMA}; re-create the manifest with `replicas sync`")
    for key, typ in (("size", int), ("blake3", str), ("piece_size", int), ("pieces", list)):
        if not isinstance(d.get(key), typ) or isinstance(d.get(key), bool):
            raise RigError(f"{where}: key '{key}' missing or not a {typ.__name__}; re-create the manifest with `replicas sync`")
    try:
        return Manifest(size=d["size"], blake3=d["blake3"], piece_size=d["piece_size"],
                        pieces=tuple(d["pieces"]), name=str(d.get("name", "")))
    except ValueError as e:
        raise RigError(f"{where}: key 'pieces': {e}") from None
