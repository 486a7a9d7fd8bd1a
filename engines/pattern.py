"""An engine is a read pattern (docs/architecture.md, "Engines are read patterns"). Pure.

Every engine answers one question: for this model, this step of the workload (a prefill chunk of
a layer, a decoded token's misses in a layer), these weights and switches, which drive reads which
bytes, and which reads must all land before compute goes on. That answer is a `Pattern`:

- a `Read` is one read the engine issues, (file, offset, length) of the model, already cut into
  `Piece`s, each on one source (0 = the primary, then the replicas in order). The pieces of a read
  are contiguous and cover it exactly; a read the engine does not cut is one piece.
- a *group* is the reads the engine issues together and waits for before it computes what they
  carry (its barrier). Groups follow each other: the next group's reads are issued after the
  previous group's have landed.

The planner prices a pattern with the drive models and the embedded engine executes it through the
split reader; neither knows which engine made it. Each engine module gives `read_pattern(geometry,
step, setup) -> Pattern` and its `Concurrency`: how many reads it keeps in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

from .base import Piece

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class Step:
    """One step of the workload: the experts of one layer a phase reads (those not in the cache)."""
    phase: str                   # 'prefill' | 'decode'
    layer: int                   # index among the model's layers with routed experts
    experts: tuple[int, ...]     # ascending expert ids

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r}: expected prefill or decode")


@dataclass(frozen=True)
class Setup:
    """What a pattern depends on besides the model and the step.

    weights: this phase's weight per source, primary first (each engine checks its own range).
    switches: the engine's switches that are on (`engines.switches`; what each does to the reads
    is the engine's pattern's own). holds: per source, the model files its copy holds (None, or a
    missing entry: every file; the primary always holds every file). healthy: the sources that
    may serve (None: all) — the reader's failover, not the engine's: what a run does once a drive
    has failed."""
    weights: tuple[int, ...]
    switches: frozenset[str] = frozenset()
    holds: tuple[frozenset[str] | None, ...] = ()
    healthy: tuple[int, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.switches, frozenset):
            object.__setattr__(self, "switches", frozenset(self.switches))

    @property
    def sources(self) -> int:
        return len(self.weights)

    def holds_file(self, source: int, file: str) -> bool:
        if source == 0 or source >= len(self.holds) or self.holds[source] is None:
            return True
        return file in self.holds[source]

    def usable(self) -> tuple[int, ...]:
        """The sources that may serve, ascending (the primary first when it is healthy)."""
        if self.healthy is None:
            return tuple(range(len(self.weights)))
        return tuple(sorted(i for i in set(self.healthy) if 0 <= i < len(self.weights)))


class Read(NamedTuple):
    """One read the engine issues: bytes [offset, offset+length) of `file`, cut into pieces (a
    tuple, like `Piece`: the solver builds patterns for every candidate it prices)."""
    file: str
    offset: int
    length: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Pattern:
    """The reads of one step, in groups the engine waits for one after another."""
    step: Step
    groups: tuple[tuple[Read, ...], ...]

    @property
    def reads(self) -> tuple[Read, ...]:
        return tuple(r for g in self.groups for r in g)

    def source_bytes(self, n: int) -> tuple[int, ...]:
        """Bytes each of n sources reads in this step."""
        out = [0] * n
        for r in self.reads:
            for p in r.pieces:
                out[p.source] += p.length
        return tuple(out)

    def source_pieces(self, n: int) -> tuple[int, ...]:
        """Pieces (requests) each of n sources serves in this step."""
        out = [0] * n
        for r in self.reads:
            for p in r.pieces:
                if p.length:
                    out[p.source] += 1
        return tuple(out)


@dataclass(frozen=True)
class ReadShapes:
    """The engine's typical read in each phase, as a drive benchmark reproduces it (iobench's
    prefill and decode presets): bytes of one prefill read (a staging chunk) and of one decode
    read (an expert component), for a model whose component is known, or for the engine's own
    model when it is not."""
    prefill_bytes: int
    decode_bytes: int


@dataclass(frozen=True)
class Concurrency:
    """How many reads an engine keeps in flight in a phase: `per_source` pieces on each drive (each
    drive has its own lanes), or `shared` by all drives (one pool of threads); None where not
    limited. `per_read`: the pool's threads each take a whole read, whose pieces are all in flight
    at once (colibri's loaders, each striped read's legs on threads of their own); otherwise each
    thread takes one piece (ds4's pread pool)."""
    per_source: int | None = None
    shared: int | None = None
    per_read: bool = False

    def in_flight(self, pieces: Sequence[int], reads: int | None = None) -> tuple[int, ...]:
        """Requests each source holds at once in a group giving it `pieces` requests (of `reads`
        reads in all): its lanes, or its share of the pool in proportion to its requests (at least
        1), never more than it has."""
        total = sum(pieces)
        out = []
        for k in pieces:
            if k <= 0:
                out.append(0)
                continue
            if self.per_source is not None:
                q = self.per_source
            elif self.shared is not None and self.per_read and reads:
                q = max(1, int(self.shared * k / reads + 0.5))
            elif self.shared is not None:
                q = max(1, int(self.shared * k / total + 0.5))
            else:
                q = k
            out.append(min(k, q))
        return tuple(out)


def whole(source: int, offset: int, length: int, granule: int = 1) -> tuple[Piece, ...]:
    """A read the engine does not cut: one piece on `source`."""
    return (Piece(source, offset, length, length // max(1, granule)),)


def check_pattern(p: Pattern, sources: int, sizes: dict[str, int] | None = None) -> None:
    """ValueError unless every read's pieces are non-empty, on known sources, contiguous and cover
    the read exactly (and, given the files' sizes, lie inside the file)."""
    for r in p.reads:
        pos = r.offset
        if not r.pieces:
            raise ValueError(f"read {r.file}:{r.offset}+{r.length} has no piece")
        for pc in r.pieces:
            if not 0 <= pc.source < sources:
                raise ValueError(f"piece on source {pc.source} of {sources}")
            if pc.length <= 0 or pc.offset != pos:
                raise ValueError(f"read {r.file}:{r.offset}+{r.length}: piece {pc} is empty or not contiguous")
            pos += pc.length
        if pos != r.offset + r.length:
            raise ValueError(f"read {r.file}:{r.offset}+{r.length}: pieces end at {pos}")
        if sizes is not None and r.offset + r.length > sizes.get(r.file, -1):
            raise ValueError(f"read {r.file}:{r.offset}+{r.length} is past the file's end")
