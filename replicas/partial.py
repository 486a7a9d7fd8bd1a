"""What a partial replica holds (pure): the model's shards ranked by the miss bytes they carry,
chosen within a byte budget so that the replica's share of the miss bytes matches its optimal
bandwidth share (docs/replicas.md, "Partial replicas").

The unit is a whole file of the model: colibri finds a mirror's shard by its name and reads a
shard the mirror lacks from the primary (c/st.h `st_mirror_add`; which tensor decides per family
member is in `engines.colibri`), and the embedded engine's reader opens a source's files one by
one, so a file is what both can use. An expert's miss bytes count for the file each of its
components sits in; a checkpoint keeps an expert's tensors in one shard, and where one straddles
two the planner prices the engine's own rule exactly (`engines.colibri`'s fallback per member).

With hash placement a member of coverage c and weight share s serves about s*c of the expert bytes;
it can serve at most c (every expert it holds). Its optimal share is its bandwidth over the rig's,
B_d / (B_rest + B_d): holding more than that share of the miss bytes buys nothing, holding less
loses speed. `predicted_gain` is that bandwidth model (the planner's plan is the exact price).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

BUDGET, SHARE, EVERY = "budget", "share reached", "every shard"


@dataclass(frozen=True)
class ShardUse:
    """One file of the model as a partial replica sees it."""
    file: str                 # relative path in the model
    bytes: int                # the file's size
    expert_bytes: int         # routed expert bytes in it
    rank: float               # miss bytes it carries in the ranking part of the history
    held: float               # ... in the held-out part


@dataclass(frozen=True)
class PartialChoice:
    """What one destination of `sync --partial` holds, and what that is predicted to buy."""
    dest: str
    budget: int                       # bytes
    holds: tuple[str, ...]            # relative paths, the model's order
    bytes: int                        # bytes of those files
    model_bytes: int                  # bytes of the whole model
    coverage_rank: float              # share of the ranking part's miss bytes the held files carry
    coverage_held: float              # ... of the held-out part (the honest figure)
    share: float | None               # the drive's optimal bandwidth share (None: ceilings not measured)
    gain: float | None                # predicted gain over the rig without this member (0.25 = +25 %)
    gain_full: float | None           # ... of a full replica on the same drive
    history: str                      # how the shards were ranked
    stop: str                         # budget / share reached / every shard


def shard_uses(geometry, files: Sequence[tuple[str, int]], rank: np.ndarray | None,
               held: np.ndarray | None) -> list[ShardUse]:
    """Per file of the model (relative path, bytes): its expert bytes and the miss bytes it carries
    in each part of the history ((layers, experts) event counts; None: every expert once, the
    even ranking). `geometry`: a `models.geometry.Geometry`."""
    ones = np.ones((geometry.layers, geometry.experts))
    rank = ones if rank is None else rank
    held = ones if held is None else held
    eb: dict[str, int] = {}
    rb: dict[str, float] = {}
    hb: dict[str, float] = {}
    for layer in range(geometry.layers):
        for e in range(geometry.experts):
            for x in geometry.expert_ranges(layer, e):
                eb[x.file] = eb.get(x.file, 0) + x.length
                rb[x.file] = rb.get(x.file, 0.0) + float(rank[layer, e]) * x.length
                hb[x.file] = hb.get(x.file, 0.0) + float(held[layer, e]) * x.length
    return [ShardUse(f, b, eb.get(f, 0), rb.get(f, 0.0), hb.get(f, 0.0)) for f, b in files]


def predicted_gain(coverage: float, b_rest: float, b_dest: float) -> float:
    """Gain of adding a member of this miss-byte coverage on a drive of b_dest bytes/s to drives
    serving b_rest bytes/s together (each byte read once; the slowest side sets the time)."""
    if b_rest <= 0 or b_dest <= 0:
        return 0.0
    x = min(max(coverage, 0.0), b_dest / (b_rest + b_dest))
    t = max((1 - x) / b_rest, x / b_dest)
    return (1 / b_rest) / t - 1


def choose_partial(dest: str, uses: Sequence[ShardUse], budget: int, *, share: float | None = None,
                   b_rest: float | None = None, b_dest: float | None = None, history: str = "",
                   keep: Sequence[str] = ()) -> PartialChoice:
    """The files a partial replica at `dest` holds: the shards with the most ranked miss bytes per
    byte first (ties: the model's order), each that fits in `budget` bytes, until the held shards
    carry `share` of the ranked miss bytes (None: until the budget is spent). Files without routed
    experts are never chosen (colibri and the embedded engine read them from the primary). `keep`:
    files the member already holds, preferred among equals, so a re-run does not churn."""
    order = {u.file: i for i, u in enumerate(uses)}
    kept = set(keep)
    cands = [u for u in uses if u.expert_bytes > 0]
    cands.sort(key=lambda u: (-(u.rank / u.bytes if u.bytes else 0.0), u.file not in kept, order[u.file]))
    total_rank = sum(u.rank for u in uses) or 1.0
    total_held = sum(u.held for u in uses) or 1.0
    chosen, used, got, stop = [], 0, 0.0, EVERY
    for u in cands:
        if share is not None and got / total_rank >= share:
            stop = SHARE
            break
        if used + u.bytes > budget:
            stop = BUDGET
            continue
        chosen.append(u)
        used += u.bytes
        got += u.rank
    if stop == EVERY and len(chosen) < len(cands):
        stop = BUDGET
    held_cov = sum(u.held for u in chosen) / total_held
    gain = gain_full = None
    if b_rest and b_dest:
        gain = predicted_gain(held_cov, b_rest, b_dest)
        gain_full = predicted_gain(1.0, b_rest, b_dest)
    holds = tuple(sorted((u.file for u in chosen), key=order.__getitem__))
    return PartialChoice(dest, budget, holds, used, sum(u.bytes for u in uses), got / total_rank, held_cov,
                         share, gain, gain_full, history, stop)


def choice_to_dict(c: PartialChoice) -> dict:
    return {"dest": c.dest, "budget": c.budget, "holds": list(c.holds), "bytes": c.bytes, "model_bytes": c.model_bytes,
            "coverage_rank": round(c.coverage_rank, 4), "coverage_held": round(c.coverage_held, 4),
            "share": None if c.share is None else round(c.share, 4),
            "gain": None if c.gain is None else round(c.gain, 4),
            "gain_full": None if c.gain_full is None else round(c.gain_full, 4),
            "history": c.history, "stop": c.stop}
