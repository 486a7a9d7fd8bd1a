"""The split reader's nouns and counter arithmetic (pure: no disk, no threads).

The counters are the engine's tuning signal (docs/engine-profiles.md): per source `bytes`, `reads`,
`lands_last` (how often its piece was the last of a read to land) and `gap_ns` (summed over
those reads: how far behind the second-to-last piece it landed), plus read latency percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from engines.registry import DEFAULT_ENGINE
from engines.split import split_read


@dataclass(frozen=True)
class ReaderEvent:
    """Something the reader did beyond the engine: a failed piece, a failover, a lost source."""

    kind: str          # 'read_failed', 'short_read', 'failover', 'degraded', 'recovered', 'vanished', 'all_failed',
                       # 'reweighted'
    source: int        # index of the source concerned (0 = primary)
    path: str          # the source's model path (its file, split set's first file, or directory)
    message: str       # one line: what happened and what the reader did about it
    offset: int = 0    # bytes from the start of `file`: the piece concerned (0 when not about a piece)
    length: int = 0
    t_ns: int = 0      # monotonic clock
    file: str = ""     # the model's file the piece is in (relative, as in ModelSet.files); "" when about the source
    detail: dict | None = None   # 'reweighted': {"old", "new": phase -> weights, "rates_mbs", "why"}

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "source": self.source, "path": self.path, "message": self.message,
             "file": self.file, "offset": self.offset, "length": self.length, "t_ns": self.t_ns}
        if self.detail is not None:
            d["detail"] = self.detail
        return d


@dataclass(frozen=True)
class SourceStats:
    index: int
    path: str                   # the source's model path (its file, split set's first file, or directory)
    weight: int                 # prefill (base) weight
    decode_weight: int
    bytes: int                  # bytes this source delivered (exact piece bytes, not alignment padding)
    reads: int                  # pieces this source delivered
    lands_last: int             # reads whose last-landing piece was this source's
    gap_ns: int                 # sum over those reads of (last landing - second-to-last landing), ns
    lat_ns: dict                # piece service time percentiles, ns: {'p50', 'p95', 'p99'}
    degraded: bool
    events: int                 # events concerning this source
    failover_bytes: int = 0     # bytes this source re-read for another, failed source
    hedged: int = 0             # hedge reads this source served for another source's late piece
    late: int = 0               # pieces of this source that missed their deadline (and were hedged if they could be)
    stolen_bytes: int = 0       # bytes this source read of pieces given to another (balancing took them)
    slow: bool = False          # degraded for lateness (probed, may come back), not failed
    chunk_bytes: int = 0        # the chunk its pieces were cut into at the end (balancing; 0: not balancing)

    def to_dict(self) -> dict:
        return {"index": self.index, "path": self.path, "weight": self.weight, "decode_weight": self.decode_weight,
                "bytes": self.bytes, "reads": self.reads, "lands_last": self.lands_last, "gap_ns": self.gap_ns,
                "lat_ns": dict(self.lat_ns), "degraded": self.degraded, "events": self.events,
                "failover_bytes": self.failover_bytes, "hedged": self.hedged, "late": self.late, "slow": self.slow,
                "stolen_bytes": self.stolen_bytes, "chunk_bytes": self.chunk_bytes}


@dataclass(frozen=True)
class PhaseSourceStats:
    """One source's part of one phase's reads."""

    index: int
    given_bytes: int            # bytes the split gave this source (its pieces), whoever delivered them
    given_pieces: int           # pieces the split gave it
    bytes: int                  # bytes it delivered (its own pieces, and others' it re-read or hedged)
    reads: int                  # pieces it delivered

    def to_dict(self) -> dict:
        return {"index": self.index, "bytes": self.bytes, "reads": self.reads, "given_bytes": self.given_bytes,
                "given_pieces": self.given_pieces}


@dataclass(frozen=True)
class PhaseStats:
    """What one phase ('prefill' or 'decode') read, in all and per source."""

    phase: str
    reads: int                  # whole reads (barriers) completed in the phase
    bytes: int                  # bytes of those reads
    largest_read: int           # bytes of the largest read submitted in the phase (0: none)
    sources: tuple[PhaseSourceStats, ...]

    def to_dict(self) -> dict:
        return {"reads": self.reads, "bytes": self.bytes, "largest_read": self.largest_read,
                "sources": [s.to_dict() for s in self.sources]}


@dataclass(frozen=True)
class ReaderStats:
    sources: tuple[SourceStats, ...]
    events: tuple[ReaderEvent, ...] = ()
    reads: int = 0              # whole reads (barriers) completed
    bytes: int = 0              # bytes returned to callers
    phases: tuple[PhaseStats, ...] = ()    # the same counted per phase, prefill then decode
    weights_now: dict | None = None        # phase -> the weights reads are cut with at the end (re-weighting)
    reweighs: int = 0                      # times re-weighting changed them
    build: str = ""                        # which copy of the reader's per-piece modules ran (`build.HOW`)
    watchdog: dict | None = None           # hedging's watchdog: rounds, woken by its timer, that judged a piece

    def to_dict(self) -> dict:
        return {"reads": self.reads, "bytes": self.bytes, "sources": [s.to_dict() for s in self.sources],
                "events": [e.to_dict() for e in self.events], "phases": {p.phase: p.to_dict() for p in self.phases},
                "weights_now": self.weights_now, "reweighs": self.reweighs, "build": self.build,
                "watchdog": self.watchdog}


def percentile(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile (q in 0..100) of already sorted values; 0 for none."""
    n = len(sorted_values)
    if n == 0:
        return 0
    rank = max(1, math.ceil(q * n / 100))
    return int(sorted_values[min(n, rank) - 1])


