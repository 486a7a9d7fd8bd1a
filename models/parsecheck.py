"""Does a model file parse as its format says? (docs/replicas.md, "A scrub also parses")

Byte identity proves a replica equals the manifest; it cannot tell that the manifest was made
from a broken model (a download cut short and then hashed, a header rewritten by a tool). So a
full verification also reads what a loader reads first, through the same readers the rest of
the project uses (no second parser):

- GGUF: the header and the tensor table (`tensortable.open_gguf`, the gguf library), then every
  tensor's data range: it starts in the data section at a multiple of the file's alignment (as
  llama.cpp's loader requires) and ends inside the file.
- safetensors: the 8-byte length and the JSON header (`formats.read_safetensors_header`, which
  also checks every tensor's `data_offsets` against the file's data bytes).
- anything else (raw bytes, a model directory's config or tokenizer files): nothing to parse.

Only headers are read, so this is cheap beside the full read it follows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.errors import ReplicaTunerError

from .formats import GGUF, SAFETENSORS, read_safetensors_header
from .modelset import DIR

EXTENSIONS = {GGUF: ".gguf", SAFETENSORS: ".safetensors"}


@dataclass(frozen=True)
class ParseCheck:
    format: str          # gguf / safetensors: what the file was parsed as
    ok: bool
    detail: str = ""     # why it does not parse (one line, without the path)
    tensors: int = 0     # tensors in its table when it parses


def file_format(model_format: str, layout: str, rel: str) -> str | None:
    """The format a file of the model must parse as, or None (nothing to parse): every file of a
    GGUF file or split set; in a model directory, the files named as the model's format (.gguf,
    .safetensors), not its config or tokenizer files; nothing for a raw model."""
    ext = EXTENSIONS.get(model_format)
    if ext is None:
        return None
    if layout != DIR or rel.endswith(ext):
        return model_format
    return None


def check_parses(path: str, fmt: str) -> ParseCheck:
    """Parse the file at `path` as `fmt` (GGUF or SAFETENSORS): its header, its tensor table and
    every tensor's data range. Never raises for a file that does not parse: says why."""
    try:
        if fmt == GGUF:
            return _gguf(path)
        if fmt == SAFETENSORS:
            h = read_safetensors_header(path)
            return ParseCheck(fmt, True, tensors=len(h.tensors))
    except ReplicaTunerError as e:
        return ParseCheck(fmt, False, _without_path(str(e), path))
    except OSError as e:
        return ParseCheck(fmt, False, f"read failed: {e.strerror or e}")
    raise ValueError(f"no parser for format {fmt!r}")


def _gguf(path: str) -> ParseCheck:
    from .tensortable import open_gguf      # the gguf library: imported when a GGUF is at hand

    r = open_gguf(path)
    size = os.path.getsize(path)
    start, align = int(r.data_offset), int(r.alignment) or 1
    for t in r.tensors:
        off, n = int(t.data_offset), int(t.n_bytes)
        if off < start or (off - start) % align:
            return ParseCheck(GGUF, False, f"tensor {t.name!r} starts at byte {off}, not at a multiple of the alignment "
                                           f"{align} in the data section (which starts at byte {start})")
        if off + n > size:
            return ParseCheck(GGUF, False, f"tensor {t.name!r} ends at byte {off + n} but the file has {size} (truncated)")
    return ParseCheck(GGUF, True, tensors=len(r.tensors))


def _without_path(message: str, path: str) -> str:
    """The readers' messages start with the path; the check's detail goes under the file's name."""
    return message.removeprefix(f"{path}: ")
