"""The solver: the best split of each phase on the block grid, reported as the smallest integers.

(colibri places whole experts instead of splitting reads: `solve_colibri_plan` searches its cut
grid for one weight vector and a stripe switch over both phases; `solve_workload` dispatches.)

Weights only matter through the block counts they give at the phase's real read size (DESIGN
§5: 10:5:5 and 2:1:1 cut a 6,635,520 B component identically). So the solver enumerates every
weight vector the engine accepts (1..100 per source), groups them by the counts they produce,
keeps the smallest vector of each group (least sum, then least maximum, then lexicographic),
evaluates the model once per group and reports the best. Pure: no disk, no threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from core.errors import UsageError
from engines.colibri import NAME as COLIBRI
from engines.colibri import STRIPE_MIN
from engines.ds4_argodrive import BLOCK, WEIGHT_MAX, WEIGHT_MIN
from engines.registry import DEFAULT_ENGINE, get_engine
from engines.split import check_weights

from .barrier import Link
from .colibri_model import PHASES as COLIBRI_PHASES
from .colibri_model import ColibriWorkload, choose, cuts_many, evaluate_weights, placement_counts_many
from .colibri_model import prediction as colibri_prediction
from .constants import TIE_TOLERANCE, TOP_ALTERNATIVES
from .model import Background, Drive, Prediction, Workload, capability_weights, describe, evaluate, prediction_to_dict
from .plan import Phase, Plan, Source
from .workload import ModelWorkload


def block_counts_many(blocks: int, weights: np.ndarray) -> np.ndarray:
    """`engines.ds4_argodrive.block_counts` for every row of `weights` (N x n) at once; identical results."""
    w = np.asarray(weights, dtype=np.int64)
    total = w.sum(axis=1, keepdims=True)
    counts = blocks * w // total
    rems = blocks * w % total
    left = blocks - counts.sum(axis=1)
    # Sum of remainders is left * total with each below total, so the `left` largest are positive
    # and distinct sources: one extra block each, ties to the lower index (stable sort).
    order = np.argsort(-rems, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(w.shape[1]), w.shape).copy(), axis=1)
    return counts + (rank < left[:, None])


@lru_cache(maxsize=4)
def weight_space(n: int) -> np.ndarray:
    """Every weight vector of n sources (1..100 each), smallest first: by sum, max, then lexicographic."""
    axes = np.meshgrid(*([np.arange(WEIGHT_MIN, WEIGHT_MAX + 1, dtype=np.int64)] * n), indexing="ij")
    w = np.stack([a.ravel() for a in axes], axis=1)
    keys = [w[:, i] for i in reversed(range(n))] + [w.max(axis=1), w.sum(axis=1)]
    return w[np.lexsort(keys)]


@lru_cache(maxsize=16)
def _classes(n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    w = weight_space(n)
    blocks = length // BLOCK
    counts = block_counts_many(blocks, w)
    key = np.zeros(len(w), dtype=np.int64)
    for i in range(n):
        key = key * (blocks + 1) + counts[:, i]
    _, first = np.unique(key, return_index=True)
    first.sort()                      # keep the smallest-first order of the representatives
    return counts[first], w[first]


def split_classes(n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts K x n, smallest weights K x n): every distinct split of a `length`-byte read the
    engine's weights can produce, with the smallest weights that produce it."""
    return _classes(n, length)


