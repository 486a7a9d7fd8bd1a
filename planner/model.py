"""The drives as the pricing sees them (pure): a drive's throughput curve, the curve corrected by
what iobench measured, the drive itself, and other work it does besides the engine's reads.

A curve has the two methods iobench's `DriveModel` has: `request_time(size_bytes, in_flight) -> s`
and `throughput(size_bytes, in_flight) -> bytes/s`. The one pricing (`planner.pricing`) asks it
only about the piece sizes and reads in flight an engine's pattern gives each drive, so any curve
object works.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .barrier import LatencyShape


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
        w = (max(0.0, 1.0 - abs(math.log2(size / size_bytes)) / self.reach)
             * max(0.0, 1.0 - abs(math.log2(lanes / k)) / self.reach))
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
    """One source as the pricing sees it: a label, its fitted curve and the shape of its decode
    request times around their mean (None: no spread measured, the mean alone)."""
    name: str
    curve: DriveCurve
    tail: LatencyShape | None = None


@dataclass(frozen=True)
class Background:
    """Work a source does besides the engine's reads.

    kind 'engram': the Engram rows of each decoded token (ENGRAM_READS_PER_TOKEN reads of
    ENGRAM_READ_BYTES, one at a time), spread over the token's layers; decode only.
    kind 'busy': the source is busy `value` (0..1) of the time with other work; both phases.
    """
    source: int
    kind: str
    value: float = 0.0


def busy_factor(drives: Sequence[Drive], backgrounds: Sequence[Background]) -> np.ndarray:
    """Time stretch per source from 'busy' background work (n,), >= 1."""
    f = np.ones(len(drives))
    for bg in backgrounds:
        if bg.kind == "busy":
            f[bg.source] /= max(1e-9, 1.0 - bg.value)
    return f
