"""The solver: each engine's own weight grid, searched with the one pricing (pure).

The engine gives the candidates (`Engine.grid`: every distinct weight vector on this model, as the
smallest integers that give the same reads — ds4's 10:5:5 and 2:1:1 cut a 6,635,520 B component
identically, colibri's weights matter only through their cuts of 256) and its modes (switches
such as colibri's O_DIRECT and stripes). Every candidate is priced by `planner.pricing` from the
engine's read pattern: no engine is named here.

An engine with one weight vector per phase (ds4: base weights for prefill, decode weights) is
solved phase by phase. An engine with one vector for both (colibri places each expert once) is
solved jointly: the sum over phases of (predicted seconds) / (the phase's fastest), within TIE
tolerance the first mode (the engine's default), then the smaller weights. A phase whose fastest
reads nothing (every read a page-cache hit, say) is measured against the run's fastest instead
(`phase_units`), so a mode that does read in it costs its seconds, not a division by zero.

A large grid (ds4's prefill at 32 MiB reads: 8,006 splits over three drives) is searched coarse to
fine in share space: a lattice of shares first, then ever closer neighbours of the best few, so at
most a few hundred candidates are priced. A candidate that leaves a drive idle loses to one using
every drive within IDLE_TOLERANCE; when none exists, the plan names the idle drive and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar, Mapping, Sequence

import numpy as np

from core.errors import UsageError
from core.results import Document
from engines.base import Engine
from engines.pattern import Concurrency, Setup

from .barrier import SharedLink
from .constants import IDLE_TOLERANCE, NO_READS, TIE_TOLERANCE, TOP_ALTERNATIVES
from .drivecurves import Background, Drive
from .plan import Phase, Plan, Source
from .pricing import Curves, PhasePrice, PhaseSteps, price_phase
from .world import e2e

PHASES = ("prefill", "decode")
FULL_SEARCH = 120           # grids up to this many candidates are priced whole
LATTICE = 12                # first pass of a larger grid: shares on a 1/LATTICE lattice
KEEP = 3                    # best candidates whose neighbourhoods each later pass searches
NEIGHBOURS = 24             # candidates priced around each kept one per pass


@dataclass(frozen=True)
class Problem:
    """What a plan is solved for: the engine (its concurrency possibly overridden), the model's
    geometry, the drives (primary first), each phase's steps, other work on the drives, shared
    links, what each source's copy holds (None: the whole model) and the bytes the page cache can
    keep of the model for an engine that reads through it (0: none, every read from a drive), and
    the engine's compute per token (`compute`, `overlap`) when its lines gave it."""
    engine: Engine
    geometry: object
    drives: tuple[Drive, ...]
    phases: dict[str, PhaseSteps]
    backgrounds: tuple[Background, ...] = ()
    links: tuple[SharedLink, ...] = ()
    holds: tuple[frozenset[str] | None, ...] = ()
    page_cache_bytes: int = 0
    # the engine's compute seconds per token of each phase, from its own lines (planner.world):
    # predictions then carry end-to-end figures beside the reads-only ones; {}: reads only
    compute: Mapping[str, float] = field(default_factory=dict)
    overlap: bool = False          # whether the engine's reads overlap its compute
    # what buffered reads read beyond their bytes (the kernel's readahead), a share of them, as the
    # engine's last buffered run showed (planner.world.readahead_excess); 0: nothing
    buffered_excess: float = 0.0

    @property
    def page_cache(self) -> float:
        """The share of the model's routed bytes the page cache can keep (0..1)."""
        routed = getattr(self.geometry, "routed_bytes", 0)
        return min(1.0, self.page_cache_bytes / routed) if routed and self.page_cache_bytes > 0 else 0.0

    def __post_init__(self):
        n, e = len(self.drives), self.engine
        if not 1 <= n <= e.max_sources:
            raise UsageError(f"{n} sources: {e.name} reads from 1..{e.max_sources} sources; list at most "
                             f"{e.max_sources} drives in the rig")


def with_concurrency(engine: Engine, lanes: int | None = None, threads: int | None = None) -> Engine:
    """The engine with its in-flight reads overridden: `lanes` where it keeps reads per drive,
    `threads` where its drives share one pool."""
    if lanes is None and threads is None:
        return engine
    base = engine.concurrency

    def conc(phase: str) -> Concurrency:
        c = base(phase)
        if c.per_source is not None and lanes is not None:
            return replace(c, per_source=lanes)
        if c.shared is not None and threads is not None:
            return replace(c, shared=threads)
        return c
    return replace(engine, concurrency=conc)


