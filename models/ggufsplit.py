"""llama.cpp's split GGUF set, as arithmetic: member names, split metadata, member headers. Pure.

What llama.cpp writes and reads (llama.cpp's tools/gguf-split/gguf-split.cpp `split_strategy`,
ggml/src/gguf.cpp `gguf_write_out`, src/llama-model-loader.cpp `llama_model_loader`; docs/replicas.md,
"One tensor per file"):

- members are named `PREFIX-%05d-of-%05d.gguf` (src/llama.cpp `llama_split_path`, 1-based number);
- every member carries `split.no` (u16, 0-based), `split.count` (u16) and `split.tensors.count`
  (i32, the tensors of the whole set); only the first member carries the model's other metadata
  ("Save all metadata in first split only"), copied in the source's order, the three split keys
  after it in the order gguf-split leaves them: `gguf_set_val_*` removes a key and appends it, and
  `split.count` is set a second time once the count is known, so it comes last;
- a member's header is the GGUF v3 header, its KV pairs, its tensor infos (`ggml_n_dims`
  dimensions: trailing 1s dropped), zero padding to the member's alignment; then each tensor's
  bytes padded with zeros to that alignment, tensor offsets counted the same way.

A reader takes a member's alignment from its own `general.alignment`, 32 without one, and
requires the data section and every tensor offset on it (ggml/src/gguf.cpp
`gguf_init_from_file_impl`: "tensor '%s' has offset %d, expected %zu"). So every member but the
first is 32-aligned, and the first takes the source's `general.alignment` when it declares one.
gguf-split pads every member to 32 (`GGUF_DEFAULT_ALIGNMENT`) even then: its output contexts
(`gguf_init_empty`) keep the default alignment whatever key they copy, so a set it makes from a
file with another alignment has a first member read at the wrong data offset. With the default
alignment, which published GGUFs use, the two are the same bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .formats import KEY_SPLIT_COUNT, KEY_SPLIT_NO, SPLIT_NAME, split_name

KEY_SPLIT_TENSORS_COUNT = "split.tensors.count"     # llama.cpp src/llama-arch.cpp LLM_KV_SPLIT_TENSORS_COUNT
SPLIT_KEYS = (KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT)
KEY_ALIGNMENT = "general.alignment"
DEFAULT_ALIGNMENT = 32            # GGUF_DEFAULT_ALIGNMENT: a member without general.alignment
GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
MAX_MEMBERS = 0xFFFF              # split.count is a u16

# GGUF value types (ggml/include/gguf.h `enum gguf_type`)
T_UINT16, T_UINT32, T_INT32, T_STRING, T_ARRAY = 2, 4, 5, 8, 9
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass(frozen=True)
class KV:
    """One metadata pair exactly as serialized in a GGUF file: key, type and value bytes."""
    key: str
    raw: bytes


@dataclass(frozen=True)
class TensorEntry:
    """A tensor of the source: its info and where its bytes are."""
    name: str
    ne: tuple[int, ...]       # ggml order (ne0, ne1, ...)
    ggml_type: int            # enum ggml_type
    nbytes: int
    file: str                 # the source file holding it (relative to the source model's root)
    offset: int               # absolute offset of its bytes in that file


@dataclass(frozen=True)
class Placed:
    """A tensor in a member: its bytes go at `offset` (absolute in the member), then `pad` zeros."""
    tensor: TensorEntry
    offset: int
    pad: int


@dataclass(frozen=True)
class Member:
    name: str
    header: bytes             # everything before the first tensor's bytes (padding included)
    tensors: tuple[Placed, ...]
    size: int                 # bytes of the whole member file


def pad_to(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def ggml_n_dims(ne: tuple[int, ...]) -> int:
    """ggml's `ggml_n_dims`: the dimensions up to the last one that is not 1 (at least 1)."""
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] != 1:
            return i + 1
    return 1


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_u16(key: str, value: int) -> KV:
    return KV(key, _string(key) + struct.pack("<iH", T_UINT16, value))


def kv_i32(key: str, value: int) -> KV:
    return KV(key, _string(key) + struct.pack("<ii", T_INT32, value))


