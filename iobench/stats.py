"""The arithmetic of a trial: window rates, percentiles, knee, spread (pure).

A request is a (start_ns, end_ns, bytes) triple. Its bytes are credited to a time window in
proportion to the part of its life that lies inside the window ("linear progress"). That is
exact for a drive that serves requests in parallel, and also, once the in-flight requests are
staggered (every lane has completed one request), for a drive that serves them one after the
other (a throttle's FIFO): the partial credit of in-flight requests is then the same at both
ends of any window and cancels. Counting only completed requests would instead be off by up to
a whole request per lane.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .constants import KNEE_FRACTION


def window_totals(starts: np.ndarray, ends: np.ndarray, nbytes: np.ndarray, a: int, b: int) -> tuple[float, float]:
    """(bytes, requests) credited to the window [a, b) in ns, by linear progress."""
    if b <= a or len(starts) == 0:
        return 0.0, 0.0
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    n = np.asarray(nbytes, dtype=float)
    life = np.maximum(e - s, 1)
    overlap = np.clip(np.minimum(e, b) - np.maximum(s, a), 0, None)
    frac = overlap / life
    return float((n * frac).sum()), float(frac.sum())


def window_rates(starts, ends, nbytes, windows: Sequence[tuple[int, int]]) -> list[tuple[float, float]]:
    """[(bytes/s, requests/s)] for each window (a_ns, b_ns)."""
    out = []
    for a, b in windows:
        by, rq = window_totals(starts, ends, nbytes, a, b)
        secs = (b - a) / 1e9
        out.append((by / secs, rq / secs) if secs > 0 else (0.0, 0.0))
    return out


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by linear interpolation between closest ranks; 0 for no values."""
    if len(values) == 0:
        return 0.0
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside 0..100")
    return float(np.percentile(np.asarray(values, dtype=float), p))


def latency_summary(lat_ns: Sequence[int]) -> dict:
    """{'p50', 'p95', 'p99', 'mean'} in whole ns."""
    if len(lat_ns) == 0:
        return {"p50": 0, "p95": 0, "p99": 0, "mean": 0}
    return {"p50": round(percentile(lat_ns, 50)), "p95": round(percentile(lat_ns, 95)),
            "p99": round(percentile(lat_ns, 99)), "mean": round(float(np.mean(lat_ns)))}


def median(values: Sequence[float]) -> float:
    """A trial's rate: the middle window. A stall from something else on the host and the
    catch-up after it (a throttle spending the budget it saved) land in different windows and
    are both set aside."""
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else 0.0


def spread_pct(values: Sequence[float]) -> float:
    """(max - min) / median, in %; 0 for fewer than two values or a zero median."""
    if len(values) < 2:
        return 0.0
    m = median(values)
    return 100.0 * (max(values) - min(values)) / m if m > 0 else 0.0


def ratio_interval(xs: Sequence[float], ys: Sequence[float], level: float = 0.9, draws: int = 2000,
                   seed: int = 0) -> tuple[float, float] | None:
    """How far median(xs) / median(ys) moves with the runs' own noise: the central `level` of that
    ratio over `draws` resamplings of both sets of runs with replacement (a percentile bootstrap;
    `seed` fixed, so the same runs always print the same interval). None when either set has fewer
    than two runs or a resampled median of `ys` is not above 0. A bench whose arms spread by a
    fifth within themselves cannot tell 0.96 from 0.98: this says so beside its ratio."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(x) < 2 or len(y) < 2:
        return None
    _check_level(level)
    rng = np.random.default_rng(seed)
    mx = np.median(rng.choice(x, (draws, len(x))), axis=1)
    my = np.median(rng.choice(y, (draws, len(y))), axis=1)
    if (my <= 0).any():
        return None
    return _central(mx / my, level)


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"interval level {level} outside (0, 1)")


def _central(samples, level: float) -> tuple[float, float]:
    """The central `level` of a bootstrap's samples: (low, high) percentiles."""
    tail = 50.0 * (1.0 - level)
    lo, hi = np.percentile(samples, [tail, 100.0 - tail])
    return float(lo), float(hi)


def paired_ratio(pairs: Sequence[tuple[float, float]], level: float = 0.9, draws: int = 2000,
                 seed: int = 0) -> tuple[float, float, float] | None:
    """The median of x / y over (x, y) pairs run side by side (one arm and its reference in the same
    pass of a bench), with the central `level` of that median over `draws` resamplings of the pairs
    (a seeded percentile bootstrap): a drift of the machine between passes moves both runs of a
    pair and cancels, where `ratio_interval`, which takes every run as independent, counts it as
    noise. (ratio, low, high); None with fewer than two pairs or a y not above 0."""
    if len(pairs) < 2 or any(y <= 0 for _, y in pairs):
        return None
    _check_level(level)
    r = np.asarray([x / y for x, y in pairs], dtype=float)
    rng = np.random.default_rng(seed)
    lo, hi = _central(np.median(rng.choice(r, (draws, len(r))), axis=1), level)
    return float(np.median(r)), lo, hi


def best_lanes(by_lanes: dict[int, float]) -> int:
    """The lane count with the highest bytes/s (the lower count on a tie)."""
    if not by_lanes:
        raise ValueError("no lane results")
    return max(sorted(by_lanes), key=lambda k: (by_lanes[k], -k))


def knee_lanes(by_lanes: dict[int, float], fraction: float = KNEE_FRACTION) -> int:
    """The lowest lane count whose bytes/s is within (1 - fraction) of the best (docs/iobench.md)."""
    top = by_lanes[best_lanes(by_lanes)]
    return min(k for k, v in by_lanes.items() if v >= fraction * top)


def integer_weights(rates: Sequence[float], top: int = 10) -> tuple[int, ...]:
    """Bytes/s per drive -> integer weights 1..100 in proportion, the fastest `top` (10:5:5 style)."""
    if not rates or max(rates) <= 0:
        return tuple(1 for _ in rates)
    m = max(rates)
    return tuple(min(100, max(1, round(top * r / m))) for r in rates)
