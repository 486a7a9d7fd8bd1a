"""The measured tuner's logic (pure): which candidates to measure, in what order, how many fit the
time budget, which one won, and the plan that records both predictions and measurements.

The measuring itself needs the real split reader, which lives above the planner
(engine_bridge.reader), so `engine-bridge autotune` executes the engine's read pattern and calls
these functions with its measure function and the host's clock; tests call them with a fake
clock and fake measurements. Nothing here reads a drive, sleeps or starts a thread, and nothing
here knows an engine by name: a candidate is a weight vector and a mode (the engine's switches on,
as the solver's predictions record them), and the solver's `Choice` says what to measure.

- `arms_for`: from a `planner.solve.Choice`, the candidates: the solver's pick and its best
  alternatives, capability-proportional and equal weights (a candidate that is several of these,
  or gives the same reads as another, is measured once, with all its roles). An engine with one
  weight vector per phase gets candidates per phase; an engine with one vector for both phases
  (`Engine.phase_weights` False) gets each candidate measured on both phases, and the pick's
  weights in each of the engine's other modes.
- `abba_order`: rounds over all arms, forward then backward (A B C C B A A B C ...), so a drive
  warming up or a neighbour's load drifting during the run weighs on every arm alike.
- `run_trials`: walks that order until the planned rounds are done or the budget would be
  overrun: a trial starts only when the time used plus the longest trial so far (at first the
  nominal trial length) still fits the budget.
- `pick`: per phase, the arm with the best median over the rounds in which every arm of the phase
  was measured (a round cut short by the budget would favour the arms it reached); with no such
  round the model's choice stands. Jointly (one vector for both phases), the candidate with the
  least of the solver's own objective on the measurements: the sum over phases of the phase's
  seconds (its predicted bytes over the measured rate) over the fastest candidate's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Callable, Mapping, Sequence

from .plan import Phase, Plan
from .solve import PHASES, Choice

DEFAULT_BUDGET_S = 300.0        # the whole measured run, s
DEFAULT_TRIAL_S = 4.0           # one arm's trial, s
DEFAULT_TOP = 3                 # the model's best splits measured per phase


@dataclass(frozen=True)
class Arm:
    """One candidate measured on one phase: its weights, why it is measured, what the model
    predicts (bytes/s) and its mode (the engine's switches on; empty: the default)."""
    phase: str
    weights: tuple[int, ...]
    roles: tuple[str, ...]          # 'model #1' (the solver's choice), 'model #2', 'capability', 'equal', 'mode NAME'
    predicted_Bps: float
    prediction: Mapping = field(default_factory=dict, compare=False)   # the model's prediction dict
    mode: frozenset[str] = frozenset()

    @property
    def label(self) -> str:
        """'6:3:2', or '6:3:2 a+b' with switches a and b in a mode."""
        return ":".join(map(str, self.weights)) + (f" {mode_name(self.mode)}" if self.mode else "")


def mode_name(mode: frozenset[str]) -> str:
    """A mode as the solver names it: its switches joined by '+', or 'default'."""
    return "+".join(sorted(mode)) or "default"


def mode_of(prediction: Mapping) -> frozenset[str]:
    """The mode a prediction dict was made in (the switches it records on, `planner.solve.prediction`)."""
    return frozenset(prediction.get("switches") or ())


@dataclass(frozen=True)
class ArmTrial:
    arm: int                        # index into the arms
    round: int
    Bps: float                      # measured bytes/s
    start_s: float                  # since the run began
    seconds: float                  # how long the trial took, start to finish


@dataclass(frozen=True)
class Tally:
    trials: tuple[ArmTrial, ...]
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
    objective: Mapping[int, float] = field(default_factory=dict)   # arm -> its candidate's joint objective


# A candidate before it becomes arms: (role, weights, mode, {phase: prediction dict}).
Named = tuple[str, tuple[int, ...], frozenset, Mapping[str, Mapping]]
# (phase, weights, mode) -> something equal for candidates that give the same reads
ReadsKey = Callable[[str, tuple[int, ...], frozenset], object]


def _merge(named: Sequence[Named], phases: Sequence[str], key: ReadsKey | None) -> list[list]:
    """[weights, mode, roles, predictions] per distinct candidate, first seen first: a candidate
    that gives the same reads as an earlier one (by `key` on every phase, else the same weights
    and mode) adds its role to it."""
    out: list[list] = []
    seen: dict = {}
    for role, w, mode, preds in named:
        w, mode = tuple(int(x) for x in w), frozenset(mode)
        k = tuple(key(ph, w, mode) for ph in phases) if key is not None else (w, mode)
        if k in seen:
            c = out[seen[k]]
            c[2] = c[2] + (role,)
            for ph, p in preds.items():
                c[3].setdefault(ph, p)
        else:
            seen[k] = len(out)
            out.append([w, mode, (role,), dict(preds)])
    return out


def _arms(phase: str, cands: Sequence[list]) -> tuple[Arm, ...]:
    out = []
    for w, mode, roles, preds in cands:
        p = dict(preds.get(phase) or {})
        out.append(Arm(phase, w, roles, float(p.get("throughput_Bps", 0.0)), p, mode))
    return tuple(out)


def candidates(phase: str, ranked: Sequence[tuple[Sequence[int], Mapping]], capability: tuple[Sequence[int], Mapping],
               equal: tuple[Sequence[int], Mapping], top: int = DEFAULT_TOP, key: ReadsKey | None = None) -> tuple[Arm, ...]:
    """The arms of one phase: the first `top` of `ranked` ((weights, prediction dict), the model's
    best first), then capability-proportional and equal weights; each in the mode its prediction
    records; a candidate named twice (or giving the same reads, `key`) is one arm."""
    named = [(f"model #{i + 1}", w, mode_of(p), {phase: p}) for i, (w, p) in enumerate(list(ranked)[:max(1, top)])]
    named += [(role, w, mode_of(p), {phase: p}) for role, (w, p) in (("capability", capability), ("equal", equal))]
    return _arms(phase, _merge(named, (phase,), key))


def joint_candidates(ranked: Sequence[tuple[Sequence[int], frozenset, Mapping[str, Mapping]]],
                     extra: Sequence[Named] = (), top: int = DEFAULT_TOP, phases: Sequence[str] = PHASES,
                     key: ReadsKey | None = None) -> tuple[Arm, ...]:
    """The arms of an engine with one weight vector for both phases: each candidate (weights,
    mode, {phase: prediction}) measured on every phase: the first `top` of `ranked` (the model's
    best first), then `extra` ((role, weights, mode, predictions): other modes, capability,
    equal). All arms of the first phase come first, each phase's in the same candidate order."""
    named = [(f"model #{i + 1}", w, m, p) for i, (w, m, p) in enumerate(list(ranked)[:max(1, top)])]
    cands = _merge(named + list(extra), phases, key)
    return tuple(a for ph in phases for a in _arms(ph, cands))


def arms_for(choice: Choice, top: int = DEFAULT_TOP, joint: bool | None = None, key: ReadsKey | None = None,
             predict: Callable[[str, tuple[int, ...], frozenset], Mapping] | None = None,
             phases: Sequence[str] = PHASES) -> tuple[Arm, ...]:
    """The arms from a solved `Choice` (its pick, alternatives and baselines).

    joint: one weight vector for both phases (default: whether the solver scored jointly,
    `choice.scores`). Then every candidate is measured on every phase, and with `predict(phase,
    weights, mode) -> prediction dict` (`planner.solve.predict` on the problem) the candidates
    also hold the pick's weights in each other mode the solver scored ('mode NAME'), and a
    phase's capability weights where they differ from the other phase's. key(phase, weights,
    mode): equal for candidates that give the same reads (measured once). phases: the phases to
    measure (a phase that reads nothing has nothing to measure)."""
    joint = bool(choice.scores) if joint is None else joint
    if not joint:
        out: tuple[Arm, ...] = ()
        for ph in phases:
            ranked = [(choice.weights[ph], choice.predicted[ph])]
            ranked += [(a["weights"], a) for a in choice.alternatives if a.get("phase") == ph]
            b = choice.baselines[ph]
            out += candidates(ph, ranked, (b["capability"]["weights"], b["capability"]),
                              (b["equal"]["weights"], b["equal"]), top, key)
        return out
    pick_w = tuple(choice.weights[phases[0]])
    ranked = [(pick_w, choice.mode, {ph: choice.predicted[ph] for ph in phases})]
    pairs: dict = {}
    for a in choice.alternatives:          # one entry per phase for each alternative, in the solver's order
        if a.get("phase") in phases:
            pairs.setdefault((tuple(a["weights"]), mode_of(a)), {})[a["phase"]] = a
    ranked += [(w, m, p) for (w, m), p in pairs.items()]

    def preds(w, m, known: Mapping[str, Mapping]) -> dict:
        out = {ph: known[ph] for ph in phases if ph in known}
        for ph in phases:
            if ph not in out and predict is not None:
                out[ph] = predict(ph, tuple(w), m)
        return out

    extra: list[Named] = []
    if predict is not None:
        for name in choice.scores:
            m = frozenset() if name == "default" else frozenset(name.split("+"))
            if m != choice.mode:
                extra.append((f"mode {name}", pick_w, m, preds(pick_w, m, {})))
    caps = {ph: tuple(choice.baselines[ph]["capability"]["weights"]) for ph in phases}
    if len(set(caps.values())) == 1:
        w = caps[phases[0]]
        extra.append(("capability", w, choice.mode, preds(w, choice.mode, {ph: choice.baselines[ph]["capability"]
                                                                           for ph in phases})))
    else:
        for ph in phases:
            extra.append((f"capability ({ph})", caps[ph], choice.mode,
                          preds(caps[ph], choice.mode, {ph: choice.baselines[ph]["capability"]})))
    eq = tuple(choice.baselines[phases[0]]["equal"]["weights"])
    extra.append(("equal", eq, choice.mode, preds(eq, choice.mode, {ph: choice.baselines[ph]["equal"] for ph in phases})))
    return joint_candidates(ranked, extra, top, phases, key)


def round_order(n: int, rnd: int) -> range:
    """The arms of round `rnd` over n arms, in order: even rounds forward, odd rounds backward."""
    return range(n) if rnd % 2 == 0 else range(n - 1, -1, -1)


def abba_order(n: int, rounds: int) -> list[tuple[int, int]]:
    """(round, arm) for `rounds` rounds over n arms: even rounds forward, odd rounds backward."""
    return [(r, i) for r in range(rounds) for i in round_order(n, r)]


def rounds_that_fit(arms: int, trial_s: float, budget_s: float) -> int:
    """Whole rounds of `arms` trials of `trial_s` within `budget_s`; rounded down to an even count
    (a forward and a backward round pair up) when two or more fit."""
    if arms <= 0 or trial_s <= 0 or budget_s <= 0:
        return 0
    n = int(math.floor(budget_s / (arms * trial_s) + 1e-9))
    return n - n % 2 if n >= 2 else n


def run_trials(arms: Sequence[Arm], measure: Callable[[Arm, float], float], clock: Callable[[], float],
               budget_s: float = DEFAULT_BUDGET_S, trial_s: float = DEFAULT_TRIAL_S,
               rounds: int | None = None, on_trial: Callable[[ArmTrial, Arm], None] | None = None,
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
    trials: list[ArmTrial] = []
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
        trial = ArmTrial(i, r, v, t0 - start, t1 - t0)
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial, arms[i])
    return Tally(tuple(trials), planned, stopped, clock() - start, interrupted)


def _complete(arms: Sequence[Arm], tally: Tally, mine: Sequence[int]) -> tuple[dict[int, dict[int, float]], tuple[int, ...]]:
    """(round -> arm -> Bps over `mine`, the rounds in which every arm of `mine` was measured)."""
    done: dict[int, dict[int, float]] = {}
    for t in tally.trials:
        if t.arm in mine:
            done.setdefault(t.round, {})[t.arm] = t.Bps
    return done, tuple(sorted(r for r, got in done.items() if len(got) == len(mine)))


def phase_bytes(arm: Arm) -> float:
    """The bytes the arm's phase reads as predicted (rate x seconds); 1 when the prediction does
    not say (then the joint objective compares rates alone)."""
    bps, s = float(arm.prediction.get("throughput_Bps") or 0.0), float(arm.prediction.get("seconds") or 0.0)
    return bps * s if bps > 0 and s > 0 else 1.0


def pick(arms: Sequence[Arm], tally: Tally, joint: bool = False) -> dict[str, Pick]:
    """Per phase with arms: the measured best over the phase's complete rounds, ties to the arm
    listed first (the model's order); the model's choice (the phase's first arm) when no round of
    the phase is complete. joint: one candidate for every phase (`joint_pick`)."""
    if joint:
        return joint_pick(arms, tally)
    out = {}
    for ph in PHASES:
        mine = [i for i, a in enumerate(arms) if a.phase == ph]
        if not mine:
            continue
        done, complete = _complete(arms, tally, mine)
        if not complete:
            out[ph] = Pick(ph, mine[0], "model", (), {})
            continue
        med = {i: float(median(done[r][i] for r in complete)) for i in mine}
        best = max(mine, key=lambda i: (med[i], -mine.index(i)))
        out[ph] = Pick(ph, best, "measured", complete, med)
    return out


def joint_pick(arms: Sequence[Arm], tally: Tally) -> dict[str, Pick]:
    """One candidate (weights and mode) for every phase, by the solver's objective on the
    measurements: the sum over phases of (the phase's predicted bytes / its measured median) over
    the least such seconds of any candidate in that phase; the least sum wins, ties to the
    candidate listed first. Medians are over the rounds in which every arm was measured; with no
    such round the model's choice (each phase's first arm) stands."""
    phases = [ph for ph in PHASES if any(a.phase == ph for a in arms)]
    if not phases:
        return {}
    every = list(range(len(arms)))
    done, complete = _complete(arms, tally, every)
    by_phase = {ph: [i for i in every if arms[i].phase == ph] for ph in phases}
    if not complete:
        return {ph: Pick(ph, by_phase[ph][0], "model", (), {}) for ph in phases}
    med = {i: float(median(done[r][i] for r in complete)) for i in every}
    keys = list(dict.fromkeys((arms[i].weights, arms[i].mode) for i in every))
    arm_of = {(ph, arms[i].weights, arms[i].mode): i for ph in phases for i in by_phase[ph]}
    secs = {i: (phase_bytes(arms[i]) / med[i] if med[i] > 0 else math.inf) for i in every}
    fastest = {ph: min(secs[i] for i in by_phase[ph]) for ph in phases}

    def objective(k) -> float:
        total = 0.0
        for ph in phases:
            i = arm_of.get((ph,) + k)
            total += math.inf if i is None or not math.isfinite(secs[i]) else secs[i] / fastest[ph]
        return total

    score = {k: objective(k) for k in keys}
    best = min(keys, key=lambda k: (score[k], keys.index(k)))
    obj = {i: score[(arms[i].weights, arms[i].mode)] for i in every}
    return {ph: Pick(ph, arm_of[(ph,) + best], "measured", complete, {i: med[i] for i in by_phase[ph]},
                     {i: obj[i] for i in by_phase[ph]}) for ph in phases}


def spread_pct(values: Sequence[float]) -> float:
    """(max - min) / median of repeated measurements, %."""
    vals = [v for v in values if v > 0]
    if len(vals) < 2:
        return 0.0
    return 100.0 * (max(vals) - min(vals)) / median(vals)


def phase_measured(arms: Sequence[Arm], tally: Tally, p: Pick) -> dict:
    """The `measured` block of a plan's phase: the picked arm's median and runs, how the pick was
    made, and every candidate's prediction beside its measurement (jointly picked: with its
    candidate's objective)."""
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
        "candidates": [{"weights": list(arms[i].weights), "mode": sorted(arms[i].mode), "roles": list(arms[i].roles),
                        "predicted_Bps": arms[i].predicted_Bps,
                        "measured_Bps": p.medians.get(i) if p.medians else None,
                        "runs_Bps": r, **({"objective": p.objective[i]} if i in p.objective else {})}
                       for i, r in runs.items()],
    }


