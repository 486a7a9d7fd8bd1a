"""The engine's read shapes, per drive and preset: request size and where requests fall (pure).

The prefill and decode presets are the reads of the engine that cuts every read across drives by
weight, the registry's default engine (SHAPES_ENGINE): its read sizes are asked of it
(`Engine.read_shapes`, `engine_shapes`) and its pieces cut by its rule (`engines.split.split_read`).

- seq:     1 MiB requests, sequential through the file.
- prefill: the drive's piece of each staging chunk (ds4-argodrive's: 32 MiB), split by the prefill
           weights; consecutive chunks.
- decode:  the drive's piece of one expert component (the model's, from its header), split by the
           decode weights, at a random component of the expert tensors (of the whole file when it
           is not a GGUF).
- rand4k:  4 KiB at random aligned offsets of the whole file (per-request latency, IOPS ceiling).

A shape is a table of "slots" (possible request offsets) over one or more regions of the file;
sequential shapes walk the slots in order, random shapes draw them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from engines.pattern import ReadShapes
from engines.registry import DEFAULT_ENGINE, get_engine
from engines.split import split_read
from core.constants import ALIGNMENT

from .constants import RAND_PIECE, SEQ_PIECE


SHAPES_ENGINE = DEFAULT_ENGINE          # whose reads the prefill and decode presets are


def engine_shapes(component_bytes: int | None = None) -> ReadShapes:
    """The prefill and decode reads of SHAPES_ENGINE for a model whose expert component is
    `component_bytes` (None: no header at hand, the engine's own model)."""
    return get_engine(SHAPES_ENGINE).read_shapes(component_bytes)


def split_limit() -> tuple[str, int]:
    """(engine, sources): the prefill and decode presets cut each read over at most this many
    drives, as SHAPES_ENGINE does (its `max_sources`)."""
    return SHAPES_ENGINE, get_engine(SHAPES_ENGINE).max_sources


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
    p = split_read(0, length, weights, SHAPES_ENGINE)[index]
    return p.offset, p.length


def seq_shape(size: int) -> Shape:
    return Shape("seq", SEQ_PIECE, "seq", SEQ_PIECE, 0, ((0, size),))


def rand4k_shape(size: int) -> Shape:
    return Shape("rand4k", RAND_PIECE, "random", RAND_PIECE, 0, ((0, size),))


def prefill_shape(size: int, weights: Sequence[int], index: int, chunk: int | None = None) -> Shape | None:
    """None when the weights give this drive no bytes of a chunk (default: the engine's chunk)."""
    chunk = engine_shapes().prefill_bytes if chunk is None else chunk
    first, length = piece_of(chunk, weights, index)
    if length == 0:
        return None
    return Shape("prefill", align_up(length), "seq", chunk, first, ((0, size),))


def decode_shape(size: int, weights: Sequence[int], index: int, component: int | None = None,
                 regions: Sequence[tuple[int, int]] = ()) -> Shape | None:
    """Components of the expert tensors (`regions`), else of the whole file; None when the
    weights give this drive no bytes of a component (default: the engine's own model's)."""
    component = engine_shapes().decode_bytes if component is None else component
    first, length = piece_of(component, weights, index)
    if length == 0:
        return None
    return Shape("decode", align_up(length), "random", component, first, tuple(regions) or ((0, size),))


def min_slots(lanes: Sequence[int]) -> int:
    """A file must hold one request per lane plus one, so concurrent lanes never read the same bytes."""
    return max(lanes) + 1