def recorded_concurrency(engine: Engine, record) -> Engine:
    """The engine with the reads in flight a plan recorded per phase (its provenance
    `model.concurrency`: {phase: {"per_source", "shared"}}), so a plan is priced again as it was
    solved; the engine's own where the record says nothing."""
    if not isinstance(record, dict) or not record:
        return engine
    base = engine.concurrency

    def conc(phase: str) -> Concurrency:
        c, r = base(phase), record.get(phase)
        if not isinstance(r, dict):
            return c
        got = {k: r[k] for k in ("per_source", "shared") if isinstance(r.get(k), int) and r[k] >= 1}
        return replace(c, **got) if got else c
    return replace(engine, concurrency=conc)


class Pricer:
    """Prices (phase, weights, mode) for one problem, each once."""

    def __init__(self, problem: Problem):
        self.p = problem
        self.curves = Curves(problem.drives)
        self._memo: dict = {}

    def setup(self, weights: Sequence[int], mode: frozenset[str] = frozenset()) -> Setup:
        return Setup(tuple(int(x) for x in weights), mode, self.p.holds)

    def price(self, phase: str, weights: Sequence[int], mode: frozenset[str] = frozenset()) -> PhasePrice:
        key = (phase, tuple(int(x) for x in weights), mode)
        got = self._memo.get(key)
        if got is None:
            p = self.p
            got = price_phase(p.phases[phase], self.setup(weights, mode),
                              lambda st, su: p.engine.pattern(p.geometry, st, su), self.curves, p.engine,
                              p.backgrounds, p.links, p.geometry, p.page_cache, p.buffered_excess)
            self._memo[key] = got
        return got


# ---------------------------------------------------------------------------------------------
# Searching a grid

