"""What every target engine is described by (pure data): the noun the registry holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class Piece:
    source: int    # 0 = primary, then replicas in order
    offset: int    # bytes, absolute in the file
    length: int    # bytes (0 when this source reads nothing of this range)
    blocks: int    # whole granules in this piece (the primary's piece also carries the tail)


SplitRule = Callable[[int, int, Sequence[int]], tuple[Piece, ...]]
# (layer, expert, weights) -> the source that serves that whole expert
PlaceRule = Callable[[int, int, Sequence[int]], int]


@dataclass(frozen=True)
class Engine:
    """A target engine's limits and rules, as its own code imposes them."""

    name: str                       # as typed after --engine and stored in plans and profiles
    max_sources: int                # primary + replicas the engine reads from
    weight_min: int                 # each source's weight, inclusive range
    weight_max: int
    granule: int                    # bytes: the unit a split moves between sources
    split: Optional[SplitRule]      # how one read is cut across sources; None: the engine does not split reads
    path_forbidden: str             # characters a source path may not contain (the list separators)
    place: Optional[PlaceRule] = None   # which source serves a whole expert; None: every read is split
