"""Where a model file keeps its routed experts: the GGUF tensor table, nothing else.

Only the header and tensor table are parsed (the gguf library maps the file but touches no tensor
data), so asking costs a few pages, not a read of the model.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ExpertLayout:
    component_bytes: int                  # one expert's slice of one expert tensor
    regions: tuple[tuple[int, int], ...]  # [start, end) of each expert tensor's data, bytes
    experts: int                          # experts per tensor


def is_gguf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def expert_layout(path: str) -> ExpertLayout | None:
    """The expert tensors of a GGUF file; None when the file is not a GGUF or has none.
    Raises ValueError when the file claims to be a GGUF but its table cannot be read."""
    if not is_gguf(path):
        return None
    from gguf import GGUFReader  # imported late: it is slow to import and only GGUFs need it

    try:
        reader = GGUFReader(path, "r")
    except Exception as e:   # the library raises ValueError, struct.error, IndexError...
        raise ValueError(f"{path}: GGUF tensor table unreadable ({type(e).__name__}: {e})") from None
    found, comps, experts = [], Counter(), Counter()
    for t in reader.tensors:
        if not EXPERT_TENSOR.match(t.name):
            continue
        n_exp = int(t.shape[-1])   # GGUF order: ne0, ne1, n_expert
        if n_exp <= 0:
            continue
        comp = int(t.n_bytes) // n_exp
        found.append((int(t.data_offset), int(t.data_offset) + int(t.n_bytes), comp))
        comps[comp] += 1
        experts[n_exp] += 1
    if not found:
        return None
    # one component size for the shape: tensors of another size (if any) are left out
    component = comps.most_common(1)[0][0]
    regions = tuple(sorted((a, b) for a, b, c in found if c == component))
    return ExpertLayout(component_bytes=component, regions=regions,
                        experts=experts.most_common(1)[0][0])