def kv_scalar(kv: KV) -> int | None:
    """The integer value of a u16/u32/i32 pair (None for any other type)."""
    n = struct.unpack_from("<Q", kv.raw, 0)[0]
    at = 8 + n
    (vtype,) = struct.unpack_from("<i", kv.raw, at)
    fmt = {T_UINT16: "<H", T_UINT32: "<I", T_INT32: "<i"}.get(vtype)
    return None if fmt is None else struct.unpack_from(fmt, kv.raw, at + 4)[0]


def source_alignment(kvs: tuple[KV, ...] | list[KV]) -> int:
    """The alignment the source's metadata declares (`general.alignment`, u32), else 32."""
    for kv in kvs:
        if kv.key == KEY_ALIGNMENT:
            v = kv_scalar(kv)
            if v is not None and v > 0 and v & (v - 1) == 0:
                return v
    return DEFAULT_ALIGNMENT


def tensor_info(name: str, ne: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    """A tensor info record as gguf.cpp `write_tensor_meta` writes it."""
    n = ggml_n_dims(ne)
    return (_string(name) + struct.pack("<I", n) + struct.pack(f"<{n}q", *ne[:n])
            + struct.pack("<iQ", ggml_type, offset))


def member_header(kvs: list[KV], tensors: list[TensorEntry], alignment: int) -> tuple[bytes, list[int]]:
    """(header bytes padded to `alignment`, each tensor's offset within the data section, whose
    tensors are each padded to `alignment`)."""
    rel, at = [], 0
    for t in tensors:
        rel.append(at)
        at += pad_to(t.nbytes, alignment)
    parts = [GGUF_MAGIC, struct.pack("<Iqq", GGUF_VERSION, len(tensors), len(kvs))]
    parts += [kv.raw for kv in kvs]
    parts += [tensor_info(t.name, t.ne, t.ggml_type, r) for t, r in zip(tensors, rel)]
    head = b"".join(parts)
    return head + bytes(pad_to(len(head), alignment) - len(head)), rel


def member_count(n_tensors: int, max_tensors: int) -> int:
    return (n_tensors + max_tensors - 1) // max_tensors


def check_split(n_tensors: int, max_tensors: int) -> str | None:
    """Why a set of `max_tensors` per member cannot be written for `n_tensors` tensors (None: it can)."""
    if isinstance(max_tensors, bool) or not isinstance(max_tensors, int) or max_tensors < 1:
        return f"tensors per file {max_tensors!r}: must be a positive integer"
    if n_tensors < 1:
        return "the model has no tensors"
    count = member_count(n_tensors, max_tensors)
    if count > MAX_MEMBERS:
        return (f"{count} files: llama.cpp's split.count is a u16 (at most {MAX_MEMBERS}); put more tensors in each file")
    return None


def plan_members(prefix: str, kvs: list[KV], tensors: list[TensorEntry], max_tensors: int = 1) -> list[Member]:
    """The members of the split set gguf-split writes with `--split --split-max-tensors max_tensors`
    for a source whose metadata is `kvs` (its own split keys, if any, are dropped) and whose tensors
    are `tensors`, in order. ValueError when it cannot be written (`check_split`)."""
    why = check_split(len(tensors), max_tensors)
    if why:
        raise ValueError(why)
    count = member_count(len(tensors), max_tensors)
    model_kvs = [kv for kv in kvs if kv.key not in SPLIT_KEYS]
    first_alignment = source_alignment(model_kvs)
    out = []
    for i in range(count):
        own = tensors[i * max_tensors:(i + 1) * max_tensors]
        meta = (model_kvs if i == 0 else []) + [kv_u16(KEY_SPLIT_NO, i), kv_i32(KEY_SPLIT_TENSORS_COUNT, len(tensors)),
                                               kv_u16(KEY_SPLIT_COUNT, count)]
        align = first_alignment if i == 0 else DEFAULT_ALIGNMENT
        header, rel = member_header(meta, own, align)
        placed = tuple(Placed(t, len(header) + r, pad_to(t.nbytes, align) - t.nbytes) for t, r in zip(own, rel))
        size = len(header) + sum(pad_to(t.nbytes, align) for t in own)
        out.append(Member(split_name(prefix, i + 1, count), header, placed, size))
    return out


def split_prefix(name: str) -> str:
    """The prefix a set written from the model file or set member `name` is given: the name
    without `.gguf`, and without `-0000k-of-0000n` when it is a split member."""
    m = SPLIT_NAME.match(name)
    if m:
        return m["prefix"]
    return name[:-5] if name.endswith(".gguf") else name
