"""The tuner's state and its transitions (pure: no disk, no threads, no UI).

A `TunerState` holds the rig's sources and drive models, the weights being tuned per phase, the
solved plan's weights to compare with and reset to, and everything the screen shows, already
computed by the planner: the split of one real read (`split.split_read`) and the model's
prediction (`solve.predict`). Every key press becomes one function here returning a new state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from engines.ds4_argodrive import WEIGHT_MAX, WEIGHT_MIN
from engines.registry import DEFAULT_ENGINE
from engines.split import Piece, split_read

from ..barrier import Link
from ..model import (
    PHASES,
    Background,
    Drive,
    Prediction,
    Workload,
    capability_weights,
    decode_workload,
    prediction_to_dict,
    prefill_workload,
)
from ..plan import Phase, Plan, Source
from ..solve import predict
from ..workload import traffic_kw, traffic_of


@dataclass(frozen=True)
class Measured:
    """One arm of the newest harness run (rig/runs/*/results.json): its weights and medians."""
    run: str                          # the run folder's name
    arm: str
    weights: Mapping[str, tuple[int, ...]]   # phase -> weights the arm ran
    n: int                            # passing rows behind the medians
    tps: Mapping[str, float | None]   # phase -> median tok/s (prefill_tps, gen_steady_tps)


@dataclass(frozen=True)
class TrialRun:
    """One short measured trial run from the tuner (`m`): a phase's weights and what the split
    reader delivered, bytes/s."""
    phase: str
    weights: tuple[int, ...]
    Bps: float


@dataclass(frozen=True)
class PhaseView:
    """What one phase looks like at some weights: the split of one read and the prediction."""
    weights: tuple[int, ...]
    pieces: tuple[Piece, ...]
    prediction: Prediction


@dataclass(frozen=True)
class TunerState:
    sources: tuple[Source, ...]                         # primary first
    drives: tuple[Drive, ...]                           # the same order
    workloads: Mapping[str, Workload]                   # phase -> read shape
    views: Mapping[str, PhaseView]                      # phase -> current weights, split, prediction
    solved: Mapping[str, PhaseView] | None = None       # phase -> the plan's; None while solving
    backgrounds: tuple[Background, ...] = ()
    engine: str = DEFAULT_ENGINE
    links: tuple[Link, ...] = ()                        # drives sharing an uplink (from grouped runs)
    phase: str = "prefill"                              # the phase on screen
    cursor: int = 0                                     # the selected source
    plan_name: str = ""                                 # the plan reset goes back to
    provenance: Mapping = field(default_factory=dict)   # where the drive models came from
    measured: tuple[Measured, ...] = ()
    trials: tuple[TrialRun, ...] = ()                   # measured here with `m`, oldest first
    measuring: bool = False                             # a trial is running
    message: str = ""

    def weights(self, phase: str | None = None) -> tuple[int, ...]:
        return self.views[phase or self.phase].weights


def phase_view(drives: Sequence[Drive], weights: Sequence[int], workload: Workload,
               backgrounds: Sequence[Background] = (), engine: str = DEFAULT_ENGINE,
               links: Sequence[Link] = ()) -> PhaseView:
    """Split one read of the phase's real size and predict it (weights are checked)."""
    w = tuple(int(x) for x in weights)
    return PhaseView(w, split_read(0, workload.read_bytes, w, engine),
                     predict(drives, w, workload, backgrounds, engine, links))


def _views(state_like: dict, weights: Mapping[str, Sequence[int]]) -> dict[str, PhaseView]:
    return {ph: phase_view(state_like["drives"], weights[ph], state_like["workloads"][ph],
                           state_like["backgrounds"], state_like["engine"], state_like.get("links", ())) for ph in PHASES}


def _opening(drives: Sequence[Drive], workloads: Mapping[str, Workload]) -> dict[str, tuple[int, ...]]:
    """Weights before a solve: each drive's rate alone, on a 1..10 scale so +-1 moves the split."""
    return {ph: capability_weights(drives, workloads[ph], scale=10) for ph in PHASES}


def new_state(sources: Sequence[Source], drives: Sequence[Drive], solved: Mapping[str, Sequence[int]] | None = None,
              workloads: Mapping[str, Workload] | None = None, backgrounds: Sequence[Background] = (),
              engine: str = DEFAULT_ENGINE, plan_name: str = "", provenance: Mapping | None = None,
              measured: Sequence[Measured] = (), links: Sequence[Link] = ()) -> TunerState:
    """The opening state: the solved weights (or, while a solve is still running, weights in
    proportion to what each drive delivers alone) on the prefill phase, the primary selected."""
    if not drives or len(sources) != len(drives):
        raise ValueError(f"{len(sources)} sources, {len(drives)} drive models")
    wl = dict(workloads or {"prefill": prefill_workload(), "decode": decode_workload()})
    ctx = {"drives": tuple(drives), "workloads": wl, "backgrounds": tuple(backgrounds), "engine": engine,
           "links": tuple(links)}
    start = solved or _opening(ctx["drives"], wl)
    views = _views(ctx, start)
    return TunerState(sources=tuple(sources), drives=ctx["drives"], workloads=wl, views=views,
                      solved=dict(views) if solved else None, backgrounds=ctx["backgrounds"], engine=engine,
                      links=ctx["links"], plan_name=plan_name, provenance=dict(provenance or {}), measured=tuple(measured))


def set_weights(state: TunerState, weights: Sequence[int], phase: str | None = None) -> TunerState:
    """The phase (default: the one on screen) at these weights, split and predicted again."""
    ph = phase or state.phase
    view = phase_view(state.drives, weights, state.workloads[ph], state.backgrounds, state.engine, state.links)
    return replace(state, views={**state.views, ph: view}, message="")


def nudge(state: TunerState, source: int, delta: int, phase: str | None = None) -> TunerState:
    """Move one source's weight by `delta`, kept within the engine's 1..100."""
    ph = phase or state.phase
    w = list(state.weights(ph))
    if not 0 <= source < len(w):
        raise ValueError(f"source {source}: the rig has {len(w)} sources")
    new = min(WEIGHT_MAX, max(WEIGHT_MIN, w[source] + delta))
    if new == w[source]:
        return replace(state, message=f"{state.sources[source].name}: weight stays within {WEIGHT_MIN}..{WEIGHT_MAX}")
    w[source] = new
    return set_weights(state, w, ph)


def move_cursor(state: TunerState, delta: int) -> TunerState:
    return replace(state, cursor=(state.cursor + delta) % len(state.sources))


def switch_phase(state: TunerState) -> TunerState:
    i = PHASES.index(state.phase)
    return replace(state, phase=PHASES[(i + 1) % len(PHASES)], message="")


def reset(state: TunerState) -> TunerState:
    """The phase on screen back to the solved plan's weights."""
    if state.solved is None:
        return replace(state, message="no solved plan yet: still solving")
    ph = state.phase
    return replace(state, views={**state.views, ph: state.solved[ph]},
                   message=f"{ph} reset to {':'.join(map(str, state.solved[ph].weights))}")


def with_solution(state: TunerState, weights: Mapping[str, Sequence[int]], plan_name: str = "") -> TunerState:
    """A solve finished: keep its weights to compare with and reset to; phases not yet touched
    move to them, phases the user already changed keep the user's weights."""
    ctx = {"drives": state.drives, "workloads": state.workloads, "backgrounds": state.backgrounds, "engine": state.engine,
           "links": state.links}
    solved = _views(ctx, weights)
    opening = _opening(state.drives, state.workloads)
    views = {ph: solved[ph] if state.solved is None and state.weights(ph) == opening[ph] else state.views[ph]
             for ph in PHASES}
    return replace(state, views=views, solved=solved, plan_name=plan_name or state.plan_name,
                   message="solved: " + ", ".join(f"{ph} {':'.join(map(str, solved[ph].weights))}" for ph in PHASES))


def with_message(state: TunerState, text: str) -> TunerState:
    return replace(state, message=text)


def changed(state: TunerState) -> tuple[str, ...]:
    """Phases whose weights differ from the solved plan's."""
    if state.solved is None:
        return PHASES
    return tuple(ph for ph in PHASES if state.weights(ph) != state.solved[ph].weights)


def gain_over_solved(state: TunerState, phase: str | None = None) -> float | None:
    """Predicted throughput at the current weights over the solved plan's (1.0 = the same)."""
    if state.solved is None:
        return None
    ph = phase or state.phase
    return state.views[ph].prediction.throughput_Bps / state.solved[ph].prediction.throughput_Bps


def model_settings(state: TunerState) -> dict:
    """The read shapes and background work the predictions assume, as `planner solve` records them."""
    pre, dec = state.workloads["prefill"], state.workloads["decode"]
    return {"prefill": {"read_bytes": pre.read_bytes, "lanes": pre.in_flight, **traffic_of(pre)},
            "decode": {"read_bytes": dec.read_bytes, "batch": dec.in_flight, "threads": dec.threads, **traffic_of(dec)},
            "background": [{"source": state.drives[b.source].name, "kind": b.kind, "value": b.value}
                           for b in state.backgrounds]}


def settings_from_provenance(provenance: Mapping, names: Sequence[str]) -> tuple[dict[str, Workload], tuple[Background, ...]]:
    """The workloads and background work a plan was solved with (its provenance 'model'), so
    the tuner predicts what the plan predicted; defaults where the plan does not say."""
    m = provenance.get("model") if isinstance(provenance, Mapping) else None
    m = m if isinstance(m, Mapping) else {}
    pre = m.get("prefill") if isinstance(m.get("prefill"), Mapping) else {}
    dec = m.get("decode") if isinstance(m.get("decode"), Mapping) else {}
    wl = {"prefill": prefill_workload(**{k: int(pre[s]) for k, s in (("lanes", "lanes"), ("chunk", "read_bytes")) if s in pre},
                                      **traffic_kw(pre)),
          "decode": decode_workload(**{k: int(dec[s]) for k, s in (("batch", "batch"), ("threads", "threads"),
                                                                   ("length", "read_bytes")) if s in dec}, **traffic_kw(dec))}
    bgs = []
    for b in m.get("background") or ():
        if isinstance(b, Mapping) and b.get("source") in names and b.get("kind") in ("engram", "busy"):
            bgs.append(Background(list(names).index(b["source"]), b["kind"], float(b.get("value") or 0.0)))
    return wl, tuple(bgs)


def trials_measured(state: TunerState, phase: str) -> dict:
    """The plan's `measured` block for a phase from the trials run here (the same keys
    `engine-bridge autotune` writes; picked by hand); empty when the saved weights were not measured."""
    rows = trial_summary(state, phase)
    mine = [r for r in rows if r[0] == state.weights(phase)]
    if not mine:
        return {}
    _, med, n, pred = mine[0]
    runs = [t.Bps for t in state.trials if t.phase == phase and t.weights == state.weights(phase)]
    return {"throughput_Bps": med, "runs_Bps": runs, "n": n,
            "spread_pct": 100.0 * (max(runs) - min(runs)) / med if n > 1 and med > 0 else 0.0,
            "error_pct": 100.0 * (pred / med - 1.0) if med > 0 else None, "picked_by": "hand", "rounds": [],
            "candidates": [{"weights": list(w), "roles": ["tuner"], "predicted_Bps": p, "measured_Bps": m,
                            "runs_Bps": [t.Bps for t in state.trials if t.phase == phase and t.weights == w]}
                           for w, m, _, p in rows]}


def tuned_plan(state: TunerState, created: str = "") -> Plan:
    """The current weights as a plan file's contents (the same contract `planner solve` writes),
    with the solved plan's prediction as the baseline and provenance saying it was tuned by hand."""
    phases = {ph: Phase(state.weights(ph), prediction_to_dict(state.views[ph].prediction), trials_measured(state, ph))
              for ph in PHASES}
    baselines = {}
    if state.solved is not None:
        baselines = {ph: {"solved": prediction_to_dict(state.solved[ph].prediction),
                          "gain_over_solved": gain_over_solved(state, ph)} for ph in PHASES}
    prov = dict(state.provenance)
    prov["model"] = model_settings(state)
    prov["tuned"] = {"by": "hand", "tool": "planner tune", "from_plan": state.plan_name or None,
                     "solved": {ph: list(state.solved[ph].weights) for ph in PHASES} if state.solved else None,
                     "changed": list(changed(state))}
    return Plan(sources=state.sources, prefill=phases["prefill"], decode=phases["decode"], engine=state.engine,
                created=created, baselines=baselines, alternatives=(), provenance=prov)


def start_trial(state: TunerState) -> TunerState:
    """A measured trial of the weights on screen is starting."""
    return replace(state, measuring=True, message=f"measuring {state.phase} {':'.join(map(str, state.weights()))} …")


def with_trial(state: TunerState, phase: str, weights: Sequence[int], Bps: float | None, error: str = "") -> TunerState:
    """A trial finished (`Bps`) or failed (`error`): keep it beside the predictions."""
    if Bps is None:
        return replace(state, measuring=False, message=error or "measuring failed")
    run = TrialRun(phase, tuple(int(x) for x in weights), float(Bps))
    return replace(state, measuring=False, trials=state.trials + (run,),
                   message=f"measured {phase} {':'.join(map(str, run.weights))}")


def trial_summary(state: TunerState, phase: str | None = None) -> list[tuple[tuple[int, ...], float, int, float]]:
    """Per weights measured in the phase (in the order first measured): (weights, median bytes/s,
    trials, the model's prediction for them at the current settings, bytes/s)."""
    ph = phase or state.phase
    runs: dict[tuple[int, ...], list[float]] = {}
    for t in state.trials:
        if t.phase == ph:
            runs.setdefault(t.weights, []).append(t.Bps)
    out = []
    for w, vals in runs.items():
        vals = sorted(vals)
        mid = len(vals) // 2
        med = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
        pred = predict(state.drives, w, state.workloads[ph], state.backgrounds, state.engine, state.links).throughput_Bps
        out.append((w, med, len(vals), pred))
    return out
