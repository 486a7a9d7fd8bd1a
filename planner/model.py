"""The performance model of split reads (pure, numpy, vectorised over candidate splits).

A candidate is a vector of whole blocks per source for one read (what `engines.ds4_argodrive.block_counts`
returns for some weights). Drive behaviour comes from curves with the two methods iobench's
`DriveModel` has: `request_time(size_bytes, in_flight) -> s` and `throughput(size_bytes,
in_flight) -> bytes/s`. The curves are only ever asked about the few distinct piece sizes a
read can be cut into, so any curve object works and the arithmetic stays vectorised.

Prefill is bulk: each 32 MiB chunk is cut by weight and every drive keeps `lanes` pieces in
flight, so a drive needs piece / throughput(piece, lanes) seconds per chunk and the slowest
drive sets the pace.

Decode is latency-bound: a missed expert is `batch` component reads issued together, each cut
into pieces on up to three drives and read by a pool of `threads`; the batch waits for the last
piece (the barrier). A drive holding `k` pieces at once needs request_time(piece, k) for them.
Background work on a drive (the primary serves Engram rows) adds to its time before the barrier.
The barrier is the expected *maximum* of the pieces' times, each drawn from its drive's measured
latency distribution (`barrier.py`); with no measured spread that is the slowest mean. Drives
behind one link (`barrier.Link`) cannot move more than its ceiling together, in either phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from engines.ds4_argodrive import BLOCK, COMPONENT_BYTES, DECODE_BATCH, DECODE_THREADS, PREFILL_CHUNK, PREFILL_LANES

from .barrier import LatencyShape, Link, barrier_time, link_times
from .constants import (
    DECODE_MISSES_PER_TOKEN,
    ENGRAM_READ_BYTES,
    ENGRAM_READS_PER_TOKEN,
    EXPERT_BYTES,
    LAYERS,
    PREFILL_EXPERTS_PER_LAYER,
)

PHASES = ("prefill", "decode")


class DriveCurve(Protocol):
    def request_time(self, size_bytes: int, in_flight: int) -> float: ...

    def throughput(self, size_bytes: int, in_flight: int) -> float: ...


@dataclass(frozen=True)
class CorrectedCurve:
    """A fitted curve corrected by what was measured near the asked shape.

    A model form with a handful of parameters cannot follow every drive (an IOPS throttle that
    counts 512 KiB operations, a controller that merges deep queues), but iobench measured the
    drive at the engine's own shapes. So: throughput = base * (measured / base at the nearest
    measured point) ** w, where the point is taken among the nearest lane count and w fades from
    1 at the measured shape to 0 one octave away in size or lanes (`reach`). Far from every
    measurement the fitted curve speaks alone.
    """
    base: DriveCurve
    points: tuple[tuple[int, int, float], ...] = ()   # (size_bytes, in_flight, measured bytes/s)
    reach: float = 0.75  # octaves

    def factor(self, size_bytes: int, in_flight: int) -> float:
        pts = [p for p in self.points if p[0] > 0 and p[1] > 0 and p[2] > 0]
        if not pts or size_bytes <= 0:
            return 1.0
        k = max(1, int(in_flight))
        q = min({p[1] for p in pts}, key=lambda x: (abs(math.log2(x / k)), x))
        size, lanes, bw = min((p for p in pts if p[1] == q), key=lambda p: abs(math.log2(p[0] / size_bytes)))
        w = max(0.0, 1.0 - abs(math.log2(size / size_bytes)) / self.reach) * max(0.0, 1.0 - abs(math.log2(lanes / k)) / self.reach)
        base = float(self.base.throughput(size, lanes))
        return (bw / base) ** w if base > 0 and w > 0 else 1.0

    def throughput(self, size_bytes: int, in_flight: int) -> float:
        return float(self.base.throughput(size_bytes, in_flight)) * self.factor(size_bytes, in_flight)

    def request_time(self, size_bytes: int, in_flight: int) -> float:
        s, k = max(0, int(size_bytes)), max(1, int(in_flight))
        if s == 0:
            return float(self.base.request_time(0, k))
        return k * s / self.throughput(s, k)      # Little's law, as the fitted model does


@dataclass(frozen=True)
class Drive:
    """One source as the model sees it: a label, its fitted curve and the shape of its decode
    request times around their mean (None: no spread measured, the mean alone)."""
    name: str
    curve: DriveCurve
    tail: LatencyShape | None = None


@dataclass(frozen=True)
class Background:
    """Work a source does besides the split reads.

    kind 'engram': the Engram rows of each decoded token (ENGRAM_READS_PER_TOKEN reads of
    ENGRAM_READ_BYTES, one at a time), spread over the token's missed experts; decode only.
    kind 'busy': the source is busy `value` (0..1) of the time with other work; both phases.
    """
    source: int
    kind: str
    value: float = 0.0


@dataclass(frozen=True)
class Workload:
    """The shape of one phase's reads.

    prefill: `read_bytes` = the chunk (32 MiB), `in_flight` = lanes per drive.
    decode: `read_bytes` = one component (6,635,520 B), `in_flight` = reads per batch (one
    missed expert = 3), `threads` = the pread pool shared by all drives.
    The model's traffic (defaults: the named workload ds4-v41; `planner.workload` derives them
    for another model): `layers` with routed experts, `expert_bytes` of one expert, the experts
    per layer a prefill reads and the misses per decoded token.
    """
    phase: str
    read_bytes: int
    in_flight: int
    threads: int = DECODE_THREADS
    layers: int = LAYERS
    expert_bytes: int = EXPERT_BYTES
    experts_per_layer: float = PREFILL_EXPERTS_PER_LAYER
    misses_per_token: float = DECODE_MISSES_PER_TOKEN

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r}: expected prefill or decode")

    @property
    def blocks(self) -> int:
        return self.read_bytes // BLOCK

    @property
    def tail(self) -> int:
        return self.read_bytes % BLOCK

    @property
    def reads_per_batch(self) -> int:
        """Reads one unit of the phase's time covers: 1 chunk (prefill), `in_flight` reads (decode)."""
        return 1 if self.phase == "prefill" else self.in_flight

    @property
    def batches_per_layer(self) -> float:
        """Units per layer: chunks of the selective union (prefill), missed experts (decode)."""
        if self.phase == "prefill":
            return self.experts_per_layer * self.expert_bytes / self.read_bytes
        return self.misses_per_token / self.layers


