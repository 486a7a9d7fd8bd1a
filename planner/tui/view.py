"""The text the tuner shows, from a `TunerState` (pure). The Textual app lays these strings out
and does no arithmetic of its own; units: bytes, ms, GB/s or MB/s decimal. Every number is the
one pricing's prediction (per layer: one layer of a prefill chunk, or of a decoded token)."""

from __future__ import annotations

from dataclasses import dataclass

from core.units import format_rate

from ..solve import PHASES
from .state import TunerState, changed, gain_over_solved, mode_text, trial_summary

BAR = 12


@dataclass(frozen=True)
class SourceRow:
    selected: bool
    name: str
    weight: str          # '10', or '12 (plan 10)' when tuned away from the plan
    share: str           # its share of the phase's bytes, '%'
    nbytes: str          # bytes per layer
    pieces: str          # pieces (requests) per layer
    experts: str         # experts per layer whose first byte it reads
    busy_ms: str         # its busy time per layer
    last: str            # the share of the groups it lands last in, '%'
    bar: str             # its share of the bytes, drawn
    note: str            # 'lands last +0.412 ms' on the source that lands last most; 'reads nothing'


def bar(part: float, whole: float, width: int = BAR) -> str:
    n = round(width * part / whole) if whole else 0
    return "█" * n + "·" * (width - n)


def _w(weights) -> str:
    return ":".join(map(str, weights))


def phase_tabs(state: TunerState) -> list[tuple[str, bool]]:
    """(label, on screen) per phase; a '*' marks weights changed from the plan."""
    edited = changed(state) if state.solved is not None else ()
    return [(f"{ph} {_w(state.weights(ph))}{' *' if ph in edited else ''}", ph == state.phase) for ph in PHASES]


def workload_text(state: TunerState) -> str:
    """The model tuned for: a named workload, or the model file's (directory's) name, its shape."""
    g = state.problem.geometry
    name = state.workload.get("name") if state.workload.get("name") not in (None, "model") else \
        g.path.rstrip("/").rsplit("/", 1)[-1]
    return f"{name}: {g.layers} layers x {g.experts} experts, {g.top_k} per token"


def engine_lines(state: TunerState) -> list[str]:
    """The engine, the model, whether one weight vector serves both phases; then the engine's
    switches, where it has some that matter on this model."""
    e = state.engine
    out = [" · ".join([e.name, workload_text(state)] + ([] if e.phase_weights else ["one weight vector for both phases"]))]
    if len(state.modes) > 1:
        out.append(f"switches: {mode_text(state.mode)} (o cycles {', '.join(mode_text(m) for m in state.modes)})")
    return out


def table_title(state: TunerState) -> str:
    p = state.views[state.phase].prediction
    return (f"{state.phase} at {_w(state.weights())}, per layer: {p['reads_per_layer']:,.2f} reads of "
            f"{p['read_bytes']:,.0f} B in {p['groups_per_layer']:,.2f} groups")


def source_rows(state: TunerState) -> list[SourceRow]:
    view = state.views[state.phase]
    p = view.prediction
    plan = state.solved[state.phase].weights if state.solved is not None else None
    total = sum(s["bytes"] for s in p["sources"])
    rows = []
    for i, s in enumerate(p["sources"]):
        w = str(view.weights[i]) + (f" (plan {plan[i]})" if plan is not None and plan[i] != view.weights[i] else "")
        if total > 0 and s["bytes"] <= 0:
            note = "reads nothing"
        elif s["name"] == p["lands_last"] and p["gap_s"] > 0:
            note = f"lands last +{p['gap_s'] * 1e3:.3f} ms"
        else:
            note = ""
        rows.append(SourceRow(i == state.cursor, s["name"], w, f"{s['share'] * 100:.1f}%", f"{s['bytes']:,.0f}",
                              f"{s['pieces']:.2f}", f"{s['experts']:.2f}", f"{s['time_s'] * 1e3:.3f}",
                              f"{s['lands_last'] * 100:.0f}%", bar(s["bytes"], total), note))
    return rows


def summary(state: TunerState) -> list[str]:
    p = state.views[state.phase].prediction
    lines = [f"predicted {format_rate(p['throughput_Bps'])}, {p['tok_s']:,.1f} tok/s of reads: "
             f"{p['time_per_layer_s'] * 1e3:.3f} ms per layer, {p['time_per_group_s'] * 1e3:.3f} ms per group",
             f"lands last most often: {p['lands_last']}, {p['gap_s'] * 1e3:.3f} ms after the next drive" if p["gap_s"] > 0
             else "lands last: no drive ahead of the others"]
    extra = []
    if p.get("tail_s"):
        extra.append(f"latency tails +{p['tail_s'] * 1e3:.3f} ms per group")
    if p.get("bound"):
        extra.append(f"bound by link {p['bound']}")
    if extra:
        lines.append("; ".join(extra))
    g = gain_over_solved(state)
    if g is None:
        lines.append("solving for the plan's weights …")
    else:
        sp = state.solved[state.phase].prediction
        sw = f" ({mode_text(state.solved_mode)})" if len(state.modes) > 1 else ""
        lines.append(f"plan {_w(state.solved[state.phase].weights)}{sw}: {format_rate(sp['throughput_Bps'])}, "
                     f"{sp['time_per_layer_s'] * 1e3:.3f} ms per layer; these weights x{g:.3f}")
    return lines


def measured_lines(state: TunerState) -> list[str]:
    """The newest harness run's medians for this phase (read-only); '◀' marks arms that ran
    the weights on screen."""
    if not state.measured:
        return []
    metric = "prefill tok/s" if state.phase == "prefill" else "steady decode tok/s"
    out = [f"measured ({state.measured[0].run}, medians, {metric}):"]
    for m in state.measured:
        w = m.weights.get(state.phase, ())
        tps = m.tps.get(state.phase)
        here = " ◀" if tuple(w) == state.weights() else ""
        out.append(f"  {m.arm:<12} {_w(w) or '-':<10} {'-' if tps is None else f'{tps:.2f}':>8}  n={m.n}{here}")
    return out


def trial_lines(state: TunerState) -> list[str]:
    """Trials measured here (`m`) for this phase: the split reader's median beside the pricing's
    prediction; '◀' marks the weights (and switches) on screen."""
    rows = trial_summary(state)
    if not rows:
        return []
    many = len(state.modes) > 1
    out = ["measured here (split reader, median):"]
    for w, m, med, n, pred in rows:
        here = " ◀" if (w, m) == (state.weights(), state.mode) else ""
        label = _w(w) + (f" {mode_text(m)}" if many else "")
        out.append(f"  {label:<10} measured {format_rate(med):>11}  predicted {format_rate(pred):>11}  "
                   f"prediction {100 * (pred / med - 1):+.1f} %  n={n}{here}")
    return out


def plan_line(state: TunerState) -> str:
    plan = state.plan_name or ("(solving)" if state.solved is None else "solved here, not saved yet")
    bench = state.provenance.get("bench") if state.provenance else None
    return f"plan {plan}" + (f" · bench {bench.rsplit('/', 1)[-1]}" if isinstance(bench, str) else "")