def measured_plan(plan: Plan, arms: Sequence[Arm], tally: Tally, picks: Mapping[str, Pick], settings: Mapping) -> Plan:
    """The solved plan with each phase at its picked weights (and the engine's switches at the
    picked mode): the model's prediction for them and what was measured; provenance 'autotune'
    keeps the settings, the order and every trial. A phase with no arms keeps the solved weights."""
    phases = {}
    for ph in PHASES:
        base = getattr(plan, ph)
        p = picks.get(ph)
        if p is None:
            phases[ph] = base
            continue
        arm = arms[p.arm]
        phases[ph] = Phase(arm.weights, dict(arm.prediction) or dict(base.predicted), phase_measured(arms, tally, p))
    modes = {arms[p.arm].mode for p in picks.values()}
    switches = {"switches": modes.pop()} if len(modes) == 1 else {}
    prov = dict(plan.provenance)
    prov["autotune"] = {
        **dict(settings),
        "rounds_planned": tally.rounds_planned,
        "rounds_done": len({t.round for t in tally.trials}),
        "stopped_by_budget": tally.stopped_by_budget,
        "interrupted": tally.interrupted,
        "wall_s": tally.wall_s,
        "solved": {ph: list(getattr(plan, ph).weights) for ph in PHASES},
        "solved_mode": sorted(plan.switches),
        "arms": [{"phase": a.phase, "weights": list(a.weights), "mode": sorted(a.mode), "roles": list(a.roles)}
                 for a in arms],
        "trials": [{"arm": t.arm, "round": t.round, "Bps": t.Bps, "start_s": t.start_s, "seconds": t.seconds}
                   for t in tally.trials],
    }
    return replace(plan, prefill=phases["prefill"], decode=phases["decode"], provenance=prov, **switches)
