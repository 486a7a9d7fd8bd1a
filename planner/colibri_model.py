"""colibri's expert reads priced on the drive curves, and the search over its weights (pure, numpy).

What colibri does, read from c/colibri.c of JustVugg/colibri (snapshot 99625c7e; `engines.colibri`
reproduces its placement and stripe rules bit for bit):

- `moe` resolves a layer's unique experts in blocks of BLOCK (64). The misses of a block are read
  at once — `#pragma omp parallel for schedule(dynamic,1)` over them (PIPE=0, the default except on
  Windows: OpenMP's threads, by default one per core), or PIPE_WORKERS pthreads (PIPE=1, default 8)
  — and the block's compute waits for every one of them: a barrier per block.
- `expert_load_impl` reads one expert's three weight tensors (contiguous in one shard) as one read
  from the drive `expert_route` picks (`engines.colibri.place_expert`): whole experts move between
  drives, never bytes. Its three small scale reads on the same drive are not priced.
- With DIRECT=1 and COLI_MIR_STRIPE on, `mir_pread_striped` cuts that read's 4 KiB-aligned O_DIRECT
  window, when it is at least 4 MiB, into equal chunks over every drive holding the shard, one
  pthread per chunk (`engines.colibri.stripe_read`); the read completes when the last chunk lands.
  Without DIRECT the read is buffered and never striped. Striping is one switch for both phases.

How it is priced (assumptions the sources do not settle are marked so):

- Shares: a drive's share of expert reads is its placement count over the model's real layers x
  experts grid (`placement_counts`), not its cut width / 256. *Assumed*: full mirrors (export
  refuses partial ones), and each read lands on drive r with that share independently.
- Read threads: READ_THREADS (8) loads in flight unless told — *assumed*, PIPE_WORKERS' default
  and OpenMP's on an 8-core machine; a drive gets the threads in proportion to its reads (at least
  one, at most its reads), as `planner.model` shares ds4's pool.
- Prefill (bandwidth-bound): per layer the prompt's expert reads go in blocks of 64; a drive's
  expected reads of a block, n = block x share, take n x bytes / throughput(bytes, its threads);
  the block waits for the slowest drive (and any shared link). The spread of the counts within a
  block is not priced (the mean counts are).
- Decode (latency-bound): each of the top_k experts a token picks in a layer misses with
  probability misses_per_layer / top_k and lands on drive r with its share: the drives' counts are
  multinomial, enumerated exactly; for each outcome the layer waits for the last read — the
  expected maximum over drives, with their measured latency tails (`barrier.barrier_time`) when
  iobench gave them — and the outcomes are weighted by their probability for each candidate.
- Striped: every drive holds one chunk of every read; a prefill block moves its reads' chunks with
  min(threads, reads) in flight on each drive; a decode layer with m misses waits for the slowest
  drive holding m chunks (priced at the full chunk; the shorter last chunk is not).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from engines.colibri import HASH_BUCKETS, WEIGHT_MAX, WEIGHT_MIN, direct_window, stripe_read, stripes

from .barrier import LatencyShape, Link, barrier_time
from .constants import ENGRAM_READ_BYTES, ENGRAM_READS_PER_TOKEN
from .model import Background, Drive, busy_factor

BLOCK = 64                 # unique experts moe() resolves (and loads) per block (ESlot ws[64])
READ_THREADS = 8           # loads in flight (assumed: PIPE_WORKERS' default; OpenMP's on 8 cores)
# The weight grid searched per drive count: every vector of 1..GRID_MAX[n]. Up to 3 drives that is
# colibri's whole 1..100 range (31,715 distinct cut vectors for 3); beyond, nearly every vector is
# a cut vector of its own (663,649 of 1..31 for 4 drives), so the grid is cut to ~60,000 vectors.
GRID_MAX = {1: WEIGHT_MAX, 2: WEIGHT_MAX, 3: WEIGHT_MAX, 4: 15, 5: 9}
TAIL_EPS = 1e-9            # decode outcomes beyond this probability mass are not enumerated
_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ColibriWorkload:
    """What colibri reads for one model (bytes, counts)."""
    layers: int                 # layers with routed experts
    experts: int                # routed experts per layer: the placement grid
    top_k: int                  # experts a token picks per layer
    expert_bytes: int           # one expert's weight tensors: one read
    prefill_reads: float        # expert reads per layer for the prompt (the routing model's figure)
    misses_per_token: float     # expert reads per decoded token over all layers
    threads: int = READ_THREADS
    block: int = BLOCK

    @property
    def misses_per_layer(self) -> float:
        return self.misses_per_token / max(1, self.layers)

    @property
    def window(self) -> int:
        """Bytes of the O_DIRECT window of one expert read (its start taken 4 KiB-aligned)."""
        return direct_window(0, self.expert_bytes)[1]

    def can_stripe(self, drives: int) -> bool:
        return stripes(self.window, drives)

    def as_dict(self) -> dict:
        return dict(asdict(self), window=self.window)


# ---------------------------------------------------------------------------------------------
# Candidates: the distinct cut vectors colibri's weights give, with their smallest weights

def weight_grid(n: int) -> np.ndarray:
    """Every weight vector of n drives (WEIGHT_MIN..GRID_MAX[n] each), smallest first: by sum,
    max, then lexicographic (the order `planner.solve.weight_space` uses)."""
    top = GRID_MAX[n]
    axes = np.meshgrid(*([np.arange(WEIGHT_MIN, top + 1, dtype=np.int64)] * n), indexing="ij")
    w = np.stack([a.ravel() for a in axes], axis=1)
    keys = [w[:, i] for i in reversed(range(n))] + [w.max(axis=1), w.sum(axis=1)]
    return w[np.lexsort(keys)]


def cuts_many(weights) -> np.ndarray:
    """`engines.colibri.cuts` for every row of `weights` (K x n) at once; identical results."""
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    cum = np.cumsum(w, axis=1)
    raw = np.floor(HASH_BUCKETS * cum / cum[:, -1:] + 0.5).astype(np.int64)
    out = np.empty_like(raw)
    acc = np.zeros(len(w), dtype=np.int64)
    for r in range(w.shape[1]):
        c = np.minimum(np.where(raw[:, r] <= acc, acc + 1, raw[:, r]), HASH_BUCKETS)
        out[:, r] = c
        acc = c
    out[:, -1] = HASH_BUCKETS
    return out


@lru_cache(maxsize=8)
def cut_classes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(cuts K x n, smallest weights K x n): every distinct cut vector the weight grid gives, in
    the order of its smallest weights."""
    w = weight_grid(n)
    c = cuts_many(w)
    key = np.zeros(len(w), dtype=np.int64)
    for r in range(n):
        key = key * (HASH_BUCKETS + 1) + c[:, r]
    _, first = np.unique(key, return_index=True)
    first.sort()
    return c[first], w[first]