def prefill_workload(lanes: int = PREFILL_LANES, chunk: int = PREFILL_CHUNK, **traffic) -> Workload:
    """The prefill phase's reads; `traffic`: Workload's model fields (default ds4-v41)."""
    return Workload("prefill", chunk, lanes, **traffic)


def decode_workload(batch: int = DECODE_BATCH, threads: int = DECODE_THREADS, length: int = COMPONENT_BYTES,
                    **traffic) -> Workload:
    """The decode phase's reads: `batch` component reads of `length` bytes per missed expert."""
    return Workload("decode", length, batch, threads, **traffic)


def piece_bytes(counts: np.ndarray, workload: Workload) -> np.ndarray:
    """Bytes per source for block counts (N x n): blocks * BLOCK, the tail on the primary."""
    b = np.asarray(counts, dtype=np.int64) * BLOCK
    b[..., 0] += workload.tail
    return b


def _curve_values(fn, sizes: np.ndarray, k: np.ndarray | int) -> np.ndarray:
    """fn(size, k) for each element, calling fn once per distinct (size, k); 0 where size is 0."""
    sizes = np.asarray(sizes, dtype=np.int64)
    ks = np.broadcast_to(np.asarray(k, dtype=np.int64), sizes.shape)
    pairs = np.stack([sizes.ravel(), ks.ravel()], axis=1)
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    vals = np.array([float(fn(int(s), int(q))) if s > 0 else 0.0 for s, q in uniq], dtype=np.float64)
    return vals[np.asarray(inverse).ravel()].reshape(sizes.shape)


