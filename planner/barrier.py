"""The decode barrier priced from measured latency tails, and links drives share (pure, numpy).

**Tails.** A batch of decode reads completes when its last piece lands, so its time is the
*maximum* of the pieces' times, and the expected maximum of random times exceeds the maximum of
their means: a drive whose p99 is three times its median lands last more often than its mean says.
Each drive's request time is modelled as its curve's mean times a random factor X with E[X] = 1,
whose shape comes from iobench's latency quantiles (p50, p95, p99 and the mean) at the decode
preset: a shifted lognormal X = c + s * exp(sigma * Z) fitted through the three quantiles
(sigma from the ratio (p99 - p50) / (p95 - p50), which is 1.414 for any normal and grows with the
tail), held as ATOMS equally likely values and rescaled to mean 1. A drive holding k pieces at
once contributes the maximum of k draws (quantile u -> u ** (1/k)). The barrier is then the
expected maximum over every piece in flight, computed exactly for the atoms (`expected_max`),
for all candidates at once. With no spread every atom is 1 and the barrier is the slowest
source's mean, as before.

Prefill is not priced this way: each drive streams many pieces per layer, and a sum of many
pieces varies little (its spread shrinks as 1/sqrt(pieces)), so its mean sets the pace.

**Links.** Drives behind one uplink (a hub, a Thunderbolt port) share its ceiling: the bytes all
members move in one batch cannot pass faster than the link, so a batch takes at least
(sum of the members' bytes) / ceiling seconds (`link_times`). iobench measures such groups
(`--group`) and all drives together; `links_from` keeps a group as a link only when together
its members moved clearly less than alone (below SHARED_BELOW of the sum of their alone
ceilings) — otherwise the drives did not contend and the group's number is their sum plus noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

ATOMS = 64                      # equally likely values per latency distribution
Z95, Z99 = 1.6448536269514722, 2.3263478740408408
NORMAL_RATIO = Z99 / Z95        # (p99 - p50) / (p95 - p50) of any normal distribution
SHARED_BELOW = 0.95             # a group is a shared link when it moved < 95 % of its members' sum alone


@dataclass(frozen=True)
class LatencyShape:
    """A drive's request-time distribution relative to its mean (dimensionless quantiles).

    q50, q95, q99: the quantiles over the mean (e.g. p95 / mean). `atoms(k)` are ATOMS equally
    likely values of the maximum of k draws, scaled so one draw has mean 1."""
    q50: float = 1.0
    q95: float = 1.0
    q99: float = 1.0

    @property
    def spread(self) -> bool:
        return self.q99 > self.q50 * (1 + 1e-9)

    def atoms(self, k: int = 1) -> np.ndarray:
        return _atoms(self.q50, self.q95, self.q99, max(1, int(k))).copy()   # the cached array stays intact


def shape_from_latency(p50: float, p95: float, p99: float, mean: float) -> LatencyShape:
    """The shape of measured latencies (any one unit, e.g. ns); no spread when they are unusable."""
    vals = (p50, p95, p99, mean)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in vals) or not p50 <= p95 <= p99:
        return LatencyShape()
    return LatencyShape(p50 / mean, p95 / mean, p99 / mean)


def _sigma(ratio: float) -> float:
    """sigma of the lognormal whose (p99 - p50) / (p95 - p50) is `ratio` (bisection; the ratio
    grows with sigma from NORMAL_RATIO at 0)."""
    if ratio <= NORMAL_RATIO * (1 + 1e-6):
        return 1e-6                         # as light as a normal (or lighter): a normal
    lo, hi = 1e-6, 20.0
    for _ in range(200):
        mid = (lo + hi) / 2
        r = math.expm1(Z99 * mid) / math.expm1(Z95 * mid)
        lo, hi = (mid, hi) if r < ratio else (lo, mid)
    return (lo + hi) / 2


def _normal_ppf(u: np.ndarray) -> np.ndarray:
    """The standard normal's quantile function (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
    u = np.asarray(u, dtype=np.float64)
    out = np.empty_like(u)
    low, high = u < 0.02425, u > 1 - 0.02425
    mid = ~(low | high)
    q = u[mid] - 0.5
    r = q * q
    out[mid] = ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
                / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1))
    for mask, sign, p in ((low, 1.0, u[low]), (high, -1.0, 1 - u[high])):
        t = np.sqrt(-2 * np.log(p))
        out[mask] = sign * ((((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5])
                            / ((((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1))
    return out


@lru_cache(maxsize=256)
def _atoms(q50: float, q95: float, q99: float, k: int) -> np.ndarray:
    if not q99 > q50 * (1 + 1e-9):
        return np.ones(ATOMS)
    u = (np.arange(ATOMS) + 0.5) / ATOMS
    sigma = _sigma((q99 - q50) / max(q95 - q50, 1e-12 * q50))
    s = (q95 - q50) / math.expm1(Z95 * sigma) if q95 > q50 else (q99 - q50) / math.expm1(Z99 * sigma)
    one = np.maximum(q50 - s + s * np.exp(sigma * _normal_ppf(u)), 0.0)   # c + s e^(sigma z), c = q50 - s
    one /= one.mean()
    if k == 1:
        return one
    # the maximum of k draws: its quantile u is one draw's quantile u ** (1/k), read off the atoms
    grid = np.concatenate(([0.0], u, [1.0]))
    vals = np.concatenate(([one[0]], one, [one[-1]]))
    return np.interp(u ** (1.0 / k), grid, vals)


def expected_max(values: np.ndarray) -> np.ndarray:
    """E[max] over independent variables, each given as M equally likely values.

    values: (..., n, M): n variables of M atoms each, for every leading index (candidates).
    Returns (...): the expected maximum, exact for these atoms. The CDF of the maximum at a value
    v is the product over variables of (atoms <= v) / M; walking all n*M values in order, that
    product grows by steps and E[max] = sum of v * step."""
    v = np.asarray(values, dtype=np.float64)
    *lead, n, m = v.shape
    flat = v.reshape(*lead, n * m)
    order = np.argsort(flat, axis=-1, kind="stable")
    srt = np.take_along_axis(flat, order, axis=-1)
    owner = order // m                                              # which variable each value is
    counts = np.cumsum(owner[..., None] == np.arange(n), axis=-2)   # (..., n*m, n): atoms <= v so far
    cdf = np.prod(counts / m, axis=-1)
    steps = np.diff(cdf, axis=-1, prepend=0.0)
    return (srt * steps).sum(axis=-1)


def barrier_time(mean_s: np.ndarray, shapes: Sequence[LatencyShape], in_flight: np.ndarray,
                 scale: np.ndarray | None = None, extra_s: np.ndarray | None = None) -> np.ndarray:
    """Expected seconds until the last piece of a batch lands, for N candidates over n sources.

    mean_s: (N, n) mean request time of each source's pieces (0: the source reads nothing);
    in_flight: (N, n) pieces each source holds at once; scale: (n,) a stretch of the random part
    (busy work); extra_s: (n,) fixed seconds each source spends first (background reads), as the
    mean model adds them."""
    mean_s = np.atleast_2d(np.asarray(mean_s, dtype=np.float64))
    k = np.broadcast_to(np.asarray(in_flight, dtype=np.int64), mean_s.shape)
    n_rows, n = mean_s.shape
    scale = np.ones(n) if scale is None else np.asarray(scale, dtype=np.float64)
    extra = np.zeros(n) if extra_s is None else np.asarray(extra_s, dtype=np.float64)
    vals = np.empty((n_rows, n, ATOMS))
    for i, shape in enumerate(shapes):
        for q in np.unique(k[:, i]):
            rows = k[:, i] == q
            vals[rows, i, :] = mean_s[rows, i, None] * scale[i] * shape.atoms(int(q))[None, :]
    vals += extra[None, :, None]
    return expected_max(vals)


@dataclass(frozen=True)
class SharedLink:
    """Drives behind one uplink: the bytes/s all `members` (source indices) move together is at
    most `ceiling_Bps` (measured by iobench with the group read at once)."""
    name: str
    members: tuple[int, ...]
    ceiling_Bps: float


def link_times(nbytes: np.ndarray, links: Sequence[SharedLink], reads_per_batch: int = 1) -> np.ndarray:
    """(N, L) seconds each link needs to carry its members' bytes of one batch.

    nbytes: (N, n) bytes per source per read; a batch is `reads_per_batch` reads."""
    nbytes = np.atleast_2d(np.asarray(nbytes, dtype=np.float64))
    out = np.zeros((nbytes.shape[0], len(links)))
    for j, link in enumerate(links):
        out[:, j] = nbytes[:, list(link.members)].sum(axis=1) * reads_per_batch / link.ceiling_Bps
    return out


def links_from(groups: Sequence[tuple[str, Sequence[int], float, float]]) -> tuple[SharedLink, ...]:
    """Links from measured groups: (name, member indices, bytes/s together, sum of the members'
    bytes/s alone), one tuple per preset measured. A group is a shared link when in some preset it
    moved less than SHARED_BELOW of its members' sum alone; its ceiling is the most it carried in
    any preset. Groups that never fell short are left out (their drives did not contend)."""
    seen: dict[tuple[str, tuple[int, ...]], list] = {}
    for name, members, together, alone in groups:
        mem = tuple(sorted(int(i) for i in members))
        if len(mem) < 2 or not together > 0 or not alone > 0:
            continue
        top, shared = seen.get((name, mem), (0.0, False))
        seen[(name, mem)] = (max(top, float(together)), shared or together < SHARED_BELOW * alone)
    return tuple(SharedLink(name, mem, top) for (name, mem), (top, shared) in seen.items() if shared)