@lru_cache(maxsize=16)
def bucket_counts(layers: int, experts: int) -> np.ndarray:
    """How many of the model's (layer, expert) pairs `expert_route` hashes into each of the 256
    buckets (`engines.colibri.expert_hash`, vectorised)."""
    lay = np.arange(layers, dtype=np.uint64)[:, None]
    exp = np.arange(experts, dtype=np.uint64)[None, :]
    h = ((lay * np.uint64(2654435761)) & np.uint64(_M32)) ^ ((exp * np.uint64(0x9E3779B9)) & np.uint64(_M32))
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x45D9F3B)) & np.uint64(_M32)
    h ^= h >> np.uint64(16)
    return np.bincount((h & np.uint64(255)).astype(np.int64).ravel(), minlength=HASH_BUCKETS)


def placement_counts_many(cuts: np.ndarray, layers: int, experts: int) -> np.ndarray:
    """Experts each drive serves (K x n) for every cut vector: `engines.colibri.placement_counts`."""
    cum = np.concatenate(([0], np.cumsum(bucket_counts(layers, experts))))
    c = np.atleast_2d(np.asarray(cuts, dtype=np.int64))
    lo = np.concatenate([np.zeros((len(c), 1), dtype=np.int64), c[:, :-1]], axis=1)
    return cum[c] - cum[lo]


