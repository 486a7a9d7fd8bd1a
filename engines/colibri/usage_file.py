"""colibri's usage history: `<model dir>/.coli_usage` (USAGE_FILE), which every colibri engine
rewrites after a turn (c/route_trace.h `rt_save`, read by `rt_read_ex`), read into the format-neutral
`models.usage.Usage` (pure).

Text, one `<layer> <expert> <count>` per line, non-zero counts only, after two header records
`-1 <n_layers> <n_experts>` and `-2 <format_version> <engine_id>` (a history written before the
header has none: legacy text); or inkling's binary `IKU1` (uint32 magic 0x31554B49, n_layers,
n_experts, then a dense uint32[n_layers][n_experts]). colibri counts *routings* (router
selections, `rt_count`), not misses, accumulated over every run (`models.usage.ROUTINGS`).
"""

from __future__ import annotations

import struct

import numpy as np

from models.usage import ROUTINGS, Usage, usage_of

from .constants import USAGE_FILE

IKU1_MAGIC = 0x31554B49             # c/route_trace.h RT_IKU1_MAGIC ("IKU1", inkling)


def read_usage(data: bytes, where: str, layers: int | None = None, experts: int | None = None) -> Usage:
    """colibri's usage history, USAGE_FILE (see the module doc). `layers`/`experts`: the model's, used for a
    legacy file without the dimensions record and checked against one that has it (colibri refuses
    a history of other dimensions, `rt_read_ex`; so does this). ValueError on anything else."""
    if len(data) >= 12 and struct.unpack_from("<I", data)[0] == IKU1_MAGIC:
        nl, ne = struct.unpack_from("<II", data, 4)
        body = np.frombuffer(data, dtype="<u4", offset=12)
        if body.size < nl * ne:
            raise ValueError(f"{where}: IKU1 history of {nl}x{ne} experts is cut short")
        a = body[: nl * ne].astype(np.int64).reshape(nl, ne)
        return _checked(a, where, layers, experts)
    dims = None
    cells: list[tuple[int, int, int]] = []
    for n, line in enumerate(data.decode("ascii", errors="replace").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            lay, e, c = (int(x) for x in parts[:3])
        except ValueError:
            break                    # colibri's fscanf loop stops at the first record it cannot parse
        if len(parts) < 3:
            break
        if lay == -1:
            dims = (e, c)
        elif lay >= 0:
            cells.append((lay, e, c))
    if dims is None:
        if layers is None or experts is None:
            raise ValueError(f"{where}: a legacy history (no '-1 layers experts' record) needs the model's geometry")
        dims = (layers, experts)
    a = np.zeros(dims, dtype=np.int64)
    for lay, e, c in cells:
        if 0 <= lay < dims[0] and 0 <= e < dims[1]:
            a[lay, e] += c
    return _checked(a, where, layers, experts)


def _checked(a: np.ndarray, where: str, layers: int | None, experts: int | None) -> Usage:
    # colibri keeps one row more than the MoE layers for GLM's MTP layer (route_trace.h rt_init:
    # rows 0..n_layers): an all-zero trailing row is dropped; the experts must agree.
    if layers is not None and a.shape[0] == layers + 1 and not a[layers].any():
        a = a[:layers]
    if (layers is not None and a.shape[0] != layers) or (experts is not None and a.shape[1] != experts):
        raise ValueError(f"{where}: history of {a.shape[0]} layers x {a.shape[1]} experts, the model has "
                         f"{layers} x {experts}")
    return usage_of(a, ROUTINGS, USAGE_FILE)
