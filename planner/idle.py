"""No silent idle drive: which sources a plan's split gives nothing in a phase, and why. Pure.

ds4 cuts each read on a 256 KiB grid: a source whose share of a read's blocks rounds to 0 reads
nothing in that phase, however fast it is. With a small model's component (557,056 B = 2 blocks
and a 32 KiB tail) three sources cannot all take part in a decode read. The solver picks the
fastest split either way; this module names the idle sources, says why, gives the fastest split
that uses every source (if any exists) and how it compares, and lets a split that uses every
source win a tie (within TIE_TOLERANCE of the fastest).

colibri moves whole experts, so one of its drives reads nothing in either phase when its cut is 0
of 256, when none of the model's (layer, expert) pairs hash into its cut (a small model), or when it
holds none of the model's shards (`colibri_idle`); its solver already prefers, among ties, a split
that gives every drive experts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from engines.ds4_argodrive import BLOCK

from .barrier import Link
from .constants import TIE_TOLERANCE
from .model import Background, Drive, Prediction, Workload, describe, evaluate, piece_bytes, prediction_to_dict
from .plan import Phase, Plan
from .solve import split_classes


@dataclass(frozen=True)
class IdleReport:
    phase: str
    idle: tuple[str, ...]              # sources the chosen split gives nothing
    read_bytes: int
    weights: tuple[int, ...]
    every_source: Prediction | None    # the fastest split in which every source reads, or None if none can
    chosen_Bps: float

    def text(self) -> str:
        blocks, tail = divmod(self.read_bytes, BLOCK)
        who = ", ".join(self.idle)
        s = (f"{self.phase}: {who} read{'s' if len(self.idle) == 1 else ''} nothing: a {self.read_bytes:,} B read is "
             f"{blocks} block{'s' if blocks != 1 else ''} of {BLOCK // 1024} KiB"
             f"{f' + {tail:,} B on the primary' if tail else ''}, and weights {':'.join(map(str, self.weights))} "
             f"give {'it' if len(self.idle) == 1 else 'them'} none")
        if self.every_source is None:
            return s + f"; no split of {blocks} blocks gives every source a piece"
        e = self.every_source
        ratio = e.throughput_Bps / self.chosen_Bps if self.chosen_Bps else 0.0
        return s + (f"; the fastest split using every source, {':'.join(map(str, e.weights))}, is predicted "
                    f"{(1 - ratio) * 100:.1f}% slower" if ratio < 1 else
                    f"; {':'.join(map(str, e.weights))} uses every source and is as fast")


def idle_names(predicted: dict) -> tuple[str, ...]:
    return tuple(s["name"] for s in predicted.get("sources", ()) if not s.get("bytes"))


def best_with_every_source(drives: Sequence[Drive], workload: Workload, backgrounds: Sequence[Background] = (),
                           links: Sequence[Link] = ()) -> Prediction | None:
    """The fastest split (smallest weights) of the workload's read in which every source reads bytes."""
    counts, smallest = split_classes(len(drives), workload.read_bytes)
    every = (piece_bytes(counts, workload) > 0).all(axis=1)
    if not every.any():
        return None
    counts, smallest = counts[every], smallest[every]
    ev = evaluate(drives, counts, workload, backgrounds, links)
    row = int(np.flatnonzero(ev.time <= float(ev.time.min()) * (1 + TIE_TOLERANCE))[0])
    return describe(ev, row, drives, tuple(int(x) for x in smallest[row]))


def check_idle(plan: Plan, drives: Sequence[Drive], workloads: dict[str, Workload],
               backgrounds: Sequence[Background] = (), links: Sequence[Link] = ()) -> tuple[Plan, list[IdleReport]]:
    """The plan with a split that uses every source in each phase where one ties the fastest,
    and a report for each phase that still leaves a source idle."""
    reports = []
    for ph, wl in workloads.items():
        phase: Phase = getattr(plan, ph)
        idle = idle_names(phase.predicted)
        if not idle:
            continue
        every = best_with_every_source(drives, wl, backgrounds, links)
        chosen = float(phase.predicted.get("throughput_Bps") or 0.0)
        if every is not None and every.throughput_Bps >= chosen * (1 - TIE_TOLERANCE):
            plan = replace(plan, **{ph: replace(phase, weights=every.weights, predicted=prediction_to_dict(every))})
            continue
        reports.append(IdleReport(ph, idle, wl.read_bytes, tuple(phase.weights), every, chosen))
    return plan, reports


# ---------------------------------------------------------------------------------------------
# colibri: whole experts by placement, so a drive idles in both phases or in neither

@dataclass(frozen=True)
class PlacementIdle:
    source: str
    why: str

    def text(self) -> str:
        return f"{self.source} serves no expert reads: {self.why}"


def colibri_idle(plan: Plan, grid: tuple[int, int], held: Sequence[tuple[int, int] | None] = ()) -> list[PlacementIdle]:
    """The drives of a colibri plan that read nothing: a cut of 0 of 256, a cut into which none of
    the model's `grid` (layers, experts) pairs hash, or a mirror holding none of the model's shards
    (`held`: per source (shards held, shards of the model), None where unknown)."""
    out = []
    weights = ":".join(map(str, plan.prefill.weights))
    layers, experts = grid
    for i, s in enumerate(plan.prefill.predicted.get("sources", ())):
        h = held[i] if i < len(held) else None
        if i and h is not None and h[0] == 0:
            out.append(PlacementIdle(s["name"], f"it holds none of the model's {h[1]} shards, so colibri loads no shard "
                                                "from it ('no usable shard ... skipped') and gives it no drive number; "
                                                "copy the model there (replicas sync) or leave it out of the rig"))
        elif not s.get("cut"):
            out.append(PlacementIdle(s["name"], f"weights {weights} give it a cut of 0 of 256 hash buckets"))
        elif not s.get("experts"):
            out.append(PlacementIdle(s["name"], f"weights {weights} give it {s['cut']} of 256 hash buckets, and none of "
                                                f"the model's {layers} x {experts} (layer, expert) pairs hash there"))
    return out
