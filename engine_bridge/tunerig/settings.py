"""What the chain measures when no result covers the drives (pure: plain data, so fleet's job
carries it across the cluster as is)."""

from __future__ import annotations

from dataclasses import dataclass

from .constants import BENCH_LANES, BENCH_PRESETS, BENCH_REPEAT, BENCH_SECONDS


@dataclass(frozen=True)
class BenchSettings:
    """The drive measurement made when no result covers the drives (iobench run's options)."""
    presets: tuple[str, ...] = BENCH_PRESETS
    lanes: tuple[int, ...] = BENCH_LANES
    seconds: float = BENCH_SECONDS
    repeat: int = BENCH_REPEAT
