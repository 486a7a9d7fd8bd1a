"""Model file formats, told apart by their first bytes (docs/replicas.md).

- GGUF: the magic b"GGUF" and a version; a split set names its files `PREFIX-00001-of-00004.gguf`
  (llama.cpp's `llama_split_path`: "%s-%05d-of-%05d.gguf" with the 0-based `split.no` + 1) and
  records `split.no` and `split.count` in each file's metadata.
- safetensors: an 8-byte little-endian header length N, then N bytes of JSON
  `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}` whose offsets are
  relative to the end of the header, then the data.

Only headers are read here (a few bytes, or the GGUF metadata through the gguf library, which
maps the file without touching tensor data), so this is cheap on a 500 GB file.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass

from core.errors import RigError

GGUF = "gguf"
SAFETENSORS = "safetensors"
RAW = "raw"
FORMATS = (GGUF, SAFETENSORS, RAW)

GGUF_MAGIC = b"GGUF"
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
KEY_SPLIT_NO = "split.no"            # gguf.Keys.Split.LLM_KV_SPLIT_NO, 0-based
KEY_SPLIT_COUNT = "split.count"      # gguf.Keys.Split.LLM_KV_SPLIT_COUNT
SAFETENSORS_HEADER_MAX = 100_000_000  # bytes; the safetensors crate refuses larger headers too


def split_name(prefix: str, no: int, count: int) -> str:
    """The file name of member `no` (1-based, as in the name) of a split GGUF set."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def sniff(path: str) -> str | None:
    """GGUF or SAFETENSORS when the file's first bytes say so, else None. Reads at most 9 bytes."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:4] == GGUF_MAGIC:
        return GGUF
    if len(head) == 9 and head[8:9] == b"{":
        (n,) = struct.unpack("<Q", head[:8])
        if 2 <= n <= SAFETENSORS_HEADER_MAX and n + 8 <= os.path.getsize(path):
            return SAFETENSORS
    return None


@dataclass(frozen=True)
class SafetensorsHeader:
    length: int          # bytes of the JSON header (data starts at 8 + length)
    tensors: dict        # name -> {"dtype", "shape", "data_offsets": [begin, end]} (relative to the data)
    metadata: dict       # "__metadata__", or {}

    @property
    def data_start(self) -> int:
        return 8 + self.length


def read_safetensors_header(path: str) -> SafetensorsHeader:
    """The header of a safetensors file; RigError (exit 2) naming the file when it is not one."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise RigError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", raw)
        if not 2 <= n <= SAFETENSORS_HEADER_MAX or n + 8 > size:
            raise RigError(f"{path}: not a safetensors file (header length {n} does not fit a {size}-byte file)")
        text = f.read(n)
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RigError(f"{path}: safetensors header is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise RigError(f"{path}: safetensors header is not a JSON object")
    meta = doc.pop("__metadata__", {}) or {}
    data_len = size - 8 - n
    for name, t in doc.items():
        offs = t.get("data_offsets") if isinstance(t, dict) else None
        if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)
                or not 0 <= offs[0] <= offs[1] <= data_len):
            raise RigError(f"{path}: tensor {name!r} has data_offsets {offs!r} outside the file's {data_len} data bytes")
    return SafetensorsHeader(length=n, tensors=doc, metadata=meta if isinstance(meta, dict) else {})


def gguf_split_fields(path: str) -> tuple[int, int] | None:
    """(split.no, split.count) from a GGUF file's metadata; None when it has neither key."""
    from gguf import GGUFReader  # heavy import, only when a GGUF is at hand

    try:
        reader = GGUFReader(path, "r")
    except Exception as e:   # the library raises ValueError, struct.error, IndexError… on a damaged header
        raise RigError(f"{path}: not a readable GGUF file ({e})") from None

    def value(key):
        field = reader.fields.get(key)
        return None if field is None else int(field.parts[field.data[0]][0])

    no, count = value(KEY_SPLIT_NO), value(KEY_SPLIT_COUNT)
    if no is None and count is None:
        return None
    return (no if no is not None else 0, count if count is not None else 1)
