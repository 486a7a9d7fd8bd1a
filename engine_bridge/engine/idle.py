"""No silent idle drive (issue 11): which sources read nothing in a phase, and why. Pure.

A run's reader counts, per phase and per source, the bytes the split *gave* each source (its
pieces) and the bytes it *delivered* (`reader.readstats.PhaseStats`). A source that delivered
nothing in a phase that read something is reported as one of two kinds:

- ``split``: given nothing by the split. The engine's rule (`engines.split.split_read`) cut every
  read of the phase so that its piece was 0 blocks: a 557,056 B component (2 blocks of 256 KiB
  plus a 32 KiB tail) at 2:1:1 is 1 / 1 / 0 blocks, whatever the drives. With a plan, also when
  the plan's own prediction gives it nothing. The run did what was asked: a note, not a fault.
- ``unread``: given bytes but read nothing. The plan predicted bytes for it in the phase (the
  plan was solved for another read size than this model's, or its weights were not applied), or
  the split gave it pieces that other sources read instead (degraded, failed over, hedged). The
  run did not measure the plan asked for: `run` prints a warning and the harness's plan gate
  fails the arm.

Each entry: {"phase", "source", "path", "kind": "split" | "unread", "by": "plan" | "weights",
"planned_bytes": its bytes per read in the plan's prediction (None without one), "plan_read_bytes":
the read the plan predicted for (None without one), "read_bytes": the phase's largest read,
"piece_bytes": its piece of that read at the run's weights, "message"}.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from engines.base import Piece
from engines.registry import DEFAULT_ENGINE
from engines.split import split_read

PHASES = ("prefill", "decode")
SPLIT, UNREAD = "split", "unread"


def piece_of(read_bytes: int, weights: Sequence[int], source: int, engine: str = DEFAULT_ENGINE) -> Piece:
    """`source`'s piece of one read of `read_bytes` at `weights` (the engine's rule)."""
    if read_bytes <= 0:
        return Piece(source, 0, 0, 0)
    return split_read(0, read_bytes, list(weights), engine)[source]


def idle_sources(phases: Mapping[str, dict], weights: Mapping[str, Sequence[int]], paths: Sequence[str],
                 degraded: Sequence[bool] = (), planned: Mapping[str, dict] | None = None,
                 engine: str = DEFAULT_ENGINE) -> list[dict]:
    """The sources that read nothing in a phase that read something, each with its kind and why.

    phases: the reader's per-phase stats (`ReaderStats.to_dict()["phases"]`). weights: the run's
    weights per phase. degraded: per source, whether the reader stopped using it. planned: per
    phase, the plan's prediction {"pieces": bytes per read per source, "read_bytes": the read it
    is for}, or None (no plan, or weights other than the plan's)."""
    out = []
    for ph in PHASES:
        st = phases.get(ph)
        if not st or st["reads"] == 0:
            continue               # nothing was read in this phase: nobody was idle in it
        plan = (planned or {}).get(ph)
        w = list(weights[ph])
        for s in st["sources"]:
            i = s["index"]
            if s["bytes"] > 0:
                continue
            piece = piece_of(st["largest_read"], w, i, engine)
            planned_bytes = plan["pieces"][i] if plan else None
            why_split = (f"its piece of the phase's largest read ({st['largest_read']:,} B) at "
                         f"{':'.join(map(str, w))} is {piece.blocks} blocks ({piece.length:,} B)")
            if i < len(degraded) and degraded[i]:
                kind, msg = UNREAD, "degraded by the reader: its pieces went to the other sources"
            elif s["given_pieces"] > 0:
                kind, msg = UNREAD, (f"the split gave it {s['given_pieces']} pieces ({s['given_bytes']:,} B) that "
                                     "other sources read (failover or hedge)")
            elif plan and planned_bytes > 0:
                kind, msg = UNREAD, (f"the plan gives it {planned_bytes:,} B of each {plan['read_bytes']:,} B read, "
                                     f"but the split gave it nothing: {why_split} (re-solve the plan for this model: "
                                     "`planner solve`)")
            elif plan:
                kind, msg = SPLIT, f"given nothing by the plan's split ({plan['read_bytes']:,} B reads); {why_split}"
            else:
                kind, msg = SPLIT, f"given nothing by the split: {why_split}"
            out.append({"phase": ph, "source": i, "path": paths[i], "kind": kind, "by": "plan" if plan else "weights",
                        "planned_bytes": planned_bytes, "plan_read_bytes": plan["read_bytes"] if plan else None,
                        "read_bytes": st["largest_read"], "piece_bytes": piece.length,
                        "message": f"source[{i}] read nothing in {ph}: {msg}"})
    return out


def plan_pieces(predicted: dict, read_bytes: int | None, n: int) -> dict | None:
    """A plan phase's prediction as `idle_sources` takes it: {"pieces", "read_bytes"}, or None when
    the plan predicts no per-source bytes for `n` sources (a plan written by the harness, an old plan)."""
    shares = (predicted or {}).get("sources")
    if not isinstance(shares, list) or len(shares) != n or not read_bytes:
        return None
    try:
        pieces = [int(s["bytes"]) for s in shares]
    except (KeyError, TypeError, ValueError):
        return None
    return {"pieces": pieces, "read_bytes": int(read_bytes)}
