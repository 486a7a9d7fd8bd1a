"""Expert usage history: how often each (layer, expert) was read, and a held-out split of it (pure).

A partial replica should hold the experts that carry the most *miss* bytes (docs/replicas.md,
"Partial replicas"). The history comes from two places:

- the embedded engine: every `engine-bridge run` and `replay` with a rig records each expert's
  cache misses (the reads it asked the drives for) as `rig/usage/<UTC>.json`, kind `usage`
  (`usage_to_dict`). One record per run, so records have an order.
- a target engine that keeps a history of its own beside the model (`Engine.usage_file`, read by
  its `Engine.read_usage` into a `Usage`: colibri's `.coli_usage`, engines/colibri/usage_file.py).
  Such a history may count *routings* (router selections) rather than misses; the kind says which,
  since a cache flattens misses.

A held-out split keeps the ranking honest: shards are ranked on one part and the coverage is
reported on the other (`split_history`). Several records: alternate records, oldest first; one
record (colibri's cumulative counts, or a single run): each count is thinned binomially into two
halves with a fixed seed, which for event counts is an exact random split of the events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

USAGE_KIND = "usage"
USAGE_SCHEMA = 1
MISSES, ROUTINGS = "misses", "routings"

SPLIT_SEED = 21                     # the binomial split's seed: one split per history, every run


@dataclass(frozen=True)
class Usage:
    """One record of expert use: `counts[layer][expert]` events of `kind` (misses or routings).
    layers/experts: the model's MoE layers and routed experts per layer as the writer saw them."""
    layers: int
    experts: int
    counts: tuple[tuple[int, ...], ...]
    kind: str = MISSES
    source: str = ""          # who wrote it: 'engine-bridge run', 'engine-bridge replay', an engine's usage file
    created: str = ""         # UTC, ISO 8601 ('' unknown)

    def array(self) -> np.ndarray:
        return np.asarray(self.counts, dtype=np.int64).reshape(self.layers, self.experts)

    @property
    def total(self) -> int:
        return int(self.array().sum())


def usage_of(counts: np.ndarray, kind: str = MISSES, source: str = "", created: str = "") -> Usage:
    a = np.asarray(counts, dtype=np.int64)
    return Usage(int(a.shape[0]), int(a.shape[1]), tuple(tuple(int(x) for x in row) for row in a), kind, source, created)


def usage_to_dict(u: Usage) -> dict:
    """The rig file (sparse: only non-zero counts, as [layer, expert, count])."""
    a = u.array()
    nz = np.argwhere(a > 0)
    return {"schema": USAGE_SCHEMA, "kind": USAGE_KIND, "events": u.kind, "source": u.source, "created": u.created,
            "layers": u.layers, "experts": u.experts,
            "counts": [[int(lay), int(e), int(a[lay, e])] for lay, e in nz]}


def usage_from_dict(d: dict, where: str) -> Usage:
    """ValueError naming the key at fault."""
    for key in ("layers", "experts"):
        if not isinstance(d.get(key), int) or isinstance(d.get(key), bool) or d[key] <= 0:
            raise ValueError(f"{where}: key '{key}' missing or not a positive integer")
    if d.get("events", MISSES) not in (MISSES, ROUTINGS):
        raise ValueError(f"{where}: key 'events' is {d.get('events')!r}; expected {MISSES} or {ROUTINGS}")
    a = np.zeros((d["layers"], d["experts"]), dtype=np.int64)
    rows = d.get("counts")
    if not isinstance(rows, list):
        raise ValueError(f"{where}: key 'counts' missing or not a list")
    for i, r in enumerate(rows):
        if not (isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) for x in r)
                and 0 <= r[0] < d["layers"] and 0 <= r[1] < d["experts"] and r[2] >= 0):
            raise ValueError(f"{where}: counts[{i}] is not [layer, expert, count] inside the model")
        a[r[0], r[1]] += r[2]
    return usage_of(a, d.get("events", MISSES), str(d.get("source", "")), str(d.get("created", "")))


@dataclass(frozen=True)
class Split:
    """A history cut in two: `rank` to choose by, `held` to report on. how: one line saying how."""
    rank: np.ndarray      # (layers, experts) event counts
    held: np.ndarray
    how: str
    kind: str             # misses / routings / mixed
    records: int


def split_history(records: list[Usage], layers: int, experts: int, seed: int = SPLIT_SEED) -> Split | None:
    """The records of this geometry, cut into a ranking part and a held-out part (module doc).
    None when there is no record of this geometry with an event in it."""
    mine = [r for r in records if (r.layers, r.experts) == (layers, experts) and r.total > 0]
    if not mine:
        return None
    mine.sort(key=lambda r: r.created)
    kinds = {r.kind for r in mine}
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    if len(mine) >= 2:
        rank = sum(r.array() for i, r in enumerate(mine) if i % 2 == 0)
        held = sum(r.array() for i, r in enumerate(mine) if i % 2 == 1)
        return Split(rank, held, f"{len(mine)} records: ranked on {(len(mine) + 1) // 2}, checked on "
                                 f"{len(mine) // 2} (alternate records, oldest first)", kind, len(mine))
    a = mine[0].array()
    rank = np.random.default_rng(seed).binomial(a, 0.5)
    return Split(rank, a - rank, f"1 record ({mine[0].source or 'unknown'}): its events split at random in two "
                                 f"halves (seed {seed}), ranked on one, checked on the other", kind, 1)
