"""The text the tuner shows, from a `TunerState` (pure). The Textual app lays these strings out
and does no arithmetic of its own; units: bytes, ms, GB/s or MB/s decimal."""

from __future__ import annotations

from dataclasses import dataclass

from core.units import format_rate

from ..model import PHASES
from .state import TunerState, changed, gain_over_solved, trial_summary

BAR = 30


@dataclass(frozen=True)
class SourceRow:
    selected: bool
    name: str
    weight: str          # '10', or '12 (plan 10)' when tuned away from the plan
    blocks: str
    nbytes: str
    bar: str             # the source's share of the read's bytes
    done_ms: str         # when its piece of one batch completes
    note: str            # 'lands last +0.412 ms' on the source that sets the barrier


def bar(part: int, whole: int, width: int = BAR) -> str:
    n = round(width * part / whole) if whole else 0
    return "█" * n + "·" * (width - n)


def _w(weights) -> str:
    return ":".join(map(str, weights))


def _last(p) -> str:
    return f"lands last +{p.gap_s * 1e3:.3f} ms" if p.gap_s > 0 else ""


def phase_tabs(state: TunerState) -> list[tuple[str, bool]]:
    """(label, on screen) per phase; a '*' marks weights changed from the plan."""
    edited = changed(state) if state.solved is not None else ()
    return [(f"{ph} {_w(state.weights(ph))}{' *' if ph in edited else ''}", ph == state.phase) for ph in PHASES]


def read_title(state: TunerState) -> str:
    wl = state.workloads[state.phase]
    if wl.phase == "prefill":
        shape = f"one {wl.read_bytes:,} B chunk, {wl.in_flight} lanes per drive"
    else:
        shape = f"one {wl.read_bytes:,} B component, {wl.in_flight} reads per expert, {wl.threads} threads"
    return f"split of {shape} by {_w(state.weights())}"


def source_rows(state: TunerState) -> list[SourceRow]:
    view = state.views[state.phase]
    p = view.prediction
    whole = sum(piece.length for piece in view.pieces)
    plan = state.solved[state.phase].weights if state.solved is not None else None
    rows = []
    for i, (src, piece, share) in enumerate(zip(state.sources, view.pieces, p.shares)):
        w = str(view.weights[i]) + (f" (plan {plan[i]})" if plan is not None and plan[i] != view.weights[i] else "")
        note = _last(p) if src.name == p.lands_last else ""
        rows.append(SourceRow(i == state.cursor, src.name, w, str(piece.blocks), f"{piece.length:,}",
                              bar(piece.length, whole), f"{share.time_s * 1e3:.3f}", note))
    return rows


def summary(state: TunerState) -> list[str]:
    p = state.views[state.phase].prediction
    unit = "chunk" if p.phase == "prefill" else "expert"
    lines = [f"predicted {format_rate(p.throughput_Bps)}: {p.time_per_batch_s * 1e3:.3f} ms per {unit}, "
             f"{p.time_per_read_s * 1e3:.3f} ms per read, {p.time_per_layer_s * 1e3:.2f} ms per layer",
             f"lands last: {p.lands_last}, {p.gap_s * 1e3:.3f} ms after the next source" if p.gap_s > 0
             else "lands last: none, the sources finish together"]
    g = gain_over_solved(state)
    if g is None:
        lines.append("solving for the plan's weights …")
    else:
        sp = state.solved[state.phase].prediction
        lines.append(f"plan {_w(sp.weights)}: {format_rate(sp.throughput_Bps)}, "
                     f"{sp.time_per_layer_s * 1e3:.2f} ms per layer; these weights x{g:.3f}")
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
    """Trials measured here (`m`) for this phase: the split reader's median beside the model's
    prediction; '◀' marks the weights on screen."""
    rows = trial_summary(state)
    if not rows:
        return []
    out = ["measured here (split reader, median):"]
    for w, med, n, pred in rows:
        here = " ◀" if w == state.weights() else ""
        out.append(f"  {_w(w):<10} measured {format_rate(med):>11}  predicted {format_rate(pred):>11}  "
                   f"prediction {100 * (pred / med - 1):+.1f} %  n={n}{here}")
    return out


def plan_line(state: TunerState) -> str:
    plan = state.plan_name or ("(solving)" if state.solved is None else "solved here, not saved yet")
    bench = state.provenance.get("bench") if state.provenance else None
    return f"plan {plan}" + (f" · bench {bench.rsplit('/', 1)[-1]}" if isinstance(bench, str) else "")
