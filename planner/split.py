"""The split of one read across sources, exactly as the engine computes it (DESIGN §5).

This module is the single source of truth for the split: the planner's model and solver and
the engine_bridge split reader all call `split_read`. Other engines' rules plug in beside
`split_ds4` in `SPLIT_RULES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from replicas.errors import UsageError

from .constants import BLOCK, MAX_SOURCES, WEIGHT_MAX, WEIGHT_MIN


@dataclass(frozen=True)
class Piece:
    source: int    # 0 = primary, then replicas in order
    offset: int    # bytes, absolute in the file
    length: int    # bytes (0 when this source reads nothing of this range)
    blocks: int    # whole BLOCKs in this piece (the primary's piece also carries the tail)


def check_weights(weights: Sequence[int], engine: str = "ds4-argodrive") -> tuple[int, ...]:
    """Integers 1..100, one per source, at most the engine's source count; else UsageError."""
    w = tuple(weights)
    limit = MAX_SOURCES.get(engine, 3)
    if not w:
        raise UsageError("weights: give one weight per source, e.g. 10:5:5")
    if len(w) > limit:
        raise UsageError(f"weights {':'.join(map(str, w))}: {engine} reads from at most {limit} sources, got {len(w)}")
    for i, x in enumerate(w):
        if isinstance(x, bool) or not isinstance(x, int) or not WEIGHT_MIN <= x <= WEIGHT_MAX:
            raise UsageError(f"weights {':'.join(map(str, w))}: weight of source {i} is {x!r}; each must be an integer {WEIGHT_MIN}..{WEIGHT_MAX}")
    return w


def parse_weights(text: str, engine: str = "ds4-argodrive") -> tuple[int, ...]:
    """'10:5:5' or '10,5,5' -> (10, 5, 5), checked."""
    parts = [p for p in str(text).replace(",", ":").split(":")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"weights {text!r}: use integers separated by ':' or ',', e.g. 10:5:5") from None
    return check_weights(values, engine)


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


def split_ds4(offset: int, length: int, weights: Sequence[int], block: int = BLOCK) -> tuple[Piece, ...]:
    """ds4-argodrive: the primary reads the front (its blocks plus the tail), then source 1,
    then source 2; contiguous, covering [offset, offset+length) exactly."""
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


SplitRule = Callable[[int, int, Sequence[int]], tuple[Piece, ...]]
SPLIT_RULES: dict[str, SplitRule] = {"ds4-argodrive": split_ds4}


def split_read(offset: int, length: int, weights: Sequence[int], engine: str = "ds4-argodrive") -> tuple[Piece, ...]:
    """Split one read with the named engine's rule (weights are checked)."""
    try:
        rule = SPLIT_RULES[engine]
    except KeyError:
        raise UsageError(f"engine {engine!r} has no split rule; known: {', '.join(SPLIT_RULES)}") from None
    return rule(offset, length, check_weights(weights, engine))