# ---------------------------------------------------------------------------------------------
# Pricing one phase for every candidate

@dataclass(frozen=True)
class Priced:
    """One phase for K candidates over n drives (seconds and bytes per layer)."""
    layer_s: np.ndarray        # K: expected seconds per layer
    batch_s: np.ndarray        # K: prefill: one full block of reads; decode: one token's layer
    drive_s: np.ndarray        # K x n: expected seconds each drive is busy per layer
    drive_bytes: np.ndarray    # K x n: expected bytes each drive reads per layer
    last: np.ndarray           # K: the drive that lands last most often
    gap_s: np.ndarray          # K: how far it lands behind the next drive (expected)
    tail_s: np.ndarray         # K: expected barrier over the slowest mean (latency tails)
    bound: np.ndarray          # K: index of the link whose ceiling sets the time, or -1
    reads_per_layer: float
    read_bytes: int


class _Curves:
    """Each drive's curve asked once per (size, in-flight), as tables over in-flight 0..threads."""

    def __init__(self, drives: Sequence[Drive], threads: int):
        self.drives, self.threads = tuple(drives), max(1, int(threads))
        self._tab: dict[int, np.ndarray] = {}

    def table(self, size: int) -> np.ndarray:
        """(n, threads + 1) bytes/s of reads of `size` bytes with k in flight (column 0 unused)."""
        if size not in self._tab:
            t = np.ones((len(self.drives), self.threads + 1))
            for r, d in enumerate(self.drives):
                t[r, 1:] = [max(float(d.curve.throughput(int(size), k)), 1e-300) for k in range(1, self.threads + 1)]
            self._tab[size] = t
        return self._tab[size]

    def seconds(self, reads: np.ndarray, size: int, k: np.ndarray) -> np.ndarray:
        """`reads` (... x n) reads of `size` bytes with `k` in flight on each drive: reads x size /
        throughput (Little's law: (reads / k) request times); 0 where a drive reads nothing."""
        tab = self.table(int(size))
        kk = np.clip(np.asarray(k, dtype=np.int64), 1, self.threads)
        thr = tab[np.arange(tab.shape[0]), kk]
        return np.where(np.asarray(reads) > 0, np.asarray(reads, dtype=np.float64) * size / thr, 0.0)


def _shares(counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    return counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)


def _blocks(reads: float, block: int) -> list[tuple[float, float]]:
    """(reads in a block, how many such blocks) for `reads` reads per layer: full blocks first."""
    full, rem = divmod(max(0.0, reads), block)
    out = [(float(block), float(full))] if full else []
    if rem > 1e-12:
        out.append((rem, 1.0))
    return out


def _links_s(nbytes: np.ndarray, links: Sequence[Link]) -> np.ndarray:
    """(..., L) seconds each link needs for its members' bytes."""
    out = np.zeros(nbytes.shape[:-1] + (len(links),))
    for j, link in enumerate(links):
        out[..., j] = nbytes[..., list(link.members)].sum(axis=-1) / link.ceiling_Bps
    return out


def _engram_s(drives: Sequence[Drive], backgrounds: Sequence[Background], layers: int) -> np.ndarray:
    """Seconds per layer of a decoded token each drive spends on Engram rows (n,)."""
    extra = np.zeros(len(drives))
    for bg in backgrounds:
        if bg.kind == "engram":
            extra[bg.source] += ENGRAM_READS_PER_TOKEN / max(1, layers) * float(
                drives[bg.source].curve.request_time(ENGRAM_READ_BYTES, 1))
    return extra


def _stripe_sizes(cw: ColibriWorkload, n: int) -> tuple[int, int]:
    """(full chunk, last chunk) bytes of one striped read over n drives (`stripe_read`)."""
    sizes = [pc.length for pc in stripe_read(0, cw.window, 0, range(n))]
    return sizes[0], sizes[-1]


