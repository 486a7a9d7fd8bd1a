"""What a partial replica holds (pure): the model's shards ranked by the miss bytes they carry,
chosen within a byte budget so that the replica's share of the miss bytes matches its optimal
bandwidth share (docs/replicas.md, "Partial replicas").

The unit is a whole file of the model: colibri finds a mirror's shard by its name and reads a
shard the mirror lacks from the primary (c/st.h `st_mirror_add`), and the embedded engine's
reader opens a source's files one by one, so a file is what both can use. What a set of files
serves is the engine's own rule (`Engine.replica_serves`: colibri's GLM engine serves an expert
only when the mirror holds its anchor tensor's shard, DeepSeek V4 per shard, V4.1 per tensor,
GLM-5.3 only whole experts); the shards are added greedily by the miss bytes each adds per byte.

With hash placement a member of coverage c and weight share s serves about s*c of the expert bytes;
it can serve at most c (every expert it holds). Its optimal share is its bandwidth over the rig's,
B_d / (B_rest + B_d): holding more than that share of the miss bytes buys nothing, holding less
loses speed. `predicted_gain` is that bandwidth model (the planner's plan is the exact price).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

BUDGET, SHARE, EVERY, NOTHING = "budget", "share reached", "every shard", "nothing more to serve"


@dataclass(frozen=True)
class ShardUse:
    """One file of the model as a partial replica sees it."""
    file: str                 # relative path in the model
    bytes: int                # the file's size
    expert_bytes: int         # routed expert bytes in it


@dataclass(frozen=True)
class ExpertTable:
    """Per routed expert (any fixed order): the files its components sit in, its events in the
    ranking and held-out parts of the history, its bytes, and `served(i, files)`: the bytes of
    expert i a replica holding `files` serves when the engine routes it there."""
    files: tuple[frozenset[str], ...]
    rank: tuple[float, ...]
    held: tuple[float, ...]
    bytes: tuple[int, ...]
    served: Callable[[int, frozenset[str]], int]


@dataclass(frozen=True)
class PartialChoice:
    """What one destination of `sync --partial` holds, and what that is predicted to buy."""
    dest: str
    budget: int                       # bytes
    holds: tuple[str, ...]            # relative paths, the model's order
    bytes: int                        # bytes of those files
    model_bytes: int                  # bytes of the whole model
    coverage_rank: float              # share of the ranking part's miss bytes the held files serve
    coverage_held: float              # ... of the held-out part (the honest figure)
    share: float | None               # the drive's optimal bandwidth share (None: ceilings not measured)
    gain: float | None                # predicted gain over the rig without this member (0.25 = +25 %)
    gain_full: float | None           # ... of a full replica on the same drive
    history: str                      # how the shards were ranked
    stop: str                         # budget / share reached / every shard


def predicted_gain(coverage: float, b_rest: float, b_dest: float) -> float:
    """Gain of adding a member of this miss-byte coverage on a drive of b_dest bytes/s to drives
    serving b_rest bytes/s together (each byte read once; the slowest side sets the time)."""
    if b_rest <= 0 or b_dest <= 0:
        return 0.0
    x = min(max(coverage, 0.0), b_dest / (b_rest + b_dest))
    t = max((1 - x) / b_rest, x / b_dest)
    return (1 / b_rest) / t - 1


def coverage(table: ExpertTable, files: frozenset[str], part: str = "held") -> float:
    """Share of a part's miss bytes (events x expert bytes) a replica holding `files` serves."""
    counts = table.held if part == "held" else table.rank
    total = sum(c * b for c, b in zip(counts, table.bytes))
    if not total:
        return 0.0
    return sum(c * table.served(i, files) for i, c in enumerate(counts) if c and files & table.files[i]) / total


def choose_partial(dest: str, uses: Sequence[ShardUse], table: ExpertTable, budget: int, *,
                   share: float | None = None, b_rest: float | None = None, b_dest: float | None = None,
                   history: str = "", keep: Sequence[str] = ()) -> PartialChoice:
    """The files a partial replica at `dest` holds: greedily, the shard adding the most ranked miss
    bytes (as the engine would serve them) per byte that still fits in `budget` bytes (ties: a file
    the member already holds, so a re-run does not churn, then the model's order), until the held
    shards serve `share` of the ranked miss bytes (None: until the budget is spent or nothing
    adds). Files without routed experts are never chosen (the engines read them from the primary)."""
    order = {u.file: i for i, u in enumerate(uses)}
    size = {u.file: u.bytes for u in uses}
    kept = set(keep)
    touching: dict[str, list[int]] = {}
    for i, fs in enumerate(table.files):
        for f in fs:
            touching.setdefault(f, []).append(i)
    total_rank = sum(c * b for c, b in zip(table.rank, table.bytes)) or 1.0
    cur = [0] * len(table.files)                  # bytes of each expert the chosen files serve
    chosen: set[str] = set()
    used, got, stop = 0, 0.0, EVERY
    left = [u.file for u in uses if u.expert_bytes > 0]
    while left:
        if share is not None and got / total_rank >= share:
            stop = SHARE
            break
        best = None
        for f in left:
            if used + size[f] > budget:
                continue
            with_f = frozenset(chosen | {f})
            gain = sum(table.rank[i] * (table.served(i, with_f) - cur[i]) for i in touching.get(f, ()))
            key = (gain / size[f] if size[f] else 0.0, f in kept, -order[f])
            if best is None or key > best[0]:
                best = (key, f, gain)
        if best is None:
            stop = BUDGET
            break
        _, f, gain = best
        if gain <= 0:                  # what is left carries no ranked miss: more would be wasted space
            stop = NOTHING
            break
        chosen.add(f)
        left.remove(f)
        used += size[f]
        got += gain
        held = frozenset(chosen)
        for i in touching.get(f, ()):
            cur[i] = table.served(i, held)
    held = frozenset(chosen)
    held_cov = coverage(table, held, "held")
    gain = gain_full = None
    if b_rest and b_dest:
        gain = predicted_gain(held_cov, b_rest, b_dest)
        gain_full = predicted_gain(1.0, b_rest, b_dest)
    holds = tuple(sorted(chosen, key=order.__getitem__))
    return PartialChoice(dest, budget, holds, used, sum(u.bytes for u in uses), got / total_rank, held_cov,
                         share, gain, gain_full, history, stop)


def choice_to_dict(c: PartialChoice) -> dict:
    return {"dest": c.dest, "budget": c.budget, "holds": list(c.holds), "bytes": c.bytes, "model_bytes": c.model_bytes,
            "coverage_rank": round(c.coverage_rank, 4), "coverage_held": round(c.coverage_held, 4),
            "share": None if c.share is None else round(c.share, 4),
            "gain": None if c.gain is None else round(c.gain, 4),
            "gain_full": None if c.gain_full is None else round(c.gain_full, 4),
            "history": c.history, "stop": c.stop}