def smallest_equivalent(weights: Sequence[int], length: int) -> tuple[int, ...]:
    """The smallest weights that split a `length`-byte read exactly as `weights` do."""
    w = np.asarray([check_weights(weights)], dtype=np.int64)
    target = block_counts_many(length // BLOCK, w)[0]
    counts, smallest = split_classes(w.shape[1], length)
    hit = np.flatnonzero((counts == target).all(axis=1))
    return tuple(int(x) for x in smallest[hit[0]])


@dataclass(frozen=True)
class PhaseSolution:
    phase: str
    weights: tuple[int, ...]                   # smallest integers of the best split
    prediction: Prediction
    capability: Prediction                     # capability-proportional weights
    equal: Prediction                          # equal weights
    alternatives: tuple[Prediction, ...]       # the next best distinct splits


def predict(drives: Sequence[Drive], weights: Sequence[int], workload: Workload,
            backgrounds: Sequence[Background] = (), engine: str = DEFAULT_ENGINE, links: Sequence[Link] = ()) -> Prediction:
    """The model's prediction for one weight vector."""
    w = np.asarray([check_weights(weights, engine)], dtype=np.int64)
    if w.shape[1] != len(drives):
        raise UsageError(f"weights {':'.join(map(str, weights))}: {w.shape[1]} weights for {len(drives)} sources "
                         f"({', '.join(d.name for d in drives)}); give one weight per source, primary first")
    counts = block_counts_many(workload.blocks, w)
    return describe(evaluate(drives, counts, workload, backgrounds, links), 0, drives, weights)


def solve_phase(drives: Sequence[Drive], workload: Workload, backgrounds: Sequence[Background] = (),
                engine: str = DEFAULT_ENGINE, top: int = TOP_ALTERNATIVES, links: Sequence[Link] = ()) -> PhaseSolution:
    n = len(drives)
    limit = get_engine(engine).max_sources
    if not 1 <= n <= limit:
        raise UsageError(f"{n} sources: {engine} reads from 1..{limit} sources; list at most {limit} drives in the rig")
    counts, smallest = split_classes(n, workload.read_bytes)
    ev = evaluate(drives, counts, workload, backgrounds, links)
    # The fastest split; splits within TIE_TOLERANCE of it are ties no measurement could tell
    # apart, and among ties the smaller weights (earlier in the class order) win.
    fastest = float(ev.time.min())
    best = int(np.flatnonzero(ev.time <= fastest * (1 + TIE_TOLERANCE))[0])
    order = [int(r) for r in np.lexsort((np.arange(len(ev.time)), ev.time)) if r != best]
    order.insert(0, best)
    weights = tuple(int(x) for x in smallest[best])
    alts = tuple(describe(ev, int(r), drives, smallest[int(r)]) for r in order[1:1 + top])
    cap = smallest_equivalent(capability_weights(drives, workload), workload.read_bytes)
    eq = (1,) * n
    return PhaseSolution(workload.phase, weights, describe(ev, best, drives, weights),
                         predict(drives, cap, workload, backgrounds, engine, links),
                         predict(drives, eq, workload, backgrounds, engine, links), alts)


def phase_solution_to_dict(s: PhaseSolution) -> dict:
    best = s.prediction.throughput_Bps
    return {
        "weights": list(s.weights),
        "predicted": prediction_to_dict(s.prediction),
        "baselines": {
            "capability": prediction_to_dict(s.capability),
            "equal": prediction_to_dict(s.equal),
            "gain_over_capability": best / s.capability.throughput_Bps,
            "gain_over_equal": best / s.equal.throughput_Bps,
        },
        "alternatives": [dict(prediction_to_dict(a), behind=1.0 - a.throughput_Bps / best) for a in s.alternatives],
    }


def link_to_dict(link: Link, drives: Sequence[Drive]) -> dict:
    return {"name": link.name, "drives": [drives[i].name for i in link.members], "ceiling_Bps": link.ceiling_Bps}


def tail_to_dict(t) -> dict:
    """A latency shape as the plan records it (quantiles over the mean)."""
    return {"q50": t.q50, "q95": t.q95, "q99": t.q99}


def solve_plan(sources: Sequence[Source], drives: Sequence[Drive], prefill: Workload, decode: Workload,
               backgrounds: Sequence[Background] = (), engine: str = DEFAULT_ENGINE, provenance: dict | None = None,
               created: str = "", top: int = TOP_ALTERNATIVES, links: Sequence[Link] = ()) -> Plan:
    """Solve both phases and assemble the plan (provenance is passed through, plus the model settings)."""
    sols = {w.phase: solve_phase(drives, w, backgrounds, engine, top, links) for w in (prefill, decode)}
    d = {ph: phase_solution_to_dict(s) for ph, s in sols.items()}
    prov = dict(provenance or {})
    prov["model"] = {
        "prefill": {"read_bytes": prefill.read_bytes, "lanes": prefill.in_flight},
        "decode": {"read_bytes": decode.read_bytes, "batch": decode.in_flight, "threads": decode.threads},
        "background": [{"source": drives[b.source].name, "kind": b.kind, "value": b.value} for b in backgrounds],
        "links": [link_to_dict(link, drives) for link in links],
        "tails": {d.name: tail_to_dict(d.tail) for d in drives if d.tail is not None},
    }
    return Plan(sources=tuple(sources),
                prefill=Phase(sols["prefill"].weights, d["prefill"]["predicted"]),
                decode=Phase(sols["decode"].weights, d["decode"]["predicted"]),
                engine=engine, created=created,
                baselines={ph: d[ph]["baselines"] for ph in d},
                alternatives=tuple(dict(a) for ph in d for a in d[ph]["alternatives"]),
                provenance=prov)


# ---------------------------------------------------------------------------------------------
# colibri: one weight vector for both phases on its cut grid, and the stripe switch

def colibri_single(drives: Sequence[Drive], cw: ColibriWorkload, weights: Sequence[int], stripe: bool,
                    backgrounds: Sequence[Background], links: Sequence[Link]) -> dict:
    """phase -> prediction dict for one weight vector (not necessarily on the searched grid)."""
    w = [int(x) for x in weights]
    cuts = cuts_many([w])
    counts = placement_counts_many(cuts, cw.layers, cw.experts)
    s = bool(stripe and cw.can_stripe(len(drives)))
    priced = evaluate_weights(drives, cw, w, s, backgrounds, links)
    return {ph: colibri_prediction(priced[ph], 0, ph, drives, w, cuts[0], counts[0], s, links) for ph in COLIBRI_PHASES}


def colibri_capability_weights(drives: Sequence[Drive], cw: ColibriWorkload, scale: int = 100) -> tuple[int, ...]:
    """Weights proportional to what each drive delivers alone for whole-expert reads with its even
    share of the read threads."""
    k = max(1, cw.threads // max(1, len(drives)))
    caps = np.array([float(d.curve.throughput(cw.expert_bytes, k)) for d in drives])
    return tuple(int(x) for x in np.clip(np.rint(caps / max(caps.max(), 1e-300) * scale), 1, scale))


def stripe_reason(cw: ColibriWorkload, n: int) -> str:
    """Why colibri could not stripe this model's reads over n drives ('' when it could)."""
    if n < 2:
        return "one drive: nothing to stripe over"
    if not cw.can_stripe(n):
        return (f"an expert read's O_DIRECT window is {cw.window:,} B, under the {STRIPE_MIN >> 20} MiB colibri "
                "stripes (mir_pread_striped leaves it whole)")
    return ""


def _gain(a: float, b: float) -> float:
    """a / b; 1 when both are 0 (a phase with no reads: a cache holding every expert)."""
    return a / b if b else (1.0 if not a else float("inf"))


def solve_colibri_plan(sources: Sequence[Source], drives: Sequence[Drive], cw: ColibriWorkload,
                       backgrounds: Sequence[Background] = (), provenance: dict | None = None, created: str = "",
                       top: int = TOP_ALTERNATIVES, links: Sequence[Link] = ()) -> Plan:
    """colibri's plan: the cut vector (smallest weights) and stripe switch best over both phases
    (`colibri_model.choose`), the same weights for prefill and decode (colibri places once)."""
    n = len(drives)
    limit = get_engine(COLIBRI).max_sources
    if not 1 <= n <= limit:
        raise UsageError(f"{n} sources: {COLIBRI} reads from 1..{limit} drives; list at most {limit} drives in the rig")
    ch = choose(drives, cw, backgrounds, links, TIE_TOLERANCE)
    row, stripe = ch.row, ch.stripe
    weights = tuple(int(x) for x in ch.weights[row])

    def pred(ph, r, s):
        return colibri_prediction(ch.priced[(ph, s)], r, ph, drives, ch.weights[r], ch.cuts[r], ch.counts[r], s, links)

    predicted = {ph: pred(ph, row, stripe) for ph in COLIBRI_PHASES}
    equal = colibri_single(drives, cw, (1,) * n, stripe, backgrounds, links)
    cap = colibri_single(drives, cw, colibri_capability_weights(drives, cw), stripe, backgrounds, links)
    other = colibri_single(drives, cw, weights, not stripe, backgrounds, links) if len(ch.stripes) > 1 else None
    baselines = {}
    for ph in COLIBRI_PHASES:
        best = predicted[ph]["throughput_Bps"]
        baselines[ph] = {"capability": cap[ph], "equal": equal[ph],
                         "gain_over_capability": _gain(best, cap[ph]["throughput_Bps"]),
                         "gain_over_equal": _gain(best, equal[ph]["throughput_Bps"])}
        if other is not None:
            baselines[ph]["other_stripe"] = other[ph]
    # The next best (candidate, switch) pairs by the same objective, each phase's prediction.
    flat = ch.score.ravel()
    alts = []
    for i in np.argsort(flat, kind="stable"):
        si, r = divmod(int(i), ch.score.shape[1])
        if (r, ch.stripes[si]) == (row, stripe):
            continue
        if len(alts) >= 2 * top:
            break
        for ph in COLIBRI_PHASES:
            a = pred(ph, r, ch.stripes[si])
            alts.append(dict(a, behind=1.0 - _gain(a["throughput_Bps"], predicted[ph]["throughput_Bps"])))
    scores = {("on" if s else "off"): float(ch.score[si, row]) for si, s in enumerate(ch.stripes)}
    prov = dict(provenance or {})
    prov["model"] = {
        "colibri": cw.as_dict(),
        "stripe": {"chosen": stripe, "possible": len(ch.stripes) > 1, "why_not": stripe_reason(cw, n),
                   "score": scores, "objective": "sum over phases of seconds per layer / the phase's fastest"},
        "background": [{"source": drives[b.source].name, "kind": b.kind, "value": b.value} for b in backgrounds],
        "links": [link_to_dict(link, drives) for link in links],
        "tails": {d.name: tail_to_dict(d.tail) for d in drives if d.tail is not None},
    }
    return Plan(sources=tuple(sources), prefill=Phase(weights, predicted["prefill"]),
                decode=Phase(weights, predicted["decode"]), engine=COLIBRI, created=created, baselines=baselines,
                alternatives=tuple(alts), provenance=prov, stripe=stripe)


def solve_workload(sources: Sequence[Source], drives: Sequence[Drive], wl: ModelWorkload,
                   backgrounds: Sequence[Background] = (), provenance: dict | None = None, created: str = "",
                   top: int = TOP_ALTERNATIVES, links: Sequence[Link] = ()) -> Plan:
    """The plan for a model workload, by its engine: colibri's placement, else ds4's split."""
    if wl.colibri is not None:
        return solve_colibri_plan(sources, drives, wl.colibri, backgrounds, provenance, created, top, links)
    return solve_plan(sources, drives, wl.prefill, wl.decode, backgrounds, wl.engine, provenance, created, top, links)