def price_prefill(drives: Sequence[Drive], cw: ColibriWorkload, counts: np.ndarray, stripe: bool = False,
                  backgrounds: Sequence[Background] = (), links: Sequence[Link] = ()) -> Priced:
    """Prefill for every candidate's placement counts (K x n): blocks of reads, each waiting for
    its slowest drive (mean counts, bandwidth-bound)."""
    n = len(drives)
    curves = _Curves(drives, cw.threads)
    p = _shares(counts)
    busy = busy_factor(drives, backgrounds)
    T = curves.threads
    layer, batch = np.zeros(len(p)), None
    drive_s, drive_b = np.zeros(p.shape), np.zeros(p.shape)
    link_s = np.zeros((len(p), len(links)))
    for size_n, times in _blocks(cw.prefill_reads, cw.block):
        if stripe:
            full, last = _stripe_sizes(cw, n)
            short = p[:, (np.arange(n) + 1) % n]     # drive r takes the last chunk when r + 1 is routed
            k = np.full(n, max(1, min(T, math.ceil(size_n))))
            reads = np.full(n, size_n)
            t = (1 - short) * curves.seconds(reads, full, k) + short * curves.seconds(reads, last, k)
            nb = size_n * ((1 - short) * full + short * last)
        else:
            reads = size_n * p
            k = np.minimum(np.clip(np.rint(T * p), 1, T), np.maximum(1, np.ceil(reads - 1e-9)))
            t = curves.seconds(reads, cw.expert_bytes, k)
            nb = reads * cw.expert_bytes
        t = t * busy[None, :]
        lt = _links_s(nb, links)
        bt = np.maximum(t.max(axis=1), lt.max(axis=1)) if links else t.max(axis=1)
        layer += times * bt
        drive_s += times * t
        drive_b += times * nb
        link_s += times * lt
        batch = bt if batch is None else batch
    batch = np.zeros(len(p)) if batch is None else batch
    srt = np.sort(drive_s, axis=1)
    gap = srt[:, -1] - (srt[:, -2] if n > 1 else 0.0)
    return Priced(layer, batch, drive_s, drive_b, np.argmax(drive_s, axis=1), gap, np.zeros(len(p)),
                  _bound(link_s, drive_s.max(axis=1), links), cw.prefill_reads, cw.expert_bytes)


def _bound(link_s: np.ndarray, drives_s: np.ndarray, links: Sequence[Link]) -> np.ndarray:
    """The link whose ceiling sets each candidate's time, or -1."""
    if not links:
        return np.full(len(drives_s), -1)
    j = np.argmax(link_s, axis=1)
    return np.where(link_s[np.arange(len(j)), j] > drives_s * (1 + 1e-9), j, -1)


def _outcomes(n: int, top_k: int, miss: float) -> np.ndarray:
    """Every vector of reads per drive (O x n) with at most m_max reads in all, m_max the fewest
    misses per layer beyond which the binomial tail holds less than TAIL_EPS."""
    m_max, tail = 0, 1.0
    for m in range(top_k + 1):
        tail -= math.comb(top_k, m) * miss ** m * (1 - miss) ** (top_k - m)
        m_max = m
        if tail < TAIL_EPS:
            break
    rows = [v for v in itertools.product(range(m_max + 1), repeat=n) if sum(v) <= m_max]
    return np.array(rows, dtype=np.int64).reshape(-1, n)


def outcome_probs(outcomes: np.ndarray, shares: np.ndarray, top_k: int, miss: float) -> np.ndarray:
    """Multinomial probability of each outcome (K x O): each of top_k picks misses with
    probability `miss` and lands on drive r with shares[:, r]."""
    lf = np.array([math.lgamma(i + 1) for i in range(top_k + 1)])
    tot = outcomes.sum(axis=1)
    base = lf[top_k] - lf[outcomes].sum(axis=1) - lf[top_k - tot]
    if miss < 1:
        base = base + (top_k - tot) * math.log1p(-miss)
    else:
        base = np.where(tot == top_k, base, -np.inf)
    q = np.asarray(shares, dtype=np.float64) * miss
    # log 0 as a huge finite number: 0 reads x it stays 0, any read on a share of 0 gets exp -> 0
    logq = np.log(np.maximum(q, 1e-300)) - np.where(q > 0, 0.0, 1e30)
    return np.exp(base[None, :] + logq @ outcomes.T.astype(np.float64))