def latency_summary(values: Sequence[int]) -> dict:
    s = sorted(values)
    return {"p50": percentile(s, 50), "p95": percentile(s, 95), "p99": percentile(s, 99)}


def last_landing(landings: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """Given (source, landed_ns) of a read's non-empty pieces, the (source, gap_ns) of the one
    that landed last (gap to the second-to-last); None when fewer than two pieces (no race)."""
    if len(landings) < 2:
        return None
    order = sorted(range(len(landings)), key=lambda i: landings[i][1])
    last, second = landings[order[-1]], landings[order[-2]]
    return last[0], last[1] - second[1]


def healthy_split(offset: int, length: int, weights: Sequence[int], healthy: Sequence[int],
                  engine: str = DEFAULT_ENGINE) -> list[tuple[int, int, int]]:
    """Split a read over the healthy sources only, with the engine's rule (never our own
    arithmetic): returns (source index, piece offset, piece length) for non-empty pieces.

    With every source healthy this is exactly `split_read(offset, length, weights)`; when a
    source is degraded its share goes to the others by their weights, in engine order.
    """
    sub = [weights[i] for i in healthy]
    pieces = split_read(offset, length, sub, engine)
    return [(healthy[p.source], p.offset, p.length) for p in pieces if p.length > 0]


def format_stats(stats: ReaderStats) -> str:
    """The per-source lines the engine prints at the end of a run."""
    lines = []
    for s in stats.sources:
        line = (f"source[{s.index}] bytes={s.bytes} reads={s.reads} lands_last={s.lands_last} gap_ns={s.gap_ns} "
                f"hedged={s.hedged} late={s.late} lat_p50_us={s.lat_ns['p50'] / 1e3:.0f} lat_p95_us={s.lat_ns['p95'] / 1e3:.0f} "
                f"lat_p99_us={s.lat_ns['p99'] / 1e3:.0f} weight={s.weight} decode_weight={s.decode_weight}")
        if s.failover_bytes:
            line += f" failover_bytes={s.failover_bytes}"
        if s.stolen_bytes:
            line += f" stolen_bytes={s.stolen_bytes}"
        if s.chunk_bytes:
            line += f" chunk_bytes={s.chunk_bytes}"
        if s.degraded:
            line += " DEGRADED(late)" if s.slow else " DEGRADED"
        lines.append(line + f" path={s.path}")
    return "\n".join(lines)
