"""The tuner's state and its transitions (pure: no disk, no threads, no UI).

A `TunerState` holds the rig's sources, the problem a plan is solved for (`planner.solve.Problem`:
the engine, the model's geometry and steps, the drives, other work on them), the weights being
tuned per phase and the engine's switches (`mode`), the solved plan's to compare with and reset to,
and everything the screen shows, already computed by the planner: the one pricing's prediction of
each phase (`planner.solve.prediction` through a `Pricer`). Nothing here knows which engine it
tunes: the engine says which weights it accepts (its range), whether one vector serves both phases
(`Engine.phase_weights`) and which switch settings make a difference on the model (`Engine.modes`).
Every key press becomes one function here returning a new state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from core.errors import UsageError
from engines.split import check_weights

from ..plan import Phase, Plan, Source
from ..solve import PHASES, Pricer, Problem, capability_weights, model_record, prediction


@dataclass(frozen=True)
class MeasuredArm:
    """One arm of the newest harness run (rig/runs/*/results.json): its weights and medians."""
    run: str                          # the run folder's name
    arm: str
    weights: Mapping[str, tuple[int, ...]]   # phase -> weights the arm ran
    n: int                            # passing rows behind the medians
    tps: Mapping[str, float | None]   # phase -> median tok/s (prefill_tps, gen_steady_tps)


@dataclass(frozen=True)
class TrialRun:
    """One short measured trial run from the tuner (`m`): a phase's weights and switches and what
    the split reader delivered, bytes/s."""
    phase: str
    weights: tuple[int, ...]
    Bps: float
    mode: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PhaseView:
    """One phase at some weights and switches: the one pricing's prediction (the plan's
    `predicted` dict: per source its share, bytes, pieces, experts and busy time per layer, who
    lands last)."""
    weights: tuple[int, ...]
    mode: frozenset[str]
    prediction: dict


@dataclass(frozen=True)
class Solution:
    """What a solve chose: weights per phase and the switches."""
    weights: Mapping[str, tuple[int, ...]]
    mode: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TunerState:
    sources: tuple[Source, ...]                         # primary first
    problem: Problem                                    # engine, geometry, steps, drives, other work
    views: Mapping[str, PhaseView]                      # phase -> current weights and prediction
    mode: frozenset[str] = frozenset()                  # the engine's switches on screen (both phases)
    solved: Mapping[str, PhaseView] | None = None       # phase -> the plan's; None while solving
    solved_mode: frozenset[str] = frozenset()
    phase: str = "prefill"                              # the phase on screen
    cursor: int = 0                                     # the selected source
    plan_name: str = ""                                 # the plan reset goes back to
    provenance: Mapping = field(default_factory=dict)   # where the drive models came from
    geometry: Mapping = field(default_factory=dict)     # the plan's `geometry` block (the model tuned for)
    workload: Mapping = field(default_factory=dict)     # the plan's `workload` block
    measured: tuple[MeasuredArm, ...] = ()
    trials: tuple[TrialRun, ...] = ()                   # measured here with `m`, oldest first
    measuring: bool = False                             # a trial is running
    message: str = ""
    pricer: Pricer | None = field(default=None, compare=False, repr=False)   # memo of the problem's prices

    @property
    def engine(self):
        return self.problem.engine

    @property
    def drives(self):
        return self.problem.drives

    @property
    def modes(self) -> tuple[frozenset[str], ...]:
        """The switch settings that make a difference on this model, the engine's default first."""
        return tuple(self.problem.engine.modes(self.problem.geometry))

    def weights(self, phase: str | None = None) -> tuple[int, ...]:
        return self.views[phase or self.phase].weights

    def price(self, phase: str, weights: Sequence[int], mode: frozenset[str]) -> dict:
        """The prediction of one phase at these weights and switches (priced once per state line)."""
        pricer = self.pricer or Pricer(self.problem)
        w = tuple(int(x) for x in weights)
        return prediction(pricer.price(phase, w, mode), w, mode, self.problem.drives)


def mode_text(mode: frozenset[str]) -> str:
    return "+".join(sorted(mode)) or "none"


def _check(problem: Problem, weights: Sequence[int]) -> tuple[int, ...]:
    w = check_weights(tuple(int(x) for x in weights), problem.engine.name)
    if len(w) != len(problem.drives):
        raise UsageError(f"weights {':'.join(map(str, w))}: {len(w)} weights for {len(problem.drives)} sources")
    return w


def _view(state: TunerState, phase: str, weights: Sequence[int], mode: frozenset[str]) -> PhaseView:
    w = _check(state.problem, weights)
    return PhaseView(w, mode, state.price(phase, w, mode))


def _views(state: TunerState, weights: Mapping[str, Sequence[int]], mode: frozenset[str]) -> dict[str, PhaseView]:
    return {ph: _view(state, ph, weights[ph], mode) for ph in PHASES}


def opening_weights(problem: Problem, pricer: Pricer | None = None) -> dict[str, tuple[int, ...]]:
    """Weights before a solve: each drive's rate alone at the reads an equal split gives it, on a
    1..10 scale so +-1 moves the split; one vector for both phases when the engine has one."""
    pricer = pricer or Pricer(problem)
    if not problem.engine.phase_weights:
        w = capability_weights(pricer, "decode", scale=10)
        return {ph: w for ph in PHASES}
    return {ph: capability_weights(pricer, ph, scale=10) for ph in PHASES}


def new_state(sources: Sequence[Source], problem: Problem, solution: Solution | None = None, *,
              plan_name: str = "", provenance: Mapping | None = None, geometry: Mapping | None = None,
              workload: Mapping | None = None, measured: Sequence[MeasuredArm] = (), message: str = "") -> TunerState:
    """The opening state: the solution's weights and switches (a loaded plan), else capability
    weights with the engine's default switches, still to be solved; the prefill phase, the primary
    selected."""
    if len(sources) != len(problem.drives):
        raise ValueError(f"{len(sources)} sources, {len(problem.drives)} drive models")
    pricer = Pricer(problem)
    base = TunerState(sources=tuple(sources), problem=problem, views={}, plan_name=plan_name,
                      provenance=dict(provenance or {}), geometry=dict(geometry or {}), workload=dict(workload or {}),
                      measured=tuple(measured), message=message, pricer=pricer)
    if solution is not None:
        views = _views(base, solution.weights, solution.mode)
        return replace(base, views=views, mode=solution.mode, solved=dict(views), solved_mode=solution.mode)
    return replace(base, views=_views(base, opening_weights(problem, pricer), frozenset()))


def set_weights(state: TunerState, weights: Sequence[int], phase: str | None = None) -> TunerState:
    """The phase (default: the one on screen) at these weights, predicted again; an engine with one
    weight vector for both phases moves both."""
    ph = phase or state.phase
    phases = (ph,) if state.engine.phase_weights else PHASES
    views = {**state.views, **{p: _view(state, p, weights, state.mode) for p in phases}}
    return replace(state, views=views, message="")


def nudge(state: TunerState, source: int, delta: int, phase: str | None = None) -> TunerState:
    """Move one source's weight by `delta`, kept within the weights the engine accepts."""
    ph = phase or state.phase
    e = state.engine
    w = list(state.weights(ph))
    if not 0 <= source < len(w):
        raise ValueError(f"source {source}: the rig has {len(w)} sources")
    new = min(e.weight_max, max(e.weight_min, w[source] + delta))
    if new == w[source]:
        return replace(state, message=f"{state.sources[source].name}: weight stays within {e.weight_min}..{e.weight_max}")
    w[source] = new
    return set_weights(state, w, ph)


def next_mode(state: TunerState) -> TunerState:
    """The engine's next switch setting (of those that make a difference on this model), both
    phases predicted again; an engine without switches says so."""
    modes = state.modes
    if len(modes) < 2:
        return replace(state, message=f"{state.engine.name} has no switches that change its reads of this model")
    i = modes.index(state.mode) if state.mode in modes else -1
    mode = modes[(i + 1) % len(modes)]
    views = _views(state, {ph: state.weights(ph) for ph in PHASES}, mode)
    return replace(state, views=views, mode=mode, message=f"switches: {mode_text(mode)}")


def move_cursor(state: TunerState, delta: int) -> TunerState:
    return replace(state, cursor=(state.cursor + delta) % len(state.sources))


def switch_phase(state: TunerState) -> TunerState:
    i = PHASES.index(state.phase)
    return replace(state, phase=PHASES[(i + 1) % len(PHASES)], message="")


def reset(state: TunerState) -> TunerState:
    """The phase on screen back to the solved plan's weights (both phases, for an engine with one
    vector for both) and switches; a phase left as it was is priced again at those switches."""
    if state.solved is None:
        return replace(state, message="no solved plan yet: still solving")
    phases = (state.phase,) if state.engine.phase_weights else PHASES
    mode = state.solved_mode
    views = {ph: state.solved[ph] if ph in phases else
             (state.views[ph] if state.views[ph].mode == mode else _view(state, ph, state.weights(ph), mode))
             for ph in PHASES}
    what = ", ".join(f"{ph} {':'.join(map(str, state.solved[ph].weights))}" for ph in phases)
    sw = f", switches {mode_text(mode)}" if len(state.modes) > 1 else ""
    return replace(state, views=views, mode=mode, message=f"reset to {what}{sw}")


def with_solution(state: TunerState, solution: Solution, plan_name: str = "") -> TunerState:
    """A solve finished: keep its weights and switches to compare with and reset to. Before the
    user changed anything, the screen moves to them; otherwise phases not yet touched move to the
    solved weights and the user's switches and changed phases stay."""
    solved_views = _views(state, solution.weights, solution.mode)
    opening = opening_weights(state.problem, state.pricer)
    untouched = {ph for ph in PHASES if state.solved is None and state.weights(ph) == opening[ph]}
    if untouched == set(PHASES) and state.mode == frozenset():
        views, mode = dict(solved_views), solution.mode
    else:
        mode = state.mode
        views = {ph: _view(state, ph, solution.weights[ph], mode) if ph in untouched else state.views[ph] for ph in PHASES}
    return replace(state, views=views, mode=mode, solved=solved_views, solved_mode=solution.mode,
                   plan_name=plan_name or state.plan_name,
                   message="solved: " + ", ".join(f"{ph} {':'.join(map(str, solution.weights[ph]))}" for ph in PHASES)
                   + (f", switches {mode_text(solution.mode)}" if len(state.modes) > 1 else ""))


def with_message(state: TunerState, text: str) -> TunerState:
    return replace(state, message=text)


def changed(state: TunerState) -> tuple[str, ...]:
    """Phases whose weights (or switches) differ from the solved plan's."""
    if state.solved is None:
        return PHASES
    return tuple(ph for ph in PHASES if state.weights(ph) != state.solved[ph].weights or state.mode != state.solved_mode)


def gain_over_solved(state: TunerState, phase: str | None = None) -> float | None:
    """How much faster the phase is predicted at the current weights and switches than at the
    solved plan's: its seconds over these (1.0 = the same, above 1 faster)."""
    if state.solved is None:
        return None
    ph = phase or state.phase
    now, then = state.views[ph].prediction["seconds"], state.solved[ph].prediction["seconds"]
    if now <= 0:
        return 1.0 if then <= 0 else float("inf")
    return then / now


def trials_measured(state: TunerState, phase: str) -> dict:
    """The plan's `measured` block for a phase from the trials run here (the same keys
    `engine-bridge autotune` writes; picked by hand); empty when the saved weights were not measured."""
    rows = trial_summary(state, phase)
    here = (state.weights(phase), state.mode)
    mine = [r for r in rows if (r[0], r[1]) == here]
    if not mine:
        return {}
    _, _, med, n, pred = mine[0]
    runs = [t.Bps for t in state.trials if (t.phase, t.weights, t.mode) == (phase, *here)]
    return {"throughput_Bps": med, "runs_Bps": runs, "n": n,
            "spread_pct": 100.0 * (max(runs) - min(runs)) / med if n > 1 and med > 0 else 0.0,
            "error_pct": 100.0 * (pred / med - 1.0) if med > 0 else None, "picked_by": "hand", "rounds": [],
            "candidates": [{"weights": list(w), "switches": sorted(m), "roles": ["tuner"], "predicted_Bps": p,
                            "measured_Bps": med_w,
                            "runs_Bps": [t.Bps for t in state.trials if (t.phase, t.weights, t.mode) == (phase, w, m)]}
                           for w, m, med_w, _, p in rows]}


def tuned_plan(state: TunerState, created: str = "") -> Plan:
    """The current weights and switches as a plan file's contents (the same contract `planner
    solve` writes), with the solved plan's prediction as the baseline and provenance saying it was
    tuned by hand."""
    phases = {ph: Phase(state.weights(ph), state.views[ph].prediction, trials_measured(state, ph)) for ph in PHASES}
    baselines = {}
    if state.solved is not None:
        baselines = {ph: {"solved": state.solved[ph].prediction, "gain_over_solved": gain_over_solved(state, ph)}
                     for ph in PHASES}
    prov = dict(state.provenance)
    prov["model"] = model_record(state.problem)
    prov["tuned"] = {"by": "hand", "tool": "planner tune", "from_plan": state.plan_name or None,
                     "solved": {ph: list(state.solved[ph].weights) for ph in PHASES} if state.solved else None,
                     "solved_switches": sorted(state.solved_mode) if state.solved else None,
                     "changed": list(changed(state))}
    return Plan(sources=state.sources, prefill=phases["prefill"], decode=phases["decode"], engine=state.engine.name,
                created=created, baselines=baselines, alternatives=(), provenance=prov, geometry=dict(state.geometry),
                workload=dict(state.workload), switches=state.mode)


def start_trial(state: TunerState) -> TunerState:
    """A measured trial of the weights (and switches) on screen is starting."""
    sw = f" ({mode_text(state.mode)})" if state.mode else ""
    return replace(state, measuring=True, message=f"measuring {state.phase} {':'.join(map(str, state.weights()))}{sw} …")


def with_trial(state: TunerState, phase: str, weights: Sequence[int], Bps: float | None, error: str = "",
               mode: frozenset[str] | None = None) -> TunerState:
    """A trial finished (`Bps`) or failed (`error`): keep it beside the predictions. `mode`: the
    switches it ran with (default: those on screen)."""
    if Bps is None:
        return replace(state, measuring=False, message=error or "measuring failed")
    run = TrialRun(phase, tuple(int(x) for x in weights), float(Bps), state.mode if mode is None else frozenset(mode))
    return replace(state, measuring=False, trials=state.trials + (run,),
                   message=f"measured {phase} {':'.join(map(str, run.weights))}")


def trial_summary(state: TunerState, phase: str | None = None
                  ) -> list[tuple[tuple[int, ...], frozenset[str], float, int, float]]:
    """Per weights and switches measured in the phase (in the order first measured): (weights,
    switches, median bytes/s, trials, the pricing's prediction for them, bytes/s)."""
    ph = phase or state.phase
    runs: dict[tuple[tuple[int, ...], frozenset[str]], list[float]] = {}
    for t in state.trials:
        if t.phase == ph:
            runs.setdefault((t.weights, t.mode), []).append(t.Bps)
    out = []
    for (w, m), vals in runs.items():
        vals = sorted(vals)
        mid = len(vals) // 2
        med = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
        out.append((w, m, med, len(vals), state.price(ph, w, m)["throughput_Bps"]))
    return out
