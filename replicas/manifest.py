"""Content identity of the model: per file size, whole-file BLAKE3, piece size, piece hashes;
one digest over all files (pure).

`Manifest` is one file's identity; `ModelManifest` is the model's: every file (relative path and
its `Manifest`) and the model digest, BLAKE3 over the sorted (path, size, BLAKE3) list, which is
the model's identity. A piece is `piece_size` bytes except the last, which holds the remainder.
A mismatch is reported per file and piece with its index, byte offset and length, so repair can
re-copy only those bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import blake3

from core.errors import RigError
from core.jsonfile import type_word

from .constants import MANIFEST_SCHEMA, MANIFEST_SCHEMAS


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
    name: str = ""                # the file's path relative to the model's root
    schema: int = 1               # the one-file JSON shape (a ModelManifest's entries are written in schema 2)

    def __post_init__(self):
        if len(self.pieces) != piece_count(self.size, self.piece_size):
            raise ValueError(f"manifest has {len(self.pieces)} piece hashes; size {self.size} at piece size "
                             f"{self.piece_size} needs {piece_count(self.size, self.piece_size)}")

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
    """One file's manifest in the one-file shape (schema 1): what a per-file stamp digests."""
    return {
        "schema": m.schema,
        "name": m.name,
        "size": m.size,
        "blake3": m.blake3,
        "piece_size": m.piece_size,
        "pieces": list(m.pieces),
    }


@dataclass(frozen=True)
class ModelManifest:
    """The identity of a model of one or more files (schema 2)."""

    files: tuple[Manifest, ...]   # in the model's order; each `name` is its relative path
    layout: str = "file"          # as models.modelset: file / gguf-split / dir
    format: str = ""              # gguf / safetensors / raw ("" for a schema-1 manifest)
    schema: int = MANIFEST_SCHEMA

    def __post_init__(self):
        if not self.files:
            raise ValueError("a model manifest lists at least one file")
        names = [f.name for f in self.files]
        if len(set(names)) != len(names):
            raise ValueError("a model manifest lists a file twice")

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def piece_size(self) -> int:
        return self.files[0].piece_size

    @property
    def count(self) -> int:
        """Pieces over all files."""
        return sum(f.count for f in self.files)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    def file(self, rel: str) -> Manifest:
        """The manifest of the file at relative path `rel`. A one-file model answers for any name
        (a schema-1 manifest may not know the file's name)."""
        for f in self.files:
            if f.name == rel:
                return f
        if self.layout == "file" and len(self.files) == 1:
            return self.files[0]
        raise KeyError(rel)

    def digest(self) -> str:
        """The model's identity: BLAKE3 (hex) over the sorted `path<TAB>size<TAB>blake3` lines."""
        lines = "".join(f"{f.name}\t{f.size}\t{f.blake3}\n" for f in sorted(self.files, key=lambda f: f.name))
        return blake3.blake3(lines.encode()).hexdigest()


def model_manifest_to_dict(m: ModelManifest) -> dict:
    return {
        "schema": MANIFEST_SCHEMA,
        "layout": m.layout,
        "format": m.format,
        "size": m.size,
        "digest": m.digest(),
        "piece_size": m.piece_size,
        "files": [{"path": f.name, "size": f.size, "blake3": f.blake3, "piece_size": f.piece_size,
                   "pieces": list(f.pieces)} for f in m.files],
    }


def _file_from_dict(d: dict, where: str, name: str) -> Manifest:
    for key, typ in (("size", int), ("blake3", str), ("piece_size", int), ("pieces", list)):
        if not isinstance(d.get(key), typ) or isinstance(d.get(key), bool):
            raise RigError(f"{where}: key '{key}' missing or not {type_word(typ)}; re-create the manifest with `replicas sync`")
    try:
        return Manifest(size=d["size"], blake3=d["blake3"], piece_size=d["piece_size"],
                        pieces=tuple(d["pieces"]), name=name)
    except ValueError as e:
        raise RigError(f"{where}: key 'pieces': {e}") from None


def manifest_from_dict(d: dict, where: str = "manifest.json") -> ModelManifest:
    """A manifest in either shape: schema 2 (a model of files) or schema 1 (one file, a
    one-file model). Every problem is one line naming the file and the key."""
    if not isinstance(d, dict):
        raise RigError(f"{where}: expected a JSON object; re-create it with `replicas sync` or `replicas hash --json`")
    if d.get("schema") not in MANIFEST_SCHEMAS or isinstance(d.get("schema"), bool):
        raise RigError(f"{where}: schema {d.get('schema')!r} is not one of {MANIFEST_SCHEMAS}; re-create the manifest with "
                       "`replicas sync`")
    if d["schema"] == 1:
        return ModelManifest(files=(_file_from_dict(d, where, str(d.get("name", ""))),), layout="file", format="")
    files = d.get("files")
    if not isinstance(files, list) or not files:
        raise RigError(f"{where}: key 'files' missing or empty; re-create the manifest with `replicas sync`")
    entries = []
    for i, f in enumerate(files):
        if not isinstance(f, dict) or not isinstance(f.get("path"), str) or not f["path"]:
            raise RigError(f"{where}: files[{i}] has no 'path'; re-create the manifest with `replicas sync`")
        entries.append(_file_from_dict(f, f"{where}: files[{i}] ({f['path']})", f["path"]))
    try:
        m = ModelManifest(files=tuple(entries), layout=str(d.get("layout", "file")), format=str(d.get("format", "")))
    except ValueError as e:
        raise RigError(f"{where}: {e}; re-create the manifest with `replicas sync`") from None
    if "digest" in d and d["digest"] != m.digest():
        raise RigError(f"{where}: key 'digest' does not match its files (edited by hand?); re-create the manifest with "
                       "`replicas sync`")
    return m
