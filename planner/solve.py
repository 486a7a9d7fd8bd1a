"""The solver: the best split of each phase on the block grid, reported as the smallest integers.

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
from engines.ds4_argodrive import BLOCK, WEIGHT_MAX, WEIGHT_MIN
from engines.registry import DEFAULT_ENGINE, get_engine
from engines.split import check_weights

from .barrier import Link
from .constants import TIE_TOLERANCE, TOP_ALTERNATIVES
from .model import Background, Drive, Prediction, Workload, capability_weights, describe, evaluate, prediction_to_dict
from .plan import Phase, Plan, Source


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
