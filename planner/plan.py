"""A plan: the two weight vectors the engine needs (prefill, decode), its switches, and where they came from.

JSON shape (schema 3), written to rig/plans/<timestamp>.json by `planner solve`:

    {"schema": 3, "kind": "plan", "engine": "ds4-argodrive", "created": "2026-11-29T19:00:00Z",
     "sources": [{"name": "internal", "path": "/abs/internal/model.gguf"}, ...],   # primary first
     "prefill": {"weights": [10, 5, 5], "predicted": {...}},
     "decode":  {"weights": [10, 6, 6], "predicted": {...}, "measured": {...}},
     "baselines": {...}, "alternatives": [...], "provenance": {...},
     "geometry": {...}, "workload": {...}, "switches": []}

`switches` names the engine's switches the plan turns on, one setting for both phases (sorted;
each name is one the engine declares, `engines.switches`: e.g. colibri's O_DIRECT reads and its
stripes; `engine-bridge export` gives them to the engine's profile). A plan of schema 2 held one
true/false key per switch instead, named after it; it loads through the engine's
`Switches.read`, and a switch whose key is missing there is on when a switch that needs it is.

`geometry` is the model the plan was solved for as its header describes it
(`models.geometry.Geometry.as_dict`, or the named workload's shape) and `workload` the reads
each phase issues (`planner.workload.ModelWorkload.as_dict`). Schema 1 plans (neither key) load
with both empty.

`predicted`, `baselines`, `alternatives` and `provenance` are free-form dicts/lists owned by the
solver; the keys above them are the contract every consumer (engine_bridge run/export) relies on.
A phase's `measured` block is written only by the measured tuner (`engine-bridge autotune`):

    {"throughput_Bps": median bytes/s of the picked weights, "runs_Bps": [...], "n", "spread_pct",
     "error_pct": predicted over measured - 1 in %, "picked_by": "measured" | "model", "rounds": [...],
     "candidates": [{"weights", "mode", "roles", "predicted_Bps", "measured_Bps", "runs_Bps"}, ...]}

(`mode`: the switches on, written by `engine-bridge autotune`; a candidate picked jointly, for an
engine with one weight vector for both phases, also has its `objective`.)

Plans without it (every plan before it, and `planner solve`'s) load as before (`measured` empty).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from core.constants import PLANS_DIR
from core.errors import RigError, UsageError
from engines.registry import DEFAULT_ENGINE, get_engine
from engines.split import check_weights
from engines.switches import NONE, Switches

from .constants import PLAN_SCHEMA, PLAN_SCHEMAS

PLAN_KIND = "plan"
# What to do about a bad plan file, said the same way by every message.
PLAN_REMEDY = f"give a plan written by `planner solve` (rig/{PLANS_DIR}/*.json)"


@dataclass(frozen=True)
class Source:
    name: str
    path: str


@dataclass(frozen=True)
class Phase:
    weights: tuple[int, ...]
    predicted: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)     # empty unless measured by the tuner


@dataclass(frozen=True)
class Plan:
    sources: tuple[Source, ...]
    prefill: Phase
    decode: Phase
    engine: str = DEFAULT_ENGINE
    created: str = ""
    baselines: dict = field(default_factory=dict)
    alternatives: tuple = ()
    provenance: dict = field(default_factory=dict)
    schema: int = PLAN_SCHEMA
    geometry: dict = field(default_factory=dict)     # the model solved for (empty in schema 1 plans)
    workload: dict = field(default_factory=dict)     # each phase's reads (empty in schema 1 plans)
    switches: frozenset[str] = frozenset()           # the engine's switches the plan turns on (both phases)

    KIND: ClassVar[str] = PLAN_KIND                  # a result (core.results): --json prints the file's shape
    SCHEMA: ClassVar[int] = PLAN_SCHEMA

    def to_dict(self) -> dict:
        return plan_to_dict(self)

    @property
    def priced_cache(self) -> int | None:
        """The engine's expert cache the plan was priced with (its workload's traffic); None when
        the plan does not say."""
        c = ((self.workload or {}).get("traffic") or {}).get("cache_experts")
        return c if isinstance(c, int) and not isinstance(c, bool) else None

    def __post_init__(self):
        if not isinstance(self.switches, frozenset):
            object.__setattr__(self, "switches", frozenset(self.switches))
        why = get_engine(self.engine).switches.problem(self.switches, self.engine, "switch")
        if why:
            raise ValueError(why)
        for phase in (self.prefill, self.decode):
            check_weights(phase.weights, self.engine)
            if len(phase.weights) != len(self.sources):
                raise ValueError(f"{len(phase.weights)} weights for {len(self.sources)} sources")


def _phase_to(ph: Phase) -> dict:
    d = {"weights": list(ph.weights), "predicted": ph.predicted}
    if ph.measured:
        d["measured"] = ph.measured
    return d


def plan_to_dict(p: Plan) -> dict:
    return {
        "schema": p.schema,
        "kind": PLAN_KIND,
        "engine": p.engine,
        "created": p.created,
        "sources": [{"name": s.name, "path": s.path} for s in p.sources],
        "prefill": _phase_to(p.prefill),
        "decode": _phase_to(p.decode),
        "baselines": p.baselines,
        "alternatives": list(p.alternatives),
        "provenance": p.provenance,
        "geometry": p.geometry,
        "workload": p.workload,
        "switches": sorted(p.switches),
    }


def engine_switches(engine: str) -> Switches:
    """The switches `engine` declares; none for an unknown engine, whose plan is refused
    elsewhere, by name."""
    try:
        return get_engine(engine).switches
    except UsageError:
        return NONE


def plan_from_dict(d: dict, where: str = "plan") -> Plan:
    def bad(key, what):
        return RigError(f"{where}: key '{key}' {what}; re-create the plan with `planner solve`")

    if not isinstance(d, dict) or d.get("kind") != PLAN_KIND:
        raise RigError(f"{where}: not a plan file (no \"kind\": \"{PLAN_KIND}\"); {PLAN_REMEDY}")
    if d.get("schema") not in PLAN_SCHEMAS:
        raise bad("schema", f"is {d.get('schema')!r}, this version reads {', '.join(map(str, PLAN_SCHEMAS))}")
    for key in ("geometry", "workload"):
        if not isinstance(d.get(key) or {}, dict):
            raise bad(key, "is not an object")
    declared = engine_switches(d.get("engine", DEFAULT_ENGINE))
    if "switches" in d:
        if not isinstance(d["switches"], list) or not all(isinstance(x, str) for x in d["switches"]):
            raise bad("switches", f"must be a list of switch names, got {d['switches']!r}")
    else:
        for key in declared.names:          # schema 1 and 2: one true/false key per switch
            if not isinstance(d.get(key, False), bool):
                raise bad(key, f"must be true or false, got {d.get(key)!r}")
    switches = declared.read(d)
    why = declared.problem(switches, d.get("engine", DEFAULT_ENGINE), "switch")
    if why:
        raise bad("switches", f"is not a setting the engine takes ({why})")
    srcs = d.get("sources")
    if not isinstance(srcs, list) or not srcs:
        raise bad("sources", "is missing or empty")
    sources = []
    for i, s in enumerate(srcs):
        if not isinstance(s, dict) or not isinstance(s.get("path"), str) or not isinstance(s.get("name"), str):
            raise bad(f"sources[{i}]", "must have string 'name' and 'path'")
        sources.append(Source(s["name"], s["path"]))
    phases = {}
    for ph in ("prefill", "decode"):
        blk = d.get(ph)
        if not isinstance(blk, dict) or not isinstance(blk.get("weights"), list):
            raise bad(f"{ph}.weights", "is missing")
        w = blk["weights"]
        if len(w) != len(sources):
            raise bad(f"{ph}.weights", f"has {len(w)} weights for {len(sources)} sources")
        try:
            check_weights(w, d.get("engine", DEFAULT_ENGINE))
        except Exception as e:
            raise bad(f"{ph}.weights", f"is invalid ({e})") from None
        measured = blk.get("measured") or {}
        if not isinstance(measured, dict):
            raise bad(f"{ph}.measured", "is not an object")
        phases[ph] = Phase(tuple(w), dict(blk.get("predicted") or {}), dict(measured))
    return Plan(sources=tuple(sources), prefill=phases["prefill"], decode=phases["decode"],
                engine=d.get("engine", DEFAULT_ENGINE), created=str(d.get("created", "")),
                baselines=dict(d.get("baselines") or {}), alternatives=tuple(d.get("alternatives") or ()),
                provenance=dict(d.get("provenance") or {}), geometry=dict(d.get("geometry") or {}),
                workload=dict(d.get("workload") or {}), switches=switches)