def _shares(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    return w / w.sum(axis=-1, keepdims=True)


def search(grid: np.ndarray, score: Callable[[int], float], seeds: Sequence[int] = ()) -> dict[int, float]:
    """Scores of the grid rows priced: every row of a small grid; for a large one, the rows
    nearest a lattice of shares and the seeds, then rows ever nearer the best few in share space."""
    scored: dict[int, float] = {}

    def take(rows):
        for r in rows:
            r = int(r)
            if r not in scored:
                scored[r] = score(r)

    if len(grid) <= FULL_SEARCH:
        take(range(len(grid)))
        return scored
    sh = _shares(grid)
    n = grid.shape[1]
    pts = [np.array(v) / LATTICE for v in _compositions(LATTICE, n)]
    take(seeds)
    take({int(np.argmin(np.abs(sh - p).sum(axis=1))) for p in pts})
    radius = 1.0 / LATTICE
    while radius > 1.0 / 4096:
        best = sorted(scored, key=lambda r: (scored[r], r))[:KEEP]
        before = len(scored)
        for b in best:
            d = np.abs(sh - sh[b]).max(axis=1)
            near = np.flatnonzero(d <= radius)
            near = near[np.argsort(d[near], kind="stable")][:NEIGHBOURS]
            take(near)
        if len(scored) == before:
            radius /= 2
        else:
            radius /= 1.5
    return scored


def _compositions(total: int, parts: int):
    """Every vector of `parts` positive integers summing to `total`."""
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in _compositions(total - first, parts - 1):
            yield (first,) + rest


# ---------------------------------------------------------------------------------------------
# A prediction as the plan records it

def prediction(pr: PhasePrice, weights: Sequence[int], mode: frozenset[str], drives: Sequence[Drive]) -> dict:
    """One phase's price as the plan's `predicted` block. Per source: bytes, pieces, experts
    (whose first byte it reads) and busy seconds per step (a layer of a chunk or of a token), its
    share of the bytes and of the groups it landed last in."""
    steps = max(pr.steps, 1e-300)
    total = pr.bytes
    groups = max(pr.groups, 1e-300)
    sources = [{"name": d.name, "bytes": pr.source_bytes[i] / steps, "share": pr.source_bytes[i] / total if total else 0.0,
                "pieces": pr.source_pieces[i] / steps, "experts": pr.source_experts[i] / steps,
                "time_s": pr.source_s[i] / steps,
                "lands_last": pr.lands_last[i] / groups if pr.groups else 0.0}
               for i, d in enumerate(drives)]
    last = int(np.argmax(pr.lands_last)) if pr.groups else 0
    return {"phase": pr.phase, "weights": [int(x) for x in weights], "switches": sorted(mode),
            "throughput_Bps": pr.throughput_Bps, "seconds": pr.seconds,
            "tokens": pr.tokens, "tok_s": pr.tokens / pr.seconds if pr.seconds > 0 else 0.0,
            "time_per_layer_s": pr.seconds / steps, "time_per_group_s": pr.seconds / groups if pr.groups else 0.0,
            "time_per_read_s": pr.seconds / pr.reads if pr.reads else 0.0,
            "groups_per_layer": pr.groups / steps, "reads_per_layer": pr.reads / steps,
            "read_bytes": total / pr.reads if pr.reads else 0.0, "lands_last": drives[last].name,
            "gap_s": pr.gap_s, "tail_s": pr.tail_s, "bound": pr.bound, "sources": sources}


def problem_prediction(problem: Problem, pr: PhasePrice, weights: Sequence[int], mode: frozenset[str]) -> dict:
    """`prediction`, with the end-to-end figures (`planner.world.e2e`) where the problem knows the
    engine's compute for the phase."""
    p = prediction(pr, weights, mode, problem.drives)
    c = problem.compute.get(pr.phase)
    return e2e(p, c, problem.overlap) if c is not None else p


def idle_sources(pr: PhasePrice) -> tuple[int, ...]:
    """Sources the priced pattern gives no bytes in a phase that reads something."""
    if pr.bytes <= 0:
        return ()
    return tuple(i for i, b in enumerate(pr.source_bytes) if b <= 0)


# ---------------------------------------------------------------------------------------------
# Solving

@dataclass(frozen=True)
class Choice:
    """What the solver chose for the engine: weights per phase, a mode, and what it compared."""
    weights: dict[str, tuple[int, ...]]
    mode: frozenset[str]
    predicted: dict[str, dict]
    baselines: dict[str, dict]
    alternatives: tuple[dict, ...]
    idle: dict[str, dict] = field(default_factory=dict)     # phase -> {"sources", "why"}
    scores: dict[str, float] = field(default_factory=dict)  # mode -> joint objective (engines without phase weights)


def capability_weights(pricer: Pricer, phase: str, scale: int = 100) -> tuple[int, ...]:
    """Weights in proportion to what each drive moves alone at the reads an equal split gives it."""
    n = len(pricer.p.drives)
    eq = pricer.price(phase, (1,) * n)
    caps = []
    for i in range(n):
        size = int(eq.source_bytes[i] / eq.source_pieces[i]) if eq.source_pieces[i] else 1 << 20
        k = pricer.p.engine.concurrency(phase).in_flight([1] * n)[i] or 1
        caps.append(size / pricer.curves.seconds(i, size, k))
    caps = np.array(caps)
    e = pricer.p.engine
    w = np.clip(np.rint(caps / max(caps.max(), 1e-300) * min(scale, e.weight_max)), e.weight_min, e.weight_max)
    return tuple(int(x) for x in w)


def nearest(grid: np.ndarray, weights: Sequence[int]) -> int:
    """The grid row whose shares are nearest these weights' shares."""
    return int(np.argmin(np.abs(_shares(grid) - _shares(np.asarray(weights))).sum(axis=1)))


def _pick(scored: dict, key, every: Callable[[object], bool]) -> object:
    """The best candidate; within IDLE_TOLERANCE one using every source wins, within TIE_TOLERANCE
    the earliest (default mode, smaller weights)."""
    best = min(scored.values())
    ties = [c for c in scored if scored[c] <= best * (1 + TIE_TOLERANCE)]
    chosen = min(ties, key=key)
    if not every(chosen):
        full = [c for c in scored if every(c) and scored[c] <= best * (1 + IDLE_TOLERANCE)]
        if full:
            chosen = min(full, key=lambda c: (scored[c], key(c)))
    return chosen


def _tied(scored: dict, candidate, chosen=None, every: Callable[[object], bool] | None = None) -> bool:
    """Whether a candidate is as fast as the best within TIE_TOLERANCE and was passed over only by
    preference (default mode, smaller weights): a tied alternative may be a hair faster than the
    pick; it is listed as a tie, not as "next best". One that leaves a drive idle while the pick
    uses every drive is no tie: `_pick` rejected it for that (`idles_a_drive` says so)."""
    if every is not None and chosen is not None and every(chosen) and not every(candidate):
        return False
    return scored[candidate] <= min(scored.values()) * (1 + TIE_TOLERANCE)


def _idle_note(pricer: Pricer, phase: str, pr: PhasePrice, weights, scored_full: bool) -> dict:
    names = [pricer.p.drives[i].name for i in idle_sources(pr)]
    if not names:
        return {}
    why = (f"{phase}: {', '.join(names)} read{'s' if len(names) == 1 else ''} nothing at "
           f"{':'.join(map(str, weights))}: the engine's reads of this model give "
           f"{'it' if len(names) == 1 else 'them'} no bytes, and no split using every drive is within "
           f"{IDLE_TOLERANCE:.0%} of it" + ("" if scored_full else " among the splits priced"))
    return {"sources": names, "why": why}


def phase_units(fastest: Mapping[str, float]) -> dict[str, float]:
    """The joint objective's unit of time for each phase: its fastest seconds, or, for a phase
    whose fastest reads (next to) nothing, the fastest seconds of the whole run (1 s when no phase
    reads anything): a phase with no reads must not divide by a near-zero time."""
    run = sum(f for f in fastest.values() if f < float("inf"))
    return {ph: f if f > run * NO_READS else (run or 1.0) for ph, f in fastest.items()}


def solve(problem: Problem, top: int = TOP_ALTERNATIVES) -> Choice:
    pricer = Pricer(problem)
    e, n = problem.engine, len(problem.drives)
    mlist = e.modes(problem.geometry)
    predicted, baselines, alts, idle, scores = {}, {}, [], {}, {}
    if e.phase_weights:
        weights = {}
        for ph in PHASES:
            grid = e.grid(n, problem.geometry, ph)
            seeds = [nearest(grid, (1,) * n), nearest(grid, capability_weights(pricer, ph))]
            scored = search(grid, lambda r: pricer.price(ph, grid[r]).seconds, seeds)
            def full(r, ph=ph, grid=grid):
                return not idle_sources(pricer.price(ph, grid[r]))

            row = _pick(scored, lambda r: r, full)
            weights[ph] = tuple(int(x) for x in grid[row])
            pr = pricer.price(ph, weights[ph])
            predicted[ph] = problem_prediction(problem, pr, weights[ph], frozenset())
            idle[ph] = _idle_note(pricer, ph, pr, weights[ph], len(scored) == len(grid))
            ranked = [r for r in sorted(scored, key=lambda r: (scored[r], r)) if r != row][:top]
            alts += [dict(problem_prediction(problem, pricer.price(ph, grid[r]), grid[r], frozenset()),
                          behind=1.0 - scored[row] / scored[r] if scored[r] else 0.0, tied=_tied(scored, r, row, full),
                          idles_a_drive=not full(r))
                     for r in ranked]
        mode = frozenset()
    else:
        grid = e.grid(n, problem.geometry, "decode")
        seeds = [nearest(grid, (1,) * n), nearest(grid, capability_weights(pricer, "decode"))]
        unit = phase_units({ph: min(pricer.price(ph, grid[s], m).seconds for s in seeds for m in mlist) for ph in PHASES})
        scored: dict = {}
        for mi, m in enumerate(mlist):
            part = search(grid, lambda r: sum(pricer.price(ph, grid[r], m).seconds / unit[ph] for ph in PHASES), seeds)
            scored.update({(mi, r): s for r, s in part.items()})
        # the objective's denominators are the fastest of each phase over all that was priced
        unit = phase_units({ph: min(pricer.price(ph, grid[r], mlist[mi]).seconds for mi, r in scored) for ph in PHASES})
        scored = {(mi, r): sum(pricer.price(ph, grid[r], mlist[mi]).seconds / unit[ph] for ph in PHASES)
                  for mi, r in scored}
        def full(c):
            return not any(idle_sources(pricer.price(ph, grid[c[1]], mlist[c[0]])) for ph in PHASES)

        chosen = _pick(scored, lambda c: (c[0], c[1]), full)
        mi, row = chosen
        mode = mlist[mi]
        w = tuple(int(x) for x in grid[row])
        weights = {ph: w for ph in PHASES}
        for ph in PHASES:
            pr = pricer.price(ph, w, mode)
            predicted[ph] = problem_prediction(problem, pr, w, mode)
            idle[ph] = _idle_note(pricer, ph, pr, w, len(scored) == len(grid) * len(mlist))
        scores = {"+".join(sorted(m)) or "default": min((s for (i, _), s in scored.items() if i == k), default=0.0)
                  for k, m in enumerate(mlist)}
        ranked = [c for c in sorted(scored, key=lambda c: (scored[c], c)) if c != chosen][:top]
        for mi2, r in ranked:
            for ph in PHASES:
                a = problem_prediction(problem, pricer.price(ph, grid[r], mlist[mi2]), grid[r], mlist[mi2])
                alts.append(dict(a, behind=1.0 - predicted[ph]["seconds"] / a["seconds"] if a["seconds"] else 0.0,
                                 tied=_tied(scored, (mi2, r), chosen, full), idles_a_drive=not full((mi2, r))))
    for ph in PHASES:
        cap = capability_weights(pricer, ph)
        best = predicted[ph]["seconds"]
        base = {}
        for key, w in (("capability", cap), ("equal", (1,) * n)):
            p = problem_prediction(problem, pricer.price(ph, w, mode), w, mode)
            base[key] = p
            base[f"gain_over_{key}"] = p["seconds"] / best if best else 1.0
        baselines[ph] = base
    return Choice(weights, mode, predicted, baselines, tuple(alts), {k: v for k, v in idle.items() if v}, scores)


class PhasePrediction(Document):
    """`planner simulate`: one weight vector's prediction for one phase (the dict `prediction`
    builds, the same block a plan's phase carries as `predicted`)."""

    KIND: ClassVar[str] = "prediction"
    SCHEMA: ClassVar[int] = 1


def predict(problem: Problem, phase: str, weights: Sequence[int], mode: frozenset[str] = frozenset()) -> dict:
    """The prediction for one weight vector and mode (not necessarily on the grid)."""
    w = tuple(int(x) for x in weights)
    if len(w) != len(problem.drives):
        raise UsageError(f"weights {':'.join(map(str, w))}: {len(w)} weights for {len(problem.drives)} sources "
                         f"({', '.join(d.name for d in problem.drives)}); give one weight per source, primary first")
    return problem_prediction(problem, Pricer(problem).price(phase, w, mode), w, mode)


def solve_plan(sources: Sequence[Source], problem: Problem, provenance: dict | None = None, created: str = "",
               top: int = TOP_ALTERNATIVES) -> tuple[Plan, Choice]:
    """Solve and assemble the plan (provenance passed through, plus what the pricing assumed)."""
    ch = solve(problem, top)
    prov = dict(provenance or {})
    prov["model"] = model_record(problem, ch.scores)
    plan = Plan(sources=tuple(sources), prefill=Phase(ch.weights["prefill"], ch.predicted["prefill"]),
                decode=Phase(ch.weights["decode"], ch.predicted["decode"]), engine=problem.engine.name,
                created=created, baselines=ch.baselines, alternatives=ch.alternatives, provenance=prov,
                switches=ch.mode)
    return plan, ch


def model_record(problem: Problem, scores: dict | None = None) -> dict:
    """What the pricing assumed, as a plan's provenance `model` block: the engine's reads in
    flight per phase, the steps priced, its modes (and the objective per mode, `scores`), other
    work on the drives, shared links and latency tails."""
    drives = problem.drives
    return {
        "concurrency": {ph: _conc_dict(problem.engine.concurrency(ph)) for ph in PHASES},
        "steps": {ph: {"sampled": len(s.steps), "scale": s.scale, "empty": s.empty, "tokens": s.tokens}
                  for ph, s in problem.phases.items()},
        "modes": ["+".join(sorted(m)) or "default" for m in problem.engine.modes(problem.geometry)],
        "page_cache_bytes": problem.page_cache_bytes,
        "buffered_excess": problem.buffered_excess,
        "compute_s_per_token": dict(problem.compute),
        "overlap": problem.overlap,
        "scores": dict(scores or {}),
        "background": [{"source": drives[b.source].name, "kind": b.kind, "value": b.value} for b in problem.backgrounds],
        "links": [link_to_dict(link, drives) for link in problem.links],
        "tails": {d.name: tail_to_dict(d.tail) for d in drives if d.tail is not None},
    }


def _conc_dict(c: Concurrency) -> dict:
    return {"per_source": c.per_source, "shared": c.shared}


def link_to_dict(link: SharedLink, drives: Sequence[Drive]) -> dict:
    return {"name": link.name, "drives": [drives[i].name for i in link.members], "ceiling_Bps": link.ceiling_Bps}


def tail_to_dict(t) -> dict:
    """A latency shape as the plan records it (quantiles over the mean)."""
    return {"q50": t.q50, "q95": t.q95, "q99": t.q99}
