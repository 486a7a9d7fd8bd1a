"""The measured tuner's logic (pure): which splits to measure, in what order, how many fit the
time budget, which one won, and the plan that records both predictions and measurements.

The measuring itself needs the real split reader, which lives above the planner
(engine_bridge.reader), so `engine-bridge autotune` does the reads and calls these functions with
its measure function and the host's clock; tests call them with a fake clock and fake
measurements. Nothing here reads a drive, sleeps or starts a thread.

- `candidates`: per phase, the model's best few distinct splits, then capability-proportional and
  equal weights (a split that is several of these is measured once, with all its roles).
- `abba_order`: rounds over all arms, forward then backward (A B C C B A A B C ...), so a drive
  warming up or a neighbour's load drifting during the run weighs on every arm alike.
- `run_trials`: walks that order until the planned rounds are done or the budget would be
  overrun: a trial starts only when the time used plus the longest trial so far (at first the
  nominal trial length) still fits the budget.
- `pick`: per phase, the arm with the best median over the rounds in which every arm of the phase
  was measured (a round cut short by the budget would favour the arms it reached); with no such
  round the model's choice stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Callable, Mapping, Sequence

from .model import PHASES, prediction_to_dict
from .plan import Phase, Plan

DEFAULT_BUDGET_S = 300.0        # the whole measured run, s
DEFAULT_TRIAL_S = 4.0           # one arm's trial, s
DEFAULT_TOP = 3                 # the model's best splits measured per phase


@dataclass(frozen=True)
class Arm:
    """One split to measure: a phase's weights, why it is measured, what the model predicts (bytes/s)."""
    phase: str
    weights: tuple[int, ...]
    roles: tuple[str, ...]          # 'model #1' (the solver's choice), 'model #2', 'capability', 'equal'
    predicted_Bps: float
    prediction: Mapping = field(default_factory=dict, compare=False)   # the model's prediction dict


@dataclass(frozen=True)
class Trial:
    arm: int                        # index into the arms
    round: int
    Bps: float                      # measured bytes/s
    start_s: float                  # since the run began
    seconds: float                  # how long the trial took, start to finish


@dataclass(frozen=True)
class Tally:
    trials: tuple[Trial, ...]
    rounds_planned: int
    stopped_by_budget: bool         # the budget ended the run before the planned rounds
    wall_s: float
    interrupted: bool = False       # `stop` ended the run (Ctrl-C) before the planned rounds


@dataclass(frozen=True)
class Pick:
    phase: str
    arm: int                        # index into the arms
    by: str                         # 'measured', or 'model' when no round of the phase completed
    rounds: tuple[int, ...]         # the complete rounds the medians are over
    medians: Mapping[int, float]    # arm -> median bytes/s over those rounds


def candidates(phase: str, ranked: Sequence[tuple[Sequence[int], Mapping]], capability: tuple[Sequence[int], Mapping],
               equal: tuple[Sequence[int], Mapping], top: int = DEFAULT_TOP) -> tuple[Arm, ...]:
    """The arms of one phase: the first `top` of `ranked` ((weights, prediction dict), the model's
    best first), then capability-proportional and equal weights; a split named twice is one arm."""
    arms: list[Arm] = []
    named = [(w, p, f"model #{i + 1}") for i, (w, p) in enumerate(list(ranked)[:max(1, top)])]
    named += [(capability[0], capability[1], "capability"), (equal[0], equal[1], "equal")]
    for w, p, role in named:
        w = tuple(int(x) for x in w)
        same = [i for i, a in enumerate(arms) if a.weights == w]
        if same:
            arms[same[0]] = replace(arms[same[0]], roles=arms[same[0]].roles + (role,))
        else:
            arms.append(Arm(phase, w, (role,), float(p.get("throughput_Bps", 0.0)), dict(p)))
    return tuple(arms)


def arms_for(solution: PhaseSolution, top: int = DEFAULT_TOP) -> tuple[Arm, ...]:
    """`candidates` from a solved phase (its choice, its alternatives, its baselines)."""
    ranked = [(solution.weights, prediction_to_dict(solution.prediction))]
    ranked += [(a.weights, prediction_to_dict(a)) for a in solution.alternatives]
    cap, eq = solution.capability, solution.equal
    return candidates(solution.phase, ranked, (cap.weights, prediction_to_dict(cap)), (eq.weights, prediction_to_dict(eq)), top)


def abba_order(n: int, rounds: int) -> list[tuple[int, int]]:
    """(round, arm) for `rounds` rounds over n arms: even rounds forward, odd rounds backward."""
    out = []
    for r in range(rounds):
        seq = range(n) if r % 2 == 0 else range(n - 1, -1, -1)
        out.extend((r, i) for i in seq)
    return out


def rounds_that_fit(arms: int, trial_s: float, budget_s: float) -> int:
    """Whole rounds of `arms` trials of `trial_s` within `budget_s`; rounded down to an even count
    (a forward and a backward round pair up) when two or more fit."""
    if arms <= 0 or trial_s <= 0 or budget_s <= 0:
        return 0
    n = int(math.floor(budget_s / (arms * trial_s) + 1e-9))
    return n - n % 2 if n >= 2 else n


