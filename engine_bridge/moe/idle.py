"""No silent idle drive: which sources read nothing in a phase, and why. Pure.

A run's reader counts, per phase and per source, the bytes the engine's read pattern *gave* each
source (its pieces) and the bytes it *delivered* (`reader.readstats.PhaseStats`). A source that
delivered nothing in a phase that read something is reported as one of two kinds:

- ``split``: given nothing by the engine's reads. The target engine's pattern never gave it a
  piece in the phase: ds4 cut every read so that its share was 0 blocks (a 557,056 B component
  at 2:1:1 is 1 / 1 / 0 blocks of 256 KiB), or colibri's placement sent none of the experts
  read to it (its cut of 256 was empty, or no expert read hashed into it). With a plan, the plan
  predicted it too. The run did what was asked: a note, not a fault.
- ``unread``: given bytes but read nothing, or planned bytes and given none. The plan predicted
  a share for it in the phase (the plan was solved for another model, or its weights were not
  applied), or the pattern gave it pieces that other sources read instead (degraded, failed over,
  hedged). The run did not measure the plan asked for: `run` prints a warning and the harness's
  plan gate fails the arm.

Each entry: {"phase", "source", "path", "kind": "split" | "unread", "by": "plan" | "weights",
"planned_share": its share of the phase's bytes in the plan's prediction (None without one),
"message"}.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from core.units import plural

PHASES = ("prefill", "decode")
SPLIT, UNREAD = "split", "unread"


def idle_sources(phases: Mapping[str, dict], weights: Mapping[str, Sequence[int]], paths: Sequence[str],
                 degraded: Sequence[bool] = (), planned: Mapping[str, dict] | None = None) -> list[dict]:
    """The sources that read nothing in a phase that read something, each with its kind and why.

    phases: the reader's per-phase stats (`ReaderStats.to_dict()["phases"]`). weights: the run's
    weights per phase. degraded: per source, whether the reader stopped using it. planned: per
    phase, the plan's prediction {"shares": each source's share of the bytes} (`plan_shares`), or
    None (no plan, or weights other than the plan's)."""
    out = []
    for ph in PHASES:
        st = phases.get(ph)
        if not st or st["reads"] == 0:
            continue               # nothing was read in this phase: nobody was idle in it
        plan = (planned or {}).get(ph)
        w = ":".join(map(str, weights[ph]))
        for s in st["sources"]:
            i = s["index"]
            if s["bytes"] > 0:
                continue
            share = plan["shares"][i] if plan else None
            if i < len(degraded) and degraded[i]:
                kind, msg = UNREAD, "degraded by the reader: its pieces went to the other sources"
            elif s["given_pieces"] > 0:
                kind, msg = UNREAD, (f"the engine's reads gave it {plural(s['given_pieces'], 'piece')} "
                                     f"({s['given_bytes']:,} B) that other sources read (failover or hedge)")
            elif plan and share > 0:
                kind, msg = UNREAD, (f"the plan gives it {share:.1%} of the phase's bytes, but the engine's reads of this "
                                     f"model at {w} gave it nothing (re-solve the plan for this model: `planner solve`)")
            elif plan:
                kind, msg = SPLIT, f"the engine's reads at {w} give it nothing, as the plan predicted"
            else:
                kind, msg = SPLIT, f"the engine's reads at {w} gave it nothing in the {st['reads']} reads of the phase"
            out.append({"phase": ph, "source": i, "path": paths[i], "kind": kind, "by": "plan" if plan else "weights",
                        "planned_share": share, "message": f"source[{i}] read nothing in {ph}: {msg}"})
    return out


def plan_shares(predicted: dict, n: int) -> dict | None:
    """A plan phase's prediction as `idle_sources` takes it: {"shares": each source's share of the
    phase's bytes}, or None when the plan predicts no per-source bytes for `n` sources (a plan
    written by the harness, an old plan)."""
    sources = (predicted or {}).get("sources")
    if not isinstance(sources, list) or len(sources) != n:
        return None
    try:
        nbytes = [float(s["bytes"]) for s in sources]
    except (KeyError, TypeError, ValueError):
        return None
    total = sum(nbytes)
    return {"shares": [b / total if total else 0.0 for b in nbytes]}