CHUNK = 4096               # candidates whose outcome probabilities are held at once


def price_decode(drives: Sequence[Drive], cw: ColibriWorkload, counts: np.ndarray, stripe: bool = False,
                 backgrounds: Sequence[Background] = (), links: Sequence[Link] = ()) -> Priced:
    """Decode for every candidate's placement counts (K x n): a token's misses in a layer land on
    the drives by placement (multinomial, enumerated), and the layer waits for the last read."""
    n = len(drives)
    curves = _Curves(drives, cw.threads)
    p = _shares(counts)
    K = max(1, cw.top_k)
    miss = min(1.0, max(0.0, cw.misses_per_layer / K))
    T = curves.threads
    busy = busy_factor(drives, backgrounds)
    extra = _engram_s(drives, backgrounds, cw.layers)
    if stripe:
        full, last = _stripe_sizes(cw, n)
        ms = _outcomes(1, K, miss)                      # misses in the layer; each is read on every drive
        reads, size = np.repeat(ms, n, axis=1), full
        total = ms
    else:
        reads, size = _outcomes(n, K, miss), cw.expert_bytes
        total = reads.sum(axis=1, keepdims=True)
    k = np.where(total <= T, reads, np.maximum(1, np.rint(T * reads / np.maximum(total, 1)))).astype(np.int64)
    k = np.minimum(k, reads)
    mean = curves.seconds(reads, size, k)
    t = mean * busy[None, :] + extra[None, :]
    if any(d.tail is not None and d.tail.spread for d in drives):
        barrier = barrier_time(mean, [d.tail or LatencyShape() for d in drives], np.maximum(k, 1), busy, extra)
    else:
        barrier = t.max(axis=1)
    lt = _links_s(reads * float(size), links)
    time_o = np.maximum(barrier, lt.max(axis=1)) if links else barrier
    srt = np.sort(t, axis=1)
    gap_o = srt[:, -1] - (srt[:, -2] if n > 1 else 0.0)
    last_o = np.argmax(t, axis=1)
    lands = (last_o[:, None] == np.arange(n)[None, :]) & (reads.sum(axis=1) > 0)[:, None]    # O x n
    layer, drive_s, tail = np.zeros(len(p)), np.zeros(p.shape), np.zeros(len(p))
    link_s, land, gap_w = np.zeros((len(p), len(links))), np.zeros(p.shape), np.zeros(p.shape)
    for a in range(0, len(p), CHUNK):
        sl = slice(a, a + CHUNK)
        prob = outcome_probs(ms, np.ones((len(p[sl]), 1)), K, miss) if stripe else outcome_probs(reads, p[sl], K, miss)
        layer[sl], drive_s[sl], tail[sl] = prob @ time_o, prob @ t, prob @ (barrier - t.max(axis=1))
        link_s[sl], land[sl], gap_w[sl] = prob @ lt, prob @ lands, prob @ (lands * gap_o[:, None])
    lastd = np.argmax(land, axis=1)
    rows = np.arange(len(p))
    gap = gap_w[rows, lastd] / np.maximum(land[rows, lastd], 1e-300)
    if stripe:
        short = p[:, (np.arange(n) + 1) % n]
        drive_b = cw.misses_per_layer * ((1 - short) * full + short * last)
    else:
        drive_b = cw.misses_per_layer * p * cw.expert_bytes
    return Priced(layer, layer, drive_s, drive_b, lastd, gap, tail, _bound(link_s, drive_s.max(axis=1), links),
                  cw.misses_per_layer, cw.expert_bytes)


def throughput(pr: Priced) -> np.ndarray:
    """Bytes/s of expert data per candidate (the same bytes whether striped or not)."""
    return pr.reads_per_layer * pr.read_bytes / np.maximum(pr.layer_s, 1e-300)


# ---------------------------------------------------------------------------------------------
# Choosing: one weight vector (and one stripe switch) for both phases

