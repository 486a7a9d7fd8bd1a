"""One pricing for every engine: a read pattern priced on the drive models (pure, numpy).

The engine says which drive reads which bytes in which groups (`engines.pattern`); this module
says how long that takes on the rig's drives, without knowing which engine it is pricing.

- A step of the workload (a prefill chunk of a layer, a decoded token's misses in a layer) is
  priced group after group: the engine issues a group's reads together and waits for the last.
- Within a group, each drive serves its pieces with the engine's concurrency (`Concurrency`:
  lanes per drive, or its share of one pool): a drive holding k pieces at once moves them at
  throughput(size, k), so its part takes sum(size / throughput(size, k)) (Little's law, as the
  fitted curves are). Busy background work stretches a drive's time.
- The group lands when its slowest drive does (with measured latency tails, `--tails`: the
  expected maximum of independent draws, `barrier.barrier_time`), and no sooner than any shared
  link can carry its members' bytes.
- Decode: a decoded token also reads Engram rows on the drive that carries them (`Background`
  'engram'), once per token spread over its layers, whether or not the layer missed.
- Experts: per step, each of the step's experts counts for the source whose piece holds the
  expert's first byte (the lowest (file, offset) of its bytes, `Geometry.expert_ranges`). For an
  engine that reads each expert whole from one drive that is the drive serving it; for one that cuts
  reads it is whose piece each expert starts in. The engine's reads carry no expert ids; the
  step and the geometry do.
- A phase is the sum of its steps. The steps come from the routing model run through the
  engine's cache policy (`planner.workload`); a large model's steps are sampled evenly (at most
  PREFILL_SAMPLE / DECODE_SAMPLE of them) and scaled to the whole.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from engines.base import Engine
from engines.pattern import Pattern, Setup, Step

from .barrier import LatencyShape, SharedLink, barrier_time
from .constants import ENGRAM_READ_BYTES, ENGRAM_READS_PER_TOKEN
from .drivecurves import Background, Drive, busy_factor

PREFILL_SAMPLE = 8       # prefill steps priced at most (layers of the prompt's chunks), evenly spaced
DECODE_SAMPLE = 128      # decode steps with reads priced at most, evenly spaced


@dataclass(frozen=True)
class PhaseSteps:
    """The steps of one phase the pricing walks: `steps` (the ones with reads, sampled), each
    standing for `scale` real steps, plus `empty` real steps that read nothing; they cover
    `tokens` tokens (the prompt, or the decoded tokens measured) over `layers` layers."""
    phase: str
    steps: tuple[Step, ...]
    scale: float
    empty: int
    tokens: int
    layers: int
    fresh: tuple[Step, ...] = ()     # each of `steps` without the experts read before in the run (page-cache hits)

    @property
    def total_steps(self) -> float:
        return len(self.steps) * self.scale + self.empty


def sample_steps(phase: str, steps: Sequence[Step], tokens: int, layers: int, limit: int,
                 fresh: Sequence[Step] = ()) -> PhaseSteps:
    """Keep at most `limit` of the steps that read something, evenly spaced, scaled to all of them;
    `fresh`: the same steps without the experts read before in the run (kept alongside)."""
    full = [i for i, s in enumerate(steps) if s.experts]
    empty, reading = len(steps) - len(full), len(full)
    if len(full) > limit:
        idx = np.linspace(0, len(full) - 1, limit).round().astype(int)
        full = [full[i] for i in sorted(set(idx.tolist()))]
    kept = tuple(steps[i] for i in full)
    kept_fresh = tuple(fresh[i] for i in full) if fresh else ()
    scale = reading / len(kept) if kept else 0.0
    return PhaseSteps(phase, kept, scale, empty, tokens, layers, kept_fresh)


class Curves:
    """The drives' throughput asked once per (drive, piece size, in flight)."""

    def __init__(self, drives: Sequence[Drive]):
        self.drives = tuple(drives)
        self._thr: dict[tuple[int, int, int], float] = {}

    def seconds(self, source: int, size: int, k: int) -> float:
        key = (source, size, k)
        thr = self._thr.get(key)
        if thr is None:
            thr = max(float(self.drives[source].curve.throughput(size, k)), 1e-300)
            self._thr[key] = thr
        return size / thr

    def request_time(self, source: int, size: int, k: int) -> float:
        return float(self.drives[source].curve.request_time(size, k))


