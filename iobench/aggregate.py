"""From a trial's raw runs to the result's numbers (pure): medians over the windows and over
restarted trials, the best lane count and the knee, group totals, and the flag for a run the page
cache may have answered.

A lane count (or a group) may be measured in several restarted trials: each trial's rate is the
median of its windows, and the lane count's rate is the median of those, so one trial that drew
slow offsets or met a stall on the host moves nothing. Latency percentiles pool every request of
every trial.
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


def suspect_cache(run: "StreamRun", not_cold: bool, memory: bool = False) -> bool:
    """The page cache may have answered: not cold, faster than any drive, or bytes the device
    never delivered. A RAM member (`memory`: a copy in tmpfs, measured as the tier it is) is
    never suspect: RAM is what it is meant to answer from."""
    if memory:
        return False
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


def _pooled_lat(runs: Sequence["StreamRun"]) -> Latency:
    return latency([x for r in runs for x in r.lat_ns])


def lane_result(runs: Sequence["StreamRun"], not_cold: bool, memory: bool = False) -> LaneResult:
    """One lane count of one drive alone, from its restarted trials (one run each, in order):
    the median trial's rate, the spread over every window and over the trials."""
    if not runs:
        raise ValueError("lane_result: no runs")
    trial_bw = tuple(window_rate(r) for r in runs)
    bws = tuple(w[0] for r in runs for w in r.windows)
    return LaneResult(lanes=runs[0].lanes, bw_bytes=stats.median(trial_bw),
                      iops=stats.median([stats.median([w[1] for w in r.windows]) for r in runs]),
                      lat_ns=_pooled_lat(runs), requests=sum(r.requests for r in runs), runs_bw=bws,
                      spread_pct=round(stats.spread_pct(bws), 3),
                      suspect_cache=any(suspect_cache(r, not_cold, memory) for r in runs),
                      trials_bw=trial_bw if len(runs) > 1 else (),
                      trials_spread_pct=round(stats.spread_pct(trial_bw), 3))


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
                        suspect_cache=any(x.suspect_cache for x in lanes), notes=tuple(notes),
                        trials_bw=top.trials_bw, trials_spread_pct=top.trials_spread_pct)


def group_result(name: str, preset: str, trials: Sequence[Sequence["StreamRun"]], suspects: Sequence[bool]) -> GroupResult:
    """Drives read together, in one or more restarted trials (each: one run per member, members
    in the same order): a trial's rate is the median of its per-window totals (the same instants
    on every drive), never the sum of the members' medians; the group's is the median trial's.
    A member's numbers are the median over trials of its own."""
    if not trials or not trials[0]:
        raise ValueError("group_result: no runs")
    totals_by_trial = [tuple(sum(r.windows[w][0] for r in runs) for w in range(len(runs[0].windows))) for runs in trials]
    trial_bw = tuple(stats.median(t) for t in totals_by_trial)
    totals = tuple(x for t in totals_by_trial for x in t)
    members = []
    for i, first in enumerate(trials[0]):
        mine = [runs[i] for runs in trials]
        members.append(MemberResult(name=first.name, lanes=first.lanes, piece_bytes=first.piece_bytes,
                                    bw_bytes=stats.median([window_rate(r) for r in mine]),
                                    iops=stats.median([stats.median([w[1] for w in r.windows]) for r in mine]),
                                    lat_ns=_pooled_lat(mine)))
    return GroupResult(name=name, preset=preset, drives=tuple(r.name for r in trials[0]), bw_bytes=stats.median(trial_bw),
                       members=tuple(members), runs_bw=totals, spread_pct=round(stats.spread_pct(totals), 3),
                       suspect_cache=any(suspects), trials_bw=trial_bw if len(trials) > 1 else (),
                       trials_spread_pct=round(stats.spread_pct(trial_bw), 3))


def model_samples(presets: Iterable[PresetResult]) -> list[DriveSample]:
    """What a drive model is fitted to: every lane count of every preset the cache did not answer."""
    return [DriveSample(p.piece_bytes, x.lanes, x.bw_bytes)
            for p in presets if not p.suspect_cache for x in p.lanes if x.bw_bytes > 0]
