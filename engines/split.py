"""Weights and the split of one read across sources, by the named engine's own rule.

The single entry point for the split: the planner's model and solver, iobench's shapes and the
engine_bridge split reader all call `split_read`, which dispatches to the engine module's rule
(`ds4_argodrive.split_ds4`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

from core.errors import UsageError

from .base import Piece
from .registry import DEFAULT_ENGINE, ENGINES, get_engine


def check_weights(weights: Sequence[int], engine: str = DEFAULT_ENGINE) -> tuple[int, ...]:
    """Integers 1..100, one per source, at most the engine's source count; else UsageError."""
    w = tuple(weights)
    e = get_engine(engine)
    limit = e.max_sources
    if not w:
        raise UsageError("weights: give one weight per source, e.g. 10:5:5")
    if len(w) > limit:
        raise UsageError(f"weights {':'.join(map(str, w))}: {engine} reads from at most {limit} sources, got {len(w)}")
    for i, x in enumerate(w):
        if isinstance(x, bool) or not isinstance(x, int) or not e.weight_min <= x <= e.weight_max:
            raise UsageError(f"weights {':'.join(map(str, w))}: weight of source {i} is {x!r}; each must be an integer "
                             f"{e.weight_min}..{e.weight_max}")
    return w


def parse_weights(text: str, engine: str = DEFAULT_ENGINE) -> tuple[int, ...]:
    """'10:5:5' or '10,5,5' -> (10, 5, 5), checked."""
    parts = [p for p in str(text).replace(",", ":").split(":")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"weights {text!r}: use integers separated by ':' or ',', e.g. 10:5:5") from None
    return check_weights(values, engine)


def split_read(offset: int, length: int, weights: Sequence[int], engine: str = DEFAULT_ENGINE) -> tuple[Piece, ...]:
    """Split one read with the named engine's rule (weights are checked)."""
    rule = get_engine(engine).split
    if rule is None:
        with_rule = ", ".join(e.name for e in ENGINES.values() if e.split is not None)
        raise UsageError(f"engine {engine!r} does not split reads across sources; engines that do: {with_rule}")
    return rule(offset, length, check_weights(weights, engine))


def smallest_equivalent(weights: Sequence[int], length: int, engine: str = DEFAULT_ENGINE) -> tuple[int, ...]:
    """The smallest weights that cut a `length`-byte read as `weights` do (the weights themselves
    for an engine that does not cut reads on a grid)."""
    e = get_engine(engine)
    w = check_weights(weights, engine)
    return e.equivalent(w, length) if e.equivalent is not None else w


@dataclass(frozen=True)
class ReadSplit:
    """`planner split`: the pieces each source reads of one read, and the smallest weights that
    cut it the same way (a result, core.results)."""

    engine: str
    weights: tuple[int, ...]
    offset: int                      # bytes
    length: int                      # bytes
    smallest_equivalent: tuple[int, ...]
    pieces: tuple[Piece, ...]

    KIND: ClassVar[str] = "split"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return {"engine": self.engine, "weights": list(self.weights), "offset": self.offset, "length": self.length,
                "smallest_equivalent": list(self.smallest_equivalent),
                "pieces": [p._asdict() for p in self.pieces]}


def describe_split(offset: int, length: int, weights: Sequence[int], engine: str = DEFAULT_ENGINE) -> ReadSplit:
    """One read split by `engine`'s rule, with the smallest equivalent weights."""
    w = check_weights(weights, engine)
    return ReadSplit(engine, w, offset, length, smallest_equivalent(w, length, engine), split_read(offset, length, w, engine))