@dataclass(frozen=True)
class Choice:
    """The candidates priced both ways and the pick."""
    cuts: np.ndarray           # K x n
    weights: np.ndarray        # K x n smallest weights
    counts: np.ndarray         # K x n placement counts
    priced: dict               # (phase, stripe) -> Priced
    score: np.ndarray          # S x K: the objective, rows stripe off (and on, when possible)
    stripes: tuple[bool, ...]  # what each row of `score` is
    row: int                   # the pick: its candidate
    stripe: bool               # and its stripe switch


PHASES = ("prefill", "decode")


def choose(drives: Sequence[Drive], cw: ColibriWorkload, backgrounds: Sequence[Background] = (),
           links: Sequence[Link] = (), tie: float = 1e-3) -> Choice:
    """Price every distinct cut vector with striping off (and on, when colibri would stripe this
    model's reads over these drives) and pick the one weight vector for both phases.

    The objective weighs the phases equally by how far each is from its own best: the sum over
    phases of (predicted seconds per layer) / (the phase's fastest over every candidate and both
    switches). Within `tie` of the best: striping off first, then a split giving every drive
    experts, then the smaller weights."""
    n = len(drives)
    cuts, weights = cut_classes(n)
    counts = placement_counts_many(cuts, cw.layers, cw.experts)
    switches = (False, True) if cw.can_stripe(n) else (False,)
    priced = {}
    for s in switches:
        priced[("prefill", s)] = price_prefill(drives, cw, counts, s, backgrounds, links)
        priced[("decode", s)] = price_decode(drives, cw, counts, s, backgrounds, links)
    best = {ph: min(float(priced[(ph, s)].layer_s.min()) for s in switches) for ph in PHASES}
    score = np.stack([sum(priced[(ph, s)].layer_s / max(best[ph], 1e-300) for ph in PHASES) for s in switches])
    top = float(score.min())
    every = (counts > 0).all(axis=1)
    ties = [(si, int(not every[r]), r) for si in range(len(switches)) for r in np.flatnonzero(score[si] <= top * (1 + tie))]
    si, _, row = min(ties)
    return Choice(cuts, weights, counts, priced, score, switches, int(row), switches[si])


def evaluate_weights(drives: Sequence[Drive], cw: ColibriWorkload, weights: Sequence[int], stripe: bool,
                     backgrounds: Sequence[Background] = (), links: Sequence[Link] = ()) -> dict:
    """(phase -> Priced) for one weight vector (a single candidate)."""
    cuts = cuts_many([list(weights)])
    counts = placement_counts_many(cuts, cw.layers, cw.experts)
    s = bool(stripe and cw.can_stripe(len(drives)))
    return {"prefill": price_prefill(drives, cw, counts, s, backgrounds, links),
            "decode": price_decode(drives, cw, counts, s, backgrounds, links)}


def prediction(pr: Priced, row: int, phase: str, drives: Sequence[Drive], weights: Sequence[int], cuts: Sequence[int],
               counts: Sequence[int], stripe: bool, links: Sequence[Link] = ()) -> dict:
    """One candidate of a priced phase as the plan's `predicted` block."""
    lo, total = 0, max(1, int(sum(counts)))
    sources = []
    for r, d in enumerate(drives):
        sources.append({"name": d.name, "cut": int(cuts[r]) - lo, "experts": int(counts[r]),
                        "share": int(counts[r]) / total, "bytes": float(pr.drive_bytes[row, r]),
                        "time_s": float(pr.drive_s[row, r])})
        lo = int(cuts[r])
    layer = float(pr.layer_s[row])
    b = int(pr.bound[row])
    return {"phase": phase, "weights": [int(x) for x in weights], "stripe": bool(stripe),
            "throughput_Bps": float(throughput(pr)[row]), "time_per_batch_s": float(pr.batch_s[row]),
            "time_per_read_s": layer / pr.reads_per_layer if pr.reads_per_layer else 0.0,
            "time_per_layer_s": layer, "reads_per_layer": pr.reads_per_layer, "read_bytes": pr.read_bytes,
            "lands_last": drives[int(pr.last[row])].name, "gap_s": float(pr.gap_s[row]),
            "tail_s": float(pr.tail_s[row]), "bound": links[b].name if b >= 0 else "", "sources": sources}