def in_flight_per_source(counts: np.ndarray, workload: Workload) -> np.ndarray:
    """Pieces each source holds at once (N x n)."""
    nbytes = piece_bytes(counts, workload)
    active = nbytes > 0
    if workload.phase == "prefill":
        return np.where(active, workload.in_flight, 0)
    n_active = np.maximum(active.sum(axis=-1, keepdims=True), 1)
    per = np.minimum(workload.in_flight, np.maximum(workload.threads // n_active, 1))
    return np.where(active, per, 0)


def background_time(drives: Sequence[Drive], backgrounds: Sequence[Background], workload: Workload) -> np.ndarray:
    """Seconds per batch each source spends on background work before its pieces (n,)."""
    extra = np.zeros(len(drives))
    if workload.phase != "decode":
        return extra
    for bg in backgrounds:
        if bg.kind == "engram":
            reads_per_batch = ENGRAM_READS_PER_TOKEN / max(workload.misses_per_token, 1e-9)
            extra[bg.source] += reads_per_batch * float(drives[bg.source].curve.request_time(ENGRAM_READ_BYTES, 1))
    return extra


def busy_factor(drives: Sequence[Drive], backgrounds: Sequence[Background]) -> np.ndarray:
    """Time stretch per source from 'busy' background work (n,), >= 1."""
    f = np.ones(len(drives))
    for bg in backgrounds:
        if bg.kind == "busy":
            f[bg.source] /= max(1e-9, 1.0 - bg.value)
    return f


@dataclass(frozen=True)
class Evaluation:
    """The model's answer for N candidates over n sources (arrays, seconds and bytes)."""
    counts: np.ndarray         # N x n blocks per source
    nbytes: np.ndarray         # N x n bytes per source per read
    source_time: np.ndarray    # N x n mean seconds for the source's part of one batch
    time: np.ndarray           # N seconds per batch: the expected barrier, or a link if that is slower
    throughput: np.ndarray     # N bytes/s over all sources
    workload: Workload = field(repr=False)
    barrier: np.ndarray | None = None     # N expected seconds until the last piece lands (links aside)
    link_time: np.ndarray | None = None   # N x L seconds each link needs for its members' bytes
    links: tuple[Link, ...] = ()


def evaluate(drives: Sequence[Drive], counts, workload: Workload, backgrounds: Sequence[Background] = (),
             links: Sequence[Link] = ()) -> Evaluation:
    """Predict every candidate split (rows of `counts`, whole blocks per source).

    Decode: the batch's time is the expected maximum over its pieces, each drive's times drawn
    from its `tail` shape (`barrier.barrier_time`); with no tails that is the slowest mean.
    Prefill: the slowest drive's mean (a layer is many pieces per drive; their spread averages
    out). Either phase: no faster than any link can carry its members' bytes."""
    counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
    if counts.shape[1] != len(drives):
        raise ValueError(f"{counts.shape[1]} sources in the split, {len(drives)} drives")
    nbytes = piece_bytes(counts, workload)
    k = in_flight_per_source(counts, workload)
    t = np.zeros(nbytes.shape, dtype=np.float64)
    for i, d in enumerate(drives):
        if workload.phase == "prefill":
            thr = _curve_values(d.curve.throughput, nbytes[:, i], k[:, i])
            t[:, i] = np.divide(nbytes[:, i], thr, out=np.zeros(len(t)), where=nbytes[:, i] > 0)
        else:
            t[:, i] = _curve_values(d.curve.request_time, nbytes[:, i], k[:, i])
    busy = busy_factor(drives, backgrounds)
    extra = background_time(drives, backgrounds, workload)
    if workload.phase == "decode" and any(d.tail is not None and d.tail.spread for d in drives):
        barrier = barrier_time(t, [d.tail or LatencyShape() for d in drives], k, busy, extra)
    else:
        barrier = None
    t *= busy[None, :]
    t += extra[None, :]
    if barrier is None:
        barrier = t.max(axis=1)
    lt = link_times(nbytes, links, workload.reads_per_batch)
    time = np.maximum(barrier, lt.max(axis=1)) if links else barrier
    moved = workload.read_bytes * workload.reads_per_batch
    return Evaluation(counts, nbytes, t, time, moved / time, workload, barrier, lt, tuple(links))


@dataclass(frozen=True)
class SourceShare:
    name: str
    blocks: int
    bytes: int        # per read
    time_s: float     # completion of its part of one batch


@dataclass(frozen=True)
class Prediction:
    phase: str
    weights: tuple[int, ...]
    shares: tuple[SourceShare, ...]
    time_per_batch_s: float       # prefill: one chunk; decode: one missed expert's reads
    time_per_read_s: float
    time_per_layer_s: float
    throughput_Bps: float         # bytes/s over all sources
    lands_last: str               # which source sets the barrier
    gap_s: float                  # how far it lands behind the second-to-last active source
    tail_s: float = 0.0           # expected barrier minus the slowest mean (the latency tails' cost)
    bound: str = ""               # '' when the drives set the time, else the link whose ceiling does


def describe(ev: Evaluation, row: int, drives: Sequence[Drive], weights: Sequence[int]) -> Prediction:
    """One candidate of an evaluation as a readable prediction."""
    w = ev.workload
    t = ev.source_time[row]
    shares = tuple(SourceShare(d.name, int(ev.counts[row, i]), int(ev.nbytes[row, i]), float(t[i]))
                   for i, d in enumerate(drives))
    active = [i for i in range(len(drives)) if ev.nbytes[row, i] > 0 or t[i] > 0]
    order = sorted(active, key=lambda i: t[i])
    last = order[-1]
    gap = float(t[last] - t[order[-2]]) if len(order) > 1 else 0.0
    batch = float(ev.time[row])
    slowest = float(t.max()) if len(t) else 0.0
    tail = float(ev.barrier[row]) - slowest if ev.barrier is not None else 0.0
    bound = ""
    if ev.links and ev.link_time is not None and ev.link_time.shape[1]:
        j = int(np.argmax(ev.link_time[row]))
        if ev.link_time[row, j] > (float(ev.barrier[row]) if ev.barrier is not None else slowest):
            bound = ev.links[j].name
    return Prediction(w.phase, tuple(int(x) for x in weights), shares, batch, batch / w.reads_per_batch,
                      batch * w.batches_per_layer, float(ev.throughput[row]), drives[last].name, gap,
                      max(0.0, tail), bound)


def prediction_to_dict(p: Prediction) -> dict:
    return {
        "phase": p.phase,
        "weights": list(p.weights),
        "throughput_Bps": p.throughput_Bps,
        "time_per_batch_s": p.time_per_batch_s,
        "time_per_read_s": p.time_per_read_s,
        "time_per_layer_s": p.time_per_layer_s,
        "lands_last": p.lands_last,
        "gap_s": p.gap_s,
        "tail_s": p.tail_s,
        "bound": p.bound,
        "sources": [{"name": s.name, "blocks": s.blocks, "bytes": s.bytes, "time_s": s.time_s} for s in p.shares],
    }


def capability_weights(drives: Sequence[Drive], workload: Workload, scale: int = 100) -> tuple[int, ...]:
    """Weights proportional to what each drive delivers alone at an even share of the read."""
    n = len(drives)
    size = max(BLOCK, (workload.read_bytes // n) // BLOCK * BLOCK)
    k = workload.in_flight if workload.phase == "prefill" else min(workload.in_flight, max(1, workload.threads // n))
    if workload.phase == "prefill":
        caps = np.array([float(d.curve.throughput(size, k)) for d in drives])
    else:
        caps = np.array([size / float(d.curve.request_time(size, k)) for d in drives])
    w = np.clip(np.rint(caps / caps.max() * scale), 1, scale).astype(int)
    return tuple(int(x) for x in w)
