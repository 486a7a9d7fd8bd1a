"""From a trial's raw runs to the result's numbers (pure): medians over the windows, the best
lane count and the knee, group totals, and the flag for a run the page cache may have answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from . import stats
from .constants import PLAUSIBLE_BW, PLAUSIBLE_MIN_LAT_NS
from .model import DriveSample
from .result import GroupResult, LaneResult, Latency, MemberResult, PresetResult

if TYPE_CHECKING:
    from .trials import StreamRun


def window_rate(run: "StreamRun") -> float:
    """A run's rate, bytes/s: the median over its windows."""
    return stats.median([w[0] for w in run.windows])


def suspect_cache(run: "StreamRun", not_cold: bool) -> bool:
    """The page cache may have answered: not cold, faster than any drive, or bytes the device
    never delivered."""
    if not_cold:
        return True
    if window_rate(run) > PLAUSIBLE_BW:
        return True
    p50 = stats.percentile(run.lat_ns, 50)
    if p50 > 0 and (p50 < PLAUSIBLE_MIN_LAT_NS or run.piece_bytes / (p50 / 1e9) > PLAUSIBLE_BW):
        return True
    if run.device_bytes is not None and run.app_bytes > 2 * run.device_bytes + (1 << 20):
        return True
    return False


def latency(lat_ns: Sequence[int]) -> Latency:
    return Latency(**stats.latency_summary(lat_ns))


def lane_result(run: "StreamRun", not_cold: bool) -> LaneResult:
    """One lane count of one drive alone: medians over the windows and their spread."""
    bws = tuple(w[0] for w in run.windows)
    return LaneResult(lanes=run.lanes, bw_bytes=stats.median(bws), iops=stats.median([w[1] for w in run.windows]),
                      lat_ns=latency(run.lat_ns), requests=run.requests, runs_bw=bws,
                      spread_pct=round(stats.spread_pct(bws), 3), suspect_cache=suspect_cache(run, not_cold))


def preset_result(preset: str, piece_bytes: int, lanes: Sequence[LaneResult], notes: Sequence[str] = ()) -> PresetResult:
    """Headline = the best lane count; knee = lowest lane count within 5 % of it."""
    by = {x.lanes: x.bw_bytes for x in lanes}
    best = stats.best_lanes(by)
    top = next(x for x in lanes if x.lanes == best)
    notes = list(notes)
    if any(x.suspect_cache for x in lanes):
        notes.append("served from the page cache or not cold: not a ceiling")
    return PresetResult(preset=preset, piece_bytes=piece_bytes, bw_bytes=top.bw_bytes, iops=top.iops, lat_ns=top.lat_ns,
                        lanes=tuple(sorted(lanes, key=lambda x: x.lanes)), best_lanes=best,
                        knee_lanes=stats.knee_lanes(by), spread_pct=top.spread_pct, runs_bw=top.runs_bw,
                        suspect_cache=any(x.suspect_cache for x in lanes), notes=tuple(notes))


def group_result(name: str, preset: str, runs: Sequence["StreamRun"], suspects: Sequence[bool]) -> GroupResult:
    """Drives read together: the group's rate is the median of its per-window totals (the same
    instants on every drive), never the sum of the members' medians."""
    windows = len(runs[0].windows)
    totals = tuple(sum(r.windows[w][0] for r in runs) for w in range(windows))
    members = tuple(MemberResult(name=r.name, lanes=r.lanes, piece_bytes=r.piece_bytes, bw_bytes=window_rate(r),
                                 iops=stats.median([w[1] for w in r.windows]), lat_ns=latency(r.lat_ns)) for r in runs)
    return GroupResult(name=name, preset=preset, drives=tuple(r.name for r in runs), bw_bytes=stats.median(totals),
                       members=members, runs_bw=totals, spread_pct=round(stats.spread_pct(totals), 3),
                       suspect_cache=any(suspects))


def model_samples(presets: Iterable[PresetResult]) -> list[DriveSample]:
    """What a drive model is fitted to: every lane count of every preset the cache did not answer."""
    return [DriveSample(p.piece_bytes, x.lanes, x.bw_bytes)
            for p in presets if not p.suspect_cache for x in p.lanes if x.bw_bytes > 0]