@dataclass(frozen=True)
class PhasePrice:
    """One phase priced for one setup (seconds, bytes)."""
    phase: str
    seconds: float                 # the phase's read time for its tokens
    tokens: int
    steps: float                   # real steps covered (layers x chunks, or layers x tokens)
    groups: float                  # groups the engine waited for
    reads: float                   # reads the engine issued
    source_bytes: tuple[float, ...]    # bytes each source read over the phase
    source_pieces: tuple[float, ...]   # pieces each source served
    source_s: tuple[float, ...]        # seconds each source was busy
    source_experts: tuple[float, ...]  # experts whose first byte each source read (see the module doc)
    lands_last: tuple[float, ...]      # groups whose last piece was each source's
    gap_s: float                   # mean lag of the last drive behind the next, per group
    tail_s: float                  # expected barrier beyond the slowest mean, per group (latency tails)
    bound: str                     # the link whose ceiling set most groups' time, or ''

    @property
    def bytes(self) -> float:
        return float(sum(self.source_bytes))

    @property
    def throughput_Bps(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


def _engram_s(curves: Curves, backgrounds: Sequence[Background], layers: int, n: int) -> np.ndarray:
    """Seconds each source spends on Engram rows per decode step (one layer of one token)."""
    extra = np.zeros(n)
    for bg in backgrounds:
        if bg.kind == "engram":
            extra[bg.source] += ENGRAM_READS_PER_TOKEN / max(1, layers) * curves.request_time(bg.source, ENGRAM_READ_BYTES, 1)
    return extra


_FIRST: dict = {}        # (geometry id, step) -> (geometry, each expert's first (file, offset)): weight-independent


def first_bytes(geometry, step: Step) -> tuple[tuple[str, int], ...]:
    """(file, offset) of the first byte of each of the step's experts (its lowest extent)."""
    key = (id(geometry), step)
    hit = _FIRST.get(key)
    if hit is not None and hit[0] is geometry:
        return hit[1]
    out = tuple(min((x.file, x.offset) for x in geometry.expert_ranges(step.layer, e)) for e in step.experts)
    if len(_FIRST) > 8192:
        _FIRST.clear()
    _FIRST[key] = (geometry, out)
    return out


def expert_sources(pattern: Pattern, geometry, n: int) -> np.ndarray:
    """Per source (n), the step's experts whose first byte its pieces read; an expert no piece
    covers (a pattern that reads less than the step's experts) counts for none."""
    out = np.zeros(n)
    if geometry is None or not pattern.step.experts:
        return out
    starts = {(r.file, pc.offset): pc.source for r in pattern.reads for pc in r.pieces if pc.length}
    spans: dict[str, list[tuple[int, int, int]]] | None = None
    for file, offset in first_bytes(geometry, pattern.step):
        src = starts.get((file, offset))
        if src is None:                 # the expert starts inside a piece: find that piece
            if spans is None:
                spans = {}
                for r in pattern.reads:
                    for pc in r.pieces:
                        if pc.length:
                            spans.setdefault(r.file, []).append((pc.offset, pc.offset + pc.length, pc.source))
                for lst in spans.values():
                    lst.sort()
            lst = spans.get(file) or []
            i = bisect_right(lst, (offset, float("inf"), n)) - 1
            if i < 0 or offset >= lst[i][1]:
                continue
            src = lst[i][2]
        out[src] += 1
    return out


def price_patterns(patterns: Sequence[Pattern], steps: PhaseSteps, curves: Curves, engine: Engine,
                   backgrounds: Sequence[Background] = (), links: Sequence[SharedLink] = (), geometry=None) -> PhasePrice:
    """The phase's price from the patterns of its sampled steps (one per step, same order).
    `geometry` (the model's) lets it count each source's experts; without it they are 0."""
    drives = curves.drives
    n = len(drives)
    conc = engine.concurrency(steps.phase)
    busy = busy_factor(drives, backgrounds)
    extra = _engram_s(curves, backgrounds, steps.layers, n) if steps.phase == "decode" else np.zeros(n)
    tails = steps.phase == "decode" and any(d.tail is not None and d.tail.spread for d in drives)
    rows_t, rows_k, rows_extra, rows_link = [], [], [], []
    nbytes, npieces, nreads, nexperts = np.zeros(n), np.zeros(n), 0, np.zeros(n)
    for p in patterns:
        nexperts += expert_sources(p, geometry, n)
        last = len(p.groups) - 1
        for gi, group in enumerate(p.groups):
            sizes: list[list[int]] = [[] for _ in range(n)]
            nreads += len(group)
            for r in group:
                for pc in r.pieces:
                    if pc.length:
                        sizes[pc.source].append(pc.length)
            counts = [len(s) for s in sizes]
            k = conc.in_flight(counts, len(group))
            t = np.array([sum(curves.seconds(i, z, k[i]) for z in sizes[i]) for i in range(n)])
            b = np.array([float(sum(s)) for s in sizes])
            nbytes += b
            npieces += counts
            rows_t.append(t)
            rows_k.append(k)
            rows_extra.append(extra if gi == last else np.zeros(n))
            rows_link.append([b[list(link.members)].sum() / link.ceiling_Bps for link in links])
        if not p.groups and steps.phase == "decode" and extra.any():
            rows_t.append(np.zeros(n))
            rows_k.append((0,) * n)
            rows_extra.append(extra)
            rows_link.append([0.0] * len(links))
    G = len(rows_t)
    if G:
        T = np.array(rows_t) * busy[None, :]
        K = np.array(rows_k, dtype=np.int64)
        E = np.array(rows_extra)
        L = np.array(rows_link).reshape(G, len(links))
        mean = T + E
        slowest = mean.max(axis=1)
        if tails:
            # the tails stretch the reads (busy work too); Engram rows are a fixed time added first
            raw = np.array(rows_t)
            barrier = np.empty(G)
            with_extra = E.any(axis=1)
            for mask, ex in ((with_extra, extra), (~with_extra, np.zeros(n))):
                if mask.any():
                    barrier[mask] = barrier_time(raw[mask], [d.tail or LatencyShape() for d in drives],
                                                 np.maximum(K[mask], 1), busy, ex)
            barrier = np.maximum(barrier, slowest)
        else:
            barrier = slowest
        lt = L.max(axis=1) if links else np.zeros(G)
        gtime = np.maximum(barrier, lt)
        order = np.sort(mean, axis=1)
        last_src = np.argmax(mean, axis=1)
        gap = order[:, -1] - (order[:, -2] if n > 1 else 0.0)
        bound_idx = np.where(lt > barrier * (1 + 1e-9), np.argmax(L, axis=1) if links else -1, -1)
    else:
        gtime = np.zeros(0)
        mean = np.zeros((0, n))
        last_src = np.zeros(0, dtype=int)
        gap = np.zeros(0)
        barrier = slowest = np.zeros(0)
        bound_idx = np.zeros(0, dtype=int)
    s = steps.scale
    # empty decode steps still read Engram rows: their time is the slowest drive's rows
    empty_s = steps.empty * float(extra.max()) if steps.phase == "decode" else 0.0
    # groups made for an empty sampled step (none are sampled: empty steps are counted apart)
    seconds = s * float(gtime.sum()) + empty_s
    lands = np.bincount(last_src, minlength=n).astype(float) * s if G else np.zeros(n)
    bound = ""
    if links and G:
        bi = bound_idx[bound_idx >= 0]
        if bi.size * 2 >= G:
            bound = links[int(np.bincount(bi).argmax())].name
    return PhasePrice(steps.phase, seconds, steps.tokens, steps.total_steps, s * G, s * nreads,
                      tuple(float(x) for x in nbytes * s), tuple(float(x) for x in npieces * s),
                      tuple(float(x) for x in mean.sum(axis=0) * s + (extra * steps.empty if steps.phase == "decode" else 0)),
                      tuple(float(x) for x in nexperts * s), tuple(float(x) for x in lands),
                      float(gap.mean()) if G else 0.0, float((barrier - slowest).mean()) if G else 0.0, bound)


Patterner = Callable[[Step, Setup], Pattern]


def price_phase(steps: PhaseSteps, setup: Setup, patterner: Patterner, curves: Curves, engine: Engine,
                backgrounds: Sequence[Background] = (), links: Sequence[SharedLink] = (), geometry=None,
                page_cache: float = 0.0, buffered_excess: float = 0.0) -> PhasePrice:
    """Price one phase at one setup: the engine's pattern of each sampled step, then its price.

    page_cache: the share (0..1) of the model's routed bytes the page cache can hold. An engine
    whose reads at this setup go through the page cache (`Engine.buffered`) then finds that share
    of what it reads again in the run there: the phase is priced as that mix of its steps and the
    same steps without the experts read before (`PhaseSteps.fresh`). buffered_excess: what such
    reads read beyond their bytes (the kernel's readahead), a share of them; their drives' bytes
    and times grow by it."""
    cold = price_patterns([patterner(st, setup) for st in steps.steps], steps, curves, engine, backgrounds, links,
                          geometry)
    buffered = engine.buffered(setup)
    if page_cache > 0 and steps.fresh and buffered:
        warm = price_patterns([patterner(st, setup) for st in steps.fresh], steps, curves, engine, backgrounds, links,
                              geometry)
        cold = blend(cold, warm, min(1.0, page_cache))
    return inflate(cold, 1.0 + buffered_excess) if buffered and buffered_excess > 0 else cold


def inflate(a: PhasePrice, f: float) -> PhasePrice:
    """`a` with every drive reading `f` times its bytes, at the same rates: its bytes and times
    times f (its reads, pieces, experts and groups as they were)."""
    return replace(a, seconds=a.seconds * f, source_bytes=tuple(x * f for x in a.source_bytes),
                   source_s=tuple(x * f for x in a.source_s), gap_s=a.gap_s * f, tail_s=a.tail_s * f)


def blend(a: PhasePrice, b: PhasePrice, w: float) -> PhasePrice:
    """(1 - w) a + w b, field by field (the link that bound most groups: a's)."""
    def mix(x, y):
        if isinstance(x, tuple):
            return tuple((1 - w) * p + w * q for p, q in zip(x, y))
        return (1 - w) * x + w * y
    return PhasePrice(a.phase, mix(a.seconds, b.seconds), a.tokens, a.steps, mix(a.groups, b.groups), mix(a.reads, b.reads),
                      mix(a.source_bytes, b.source_bytes), mix(a.source_pieces, b.source_pieces),
                      mix(a.source_s, b.source_s), mix(a.source_experts, b.source_experts),
                      mix(a.lands_last, b.lands_last), mix(a.gap_s, b.gap_s), mix(a.tail_s, b.tail_s), a.bound)
