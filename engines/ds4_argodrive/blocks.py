"""ds4-argodrive's split of one read across its sources, on its 256 KiB block grid, and the
distinct weight vectors that grid leaves (pure; docs/engine-profiles.md, DESIGN of the split in
docs/planner.md): the primary takes the front and the tail, leftovers go to the largest remainder."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from core.errors import UsageError

from ..base import Piece
from .constants import BLOCK_BYTES, PREFILL_CHUNK, WEIGHT_MAX, WEIGHT_MIN

def block_counts(blocks: int, weights: Sequence[int]) -> tuple[int, ...]:
    """Whole blocks per source: floor shares, then leftovers one at a time to the largest
    remainder (ties to the lower index), the winner's remainder zeroed."""
    total = sum(weights)
    counts = [blocks * w // total for w in weights]
    rems = [blocks * w % total for w in weights]
    for _ in range(blocks - sum(counts)):
        best = max(range(len(weights)), key=lambda i: (rems[i], -i))
        counts[best] += 1
        rems[best] = 0
    return tuple(counts)


def split_ds4(offset: int, length: int, weights: Sequence[int], block: int = BLOCK_BYTES) -> tuple[Piece, ...]:
    """The primary reads the front (its blocks plus the tail), then source 1, then source 2;
    contiguous, covering [offset, offset+length) exactly."""
    if length < 0 or offset < 0:
        raise UsageError(f"read ({offset}, {length}): offset and length must be >= 0")
    blocks, tail = divmod(length, block)
    counts = block_counts(blocks, weights)
    pieces, pos = [], offset
    for i, c in enumerate(counts):
        n = c * block + (tail if i == 0 else 0)
        pieces.append(Piece(i, pos, n, c))
        pos += n
    return tuple(pieces)


# ---------------------------------------------------------------------------------------------
# The weights the solver tries: one vector per distinct split of the phase's read (10:5:5 and
# 2:1:1 cut a 6,635,520 B component identically), the smallest integers of each

def block_counts_many(blocks: int, weights: np.ndarray) -> np.ndarray:
    """`block_counts` for every row of `weights` (N x n) at once; identical results."""
    w = np.asarray(weights, dtype=np.int64)
    total = w.sum(axis=1, keepdims=True)
    counts = blocks * w // total
    rems = blocks * w % total
    left = blocks - counts.sum(axis=1)
    # Sum of remainders is left * total with each below total, so the `left` largest are positive
    # and distinct sources: one extra block each, ties to the lower index (stable sort).
    order = np.argsort(-rems, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(w.shape[1]), w.shape).copy(), axis=1)
    return counts + (rank < left[:, None])


@lru_cache(maxsize=4)
def weight_space(n: int) -> np.ndarray:
    """Every weight vector of n sources (1..100 each), smallest first: by sum, max, then lexicographic."""
    axes = np.meshgrid(*([np.arange(WEIGHT_MIN, WEIGHT_MAX + 1, dtype=np.int64)] * n), indexing="ij")
    w = np.stack([a.ravel() for a in axes], axis=1)
    keys = [w[:, i] for i in reversed(range(n))] + [w.max(axis=1), w.sum(axis=1)]
    return w[np.lexsort(keys)]


@lru_cache(maxsize=16)
def split_classes(n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts K x n, smallest weights K x n): every distinct split of a `length`-byte read the
    engine's weights can produce, with the smallest weights that produce it."""
    w = weight_space(n)
    blocks = length // BLOCK_BYTES
    counts = block_counts_many(blocks, w)
    key = np.zeros(len(w), dtype=np.int64)
    for i in range(n):
        key = key * (blocks + 1) + counts[:, i]
    _, first = np.unique(key, return_index=True)
    first.sort()                      # keep the smallest-first order of the representatives
    return counts[first], w[first]


def smallest_equivalent(weights: Sequence[int], length: int) -> tuple[int, ...]:
    """The smallest weights that split a `length`-byte read exactly as `weights` do."""
    w = np.asarray([list(weights)], dtype=np.int64)
    target = block_counts_many(length // BLOCK_BYTES, w)[0]
    counts, smallest = split_classes(w.shape[1], length)
    hit = np.flatnonzero((counts == target).all(axis=1))
    return tuple(int(x) for x in smallest[hit[0]])


def weight_grid(n: int, geometry, phase: str = "decode") -> np.ndarray:
    """The distinct splits of the phase's typical read on this model (decode: a component;
    prefill: a staging chunk), as their smallest weights."""
    length = geometry.component_bytes if phase == "decode" else max(PREFILL_CHUNK, geometry.component_bytes)
    return split_classes(n, length)[1]

