"""A harness run's results.json (rig/runs/<stamp>/results.json) read back: each arm's weights and
medians, which the tuner shows beside the model's prediction.

engine_bridge's harness writes the document (engine_bridge.harness.arms.build_results) and checks
one it is given with this same parser; it lives here, below both, so the two read it one way.
`parse_results` is pure; `read_results` reads a file through core.jsonfile.read_json.

The keys read here (schema 1):

    {"schema": 1, "kind": "bench-results", "created": ISO, "control": NAME, ...,
     "arms": {NAME: {"plan", "sources": [paths], "prefill_weights": [..], "decode_weights": [..]}},
     "medians": {NAME: {"n", "n_failed", "prefill_tps", "gen_steady_tps", ...: median or null}}, ...}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from core.errors import RigError
from core.jsonfile import read_json

RESULTS_KIND = "bench-results"
RESULTS_SCHEMA = 1
RESULTS_KEYS = ("schema", "kind", "created", "order", "sequence", "control", "reference", "reference_sha256",
                "settings", "arms", "rows", "medians", "gains", "pairs", "claims")
# The median the tuner compares per phase: prefill tok/s, and steady decode tok/s (the first
# decode step, which pays for the cold cache, left out).
PHASE_METRICS = {"prefill": "prefill_tps", "decode": "gen_steady_tps"}
REMEDY = "run `engine-bridge bench` or `engine-bridge ladder` again to write a new one"


@dataclass(frozen=True)
class ArmMedians:
    """One arm of a harness run: the weights it ran and the medians of its passing rows."""
    name: str
    sources: tuple[str, ...]                   # paths, primary first
    weights: Mapping[str, tuple[int, ...]]     # phase -> weights
    n: int                                     # passing rows behind the medians
    n_failed: int
    tps: Mapping[str, float | None]            # phase -> median tok/s (None: no passing row)


@dataclass(frozen=True)
class HarnessRun:
    created: str                               # ISO 8601 UTC
    control: str                               # the arm gains are measured against
    arms: tuple[ArmMedians, ...]               # in the document's order

    def arm(self, name: str) -> ArmMedians:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _count(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else 0


def parse_results(doc: Any, where: str = "results.json") -> HarnessRun:
    """Check a results document and read its arms; anything malformed is a RigError naming
    `where` and the key."""
    def bad(key: str, what: str) -> RigError:
        return RigError(f"{where}: key '{key}' {what}; {REMEDY}")

    if not isinstance(doc, dict) or doc.get("kind") != RESULTS_KIND:
        found = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise RigError(f"{where}: not a bench results file (kind is {found!r}, expected {RESULTS_KIND!r}); {REMEDY}")
    if isinstance(doc.get("schema"), bool) or doc.get("schema") != RESULTS_SCHEMA:
        raise bad("schema", f"is {doc.get('schema')!r}, this version reads {RESULTS_SCHEMA}")
    missing = [k for k in RESULTS_KEYS if k not in doc]
    if missing:
        raise RigError(f"{where}: keys missing: {', '.join(missing)}; {REMEDY}")
    arms, medians = doc["arms"], doc["medians"]
    if not isinstance(arms, dict):
        raise bad("arms", "is not an object of arms")
    if not isinstance(medians, dict):
        raise bad("medians", "is not an object of arms")
    out = []
    for name, arm in arms.items():
        if not isinstance(arm, dict):
            raise bad(f"arms.{name}", "is not an object")
        sources = arm.get("sources", [])
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise bad(f"arms.{name}.sources", "is not a list of paths")
        weights = {}
        for phase in PHASE_METRICS:
            w = arm.get(f"{phase}_weights") or []
            if not isinstance(w, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in w):
                raise bad(f"arms.{name}.{phase}_weights", "is not a list of integers")
            weights[phase] = tuple(w)
        med = medians.get(name) or {}
        if not isinstance(med, dict):
            raise bad(f"medians.{name}", "is not an object")
        out.append(ArmMedians(name, tuple(sources), weights, _count(med.get("n")), _count(med.get("n_failed")),
                              {ph: _number(med.get(metric)) for ph, metric in PHASE_METRICS.items()}))
    return HarnessRun(str(doc.get("created") or ""), str(doc.get("control") or ""), tuple(out))


def read_results(path: str) -> HarnessRun:
    """A results.json file: missing is MissingError (exit 3), anything else wrong RigError (exit 2)."""
    doc = read_json(path, RESULTS_KIND, REMEDY, schema=RESULTS_SCHEMA, what="bench results")
    return parse_results(doc, path)
