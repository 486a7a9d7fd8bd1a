"""Which drive serves each of a model's files for llama.cpp (pure; docs/engine-profiles.md, "llama.cpp").

llama.cpp opens each file of a split set through one mmap and reads a tensor from the one file
that holds it, so the finest a drive can be chosen for is a file. The choice is ours, written as
a folder of links (`link_names`): with full copies on several drives, each file's link points at
the copy on the drive that serves it. The weights say how the files' bytes are shared out: the
files are taken in order and each goes to the source whose share, with it, stays smallest for its
weight ((placed + size) / weight, the lowest source on a tie), among the sources holding it.
"""

from __future__ import annotations

from itertools import product
from typing import Sequence

import numpy as np

from models.formats import SPLIT_NAME

from .constants import SPLIT_FORMAT, WEIGHT_MAX, WEIGHT_MIN


def place_files(files: Sequence[tuple[str, int]], weights: Sequence[int],
                holders: Sequence[Sequence[int]] | None = None) -> tuple[int, ...]:
    """The source serving each file (in `files` order: (name, bytes)). `holders`: per file, the
    sources that hold it (None: every source); a file no source of the weights holds stays on
    the primary (0)."""
    placed = [0] * len(weights)
    out = []
    for i, (_, size) in enumerate(files):
        cands = [s for s in (holders[i] if holders is not None else range(len(weights)))
                 if 0 <= s < len(weights) and weights[s] > 0] or [0]
        best = min(cands, key=lambda s: ((placed[s] + size) / weights[s], s))
        placed[best] += size
        out.append(best)
    return tuple(out)


def geometry_files(geometry) -> tuple[tuple[str, int], ...]:
    """A model's files and their bytes: its header's list when known, else the files its expert
    tensors are in, each counted by those tensors' bytes."""
    sizes = tuple(getattr(geometry, "file_sizes", ()) or ())
    if sizes:
        return sizes
    out: dict[str, int] = {}
    for t in geometry.tensors:
        out[t.file] = out.get(t.file, 0) + t.nbytes
    return tuple(out.items())


def weight_grid(n: int, geometry, phase: str = "decode") -> np.ndarray:
    """Every weight vector of WEIGHT_MIN..WEIGHT_MAX per source that places the model's files
    differently, each the smallest of those placing them the same (by sum, then in order)."""
    files = geometry_files(geometry)
    vectors = sorted(product(range(WEIGHT_MIN, WEIGHT_MAX + 1), repeat=n), key=lambda w: (sum(w), w))
    seen: set[tuple[int, ...]] = set()
    out = []
    for w in vectors:
        p = place_files(files, w)
        if p not in seen:
            seen.add(p)
            out.append(w)
    return np.array(out, dtype=np.int64).reshape(-1, n)


def split_parts(name: str) -> tuple[str, int, int] | None:
    """(prefix, number (1-based), count) of a split file's name, as llama.cpp's `llama_split_prefix`
    strips it; None for a name that is not one."""
    m = SPLIT_NAME.match(name)
    if not m:
        return None
    return m.group("prefix"), int(m.group("no")), int(m.group("count"))


def link_names(files: Sequence[str]) -> tuple[str, ...]:
    """The names llama.cpp derives for a model's files from its first (`llama_split_path`): a split
    set keeps its own names; one file is its own name."""
    first = split_parts(files[0]) if files else None
    if first is None:
        return tuple(files)
    prefix, _, count = first
    return tuple(SPLIT_FORMAT % (prefix, i + 1, count) for i in range(count))
