"""The engine's read shapes, per drive and preset: request size and where requests fall (pure).

- seq:     1 MiB requests, sequential through the file.
- prefill: the drive's piece of each 32 MiB staging chunk, split by the prefill weights with the
           engine's rule (`engines.split.split_read`); consecutive chunks.
- decode:  the drive's piece of one expert component, split by the decode weights, at a random
           component of the expert tensors (of the whole file when it is not a GGUF).
- rand4k:  4 KiB at random aligned offsets of the whole file (per-request latency, IOPS ceiling).

A shape is a table of "slots" (possible request offsets) over one or more regions of the file;
sequential shapes walk the slots in order, random shapes draw them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from engines.ds4_argodrive.constants import COMPONENT_BYTES, PREFILL_CHUNK
from engines.split import split_read
from core.constants import ALIGNMENT

from .constants import RAND_PIECE, SEQ_PIECE


def align_up(n: int, a: int = ALIGNMENT) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class Shape:
    preset: str
    piece_bytes: int                      # bytes per request (a multiple of ALIGNMENT)
    pattern: str                          # 'seq' (walk slots in order) or 'random'
    step: int                             # bytes between slots: piece, chunk or component
    first: int                            # offset of the piece inside its chunk/component
    regions: tuple[tuple[int, int], ...]  # [start, end) byte ranges that hold the slots

    def _counts(self) -> list[int]:
        out = []
        for start, end in self.regions:
            room = end - start - self.first - self.piece_bytes
            out.append(room // self.step + 1 if room >= 0 else 0)
        return out

    @property
    def slots(self) -> int:
        """How many distinct requests the file holds for this shape."""
        return sum(self._counts())


class SlotTable:
    """Slot number -> byte offset (aligned down to ALIGNMENT), slots taken modulo their count."""

    def __init__(self, shape: Shape):
        self.shape = shape
        counts = shape._counts()
        self.cum = [0]
        for c in counts:
            self.cum.append(self.cum[-1] + c)
        self.n = self.cum[-1]

    def offset(self, slot: int) -> int:
        s = self.shape
        slot %= self.n
        r = bisect.bisect_right(self.cum, slot) - 1
        off = s.regions[r][0] + (slot - self.cum[r]) * s.step + s.first
        return off - off % ALIGNMENT


def piece_of(length: int, weights: Sequence[int], index: int) -> tuple[int, int]:
    """(offset inside the range, bytes) of source `index`'s piece of a `length`-byte read."""
    p = split_read(0, length, weights)[index]
    return p.offset, p.length


def seq_shape(size: int) -> Shape:
    return Shape("seq", SEQ_PIECE, "seq", SEQ_PIECE, 0, ((0, size),))


def rand4k_shape(size: int) -> Shape:
    return Shape("rand4k", RAND_PIECE, "random", RAND_PIECE, 0, ((0, size),))


def prefill_shape(size: int, weights: Sequence[int], index: int, chunk: int = PREFILL_CHUNK) -> Shape | None:
    """None when the weights give this drive no bytes of a chunk."""
    first, length = piece_of(chunk, weights, index)
    if length == 0:
        return None
    return Shape("prefill", align_up(length), "seq", chunk, first, ((0, size),))


def decode_shape(size: int, weights: Sequence[int], index: int, component: int = COMPONENT_BYTES,
                 regions: Sequence[tuple[int, int]] = ()) -> Shape | None:
    """Components of the expert tensors (`regions`), else of the whole file; None when the
    weights give this drive no bytes of a component."""
    first, length = piece_of(component, weights, index)
    if length == 0:
        return None
    return Shape("decode", align_up(length), "random", component, first, tuple(regions) or ((0, size),))


def min_slots(lanes: Sequence[int]) -> int:
    """A file must hold one request per lane plus one, so concurrent lanes never read the same bytes."""
    return max(lanes) + 1