def run_trials(arms: Sequence[Arm], measure: Callable[[Arm, float], float], clock: Callable[[], float],
               budget_s: float = DEFAULT_BUDGET_S, trial_s: float = DEFAULT_TRIAL_S,
               rounds: int | None = None, on_trial: Callable[[Trial, Arm], None] | None = None,
               stop: Callable[[], bool] | None = None, overhead_s: float = 0.0) -> Tally:
    """Measure the arms in ABBA order within the budget.

    measure(arm, trial_s) -> bytes/s (it does the reads); clock() -> s (monotonic). A trial's
    nominal length is `trial_s` plus `overhead_s` (what the measure spends besides its measured
    seconds: a rest and a warm-up). `rounds`: at most this many (default: as many as fit at the
    nominal length, at least one, so a budget too small for a whole round still measures what
    fits). A trial starts only when the time used plus the longest trial so far (at first the
    nominal length) fits the budget. `on_trial` sees each trial as it ends; `stop()` true ends the
    run before the next trial (what was measured is kept)."""
    nominal = trial_s + max(0.0, overhead_s)
    planned = rounds if rounds is not None else max(1, rounds_that_fit(len(arms), nominal, budget_s))
    start = clock()
    longest = nominal
    trials: list[Trial] = []
    stopped = interrupted = False
    for r, i in abba_order(len(arms), planned):
        if stop is not None and stop():
            interrupted = True
            break
        if clock() - start + longest > budget_s:
            stopped = True
            break
        t0 = clock()
        v = float(measure(arms[i], trial_s))
        t1 = clock()
        longest = max(longest, t1 - t0)
        trial = Trial(i, r, v, t0 - start, t1 - t0)
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial, arms[i])
    return Tally(tuple(trials), planned, stopped, clock() - start, interrupted)


def pick(arms: Sequence[Arm], tally: Tally) -> dict[str, Pick]:
    """Per phase with arms: the measured best over the phase's complete rounds, ties to the arm
    listed first (the model's order); the model's choice (the phase's first arm) when no round of
    the phase is complete."""
    out = {}
    for ph in PHASES:
        mine = [i for i, a in enumerate(arms) if a.phase == ph]
        if not mine:
            continue
        done: dict[int, dict[int, float]] = {}
        for t in tally.trials:
            if t.arm in mine:
                done.setdefault(t.round, {})[t.arm] = t.Bps
        complete = tuple(sorted(r for r, got in done.items() if len(got) == len(mine)))
        if not complete:
            out[ph] = Pick(ph, mine[0], "model", (), {})
            continue
        med = {i: float(median(done[r][i] for r in complete)) for i in mine}
        best = max(mine, key=lambda i: (med[i], -mine.index(i)))
        out[ph] = Pick(ph, best, "measured", complete, med)
    return out


def spread_pct(values: Sequence[float]) -> float:
    """(max - min) / median of repeated measurements, %."""
    vals = [v for v in values if v > 0]
    if len(vals) < 2:
        return 0.0
    return 100.0 * (max(vals) - min(vals)) / median(vals)


def phase_measured(arms: Sequence[Arm], tally: Tally, p: Pick) -> dict:
    """The `measured` block of a plan's phase: the picked arm's median and runs, how the pick was
    made, and every candidate's prediction beside its measurement."""
    runs = {i: [t.Bps for t in tally.trials if t.arm == i and (not p.rounds or t.round in p.rounds)]
            for i, a in enumerate(arms) if a.phase == p.phase}
    chosen = p.medians.get(p.arm) if p.medians else None
    pred = arms[p.arm].predicted_Bps
    return {
        "throughput_Bps": chosen,
        "runs_Bps": runs[p.arm],
        "n": len(runs[p.arm]),
        "spread_pct": spread_pct(runs[p.arm]),
        "error_pct": (100.0 * (pred / chosen - 1.0)) if chosen else None,
        "picked_by": p.by,
        "rounds": list(p.rounds),
        "candidates": [{"weights": list(arms[i].weights), "roles": list(arms[i].roles),
                        "predicted_Bps": arms[i].predicted_Bps,
                        "measured_Bps": p.medians.get(i) if p.medians else None,
                        "runs_Bps": r} for i, r in runs.items()],
    }


def measured_plan(plan: Plan, arms: Sequence[Arm], tally: Tally, picks: Mapping[str, Pick], settings: Mapping) -> Plan:
    """The solved plan with each phase at its picked weights: the model's prediction for them and
    what was measured; provenance 'autotune' keeps the settings, the order and every trial."""
    phases = {}
    for ph in PHASES:
        base = getattr(plan, ph)
        p = picks.get(ph)
        if p is None:
            phases[ph] = base
            continue
        arm = arms[p.arm]
        phases[ph] = Phase(arm.weights, dict(arm.prediction) or dict(base.predicted), phase_measured(arms, tally, p))
    prov = dict(plan.provenance)
    prov["autotune"] = {
        **dict(settings),
        "rounds_planned": tally.rounds_planned,
        "rounds_done": len({t.round for t in tally.trials}),
        "stopped_by_budget": tally.stopped_by_budget,
        "interrupted": tally.interrupted,
        "wall_s": tally.wall_s,
        "solved": {ph: list(getattr(plan, ph).weights) for ph in PHASES},
        "arms": [{"phase": a.phase, "weights": list(a.weights), "roles": list(a.roles)} for a in arms],
        "trials": [{"arm": t.arm, "round": t.round, "Bps": t.Bps, "start_s": t.start_s, "seconds": t.seconds}
                   for t in tally.trials],
    }
    return replace(plan, prefill=phases["prefill"], decode=phases["decode"], provenance=prov)
