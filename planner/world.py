"""The user's world on one machine, as the pricing takes it (pure; docs/planner.md "RAM, the
engine's own workload, predictions end to end"):

- **RAM.** The page cache an engine's buffered reads may count on is the RAM the process runs
  under (its memory cgroup's limit, else MemTotal: `core.ram.ram_limit`) less what the engine
  keeps resident of its own (`Engine.own_workload`, or its last run's measured peak):
  `page_cache_room`. A budget of a quarter of the model leaves a buffered mode a quarter of its
  re-reads in RAM at best, not all of them; and once a buffered run under that RAM has shown what
  the page cache really served it (`measured_hits`), no more than that. That share is of all the
  run fetched, first reads included, while the page cache can only serve what the run reads
  again: the room is the share over the re-reads that run had (`hit_room`; its steps simulated
  for its own prompt and tokens, `planner.workload.run_reread_share`). Where that run's drives
  served more than it fetched (the kernel's readahead past each expert), buffered reads are priced
  at that many bytes per byte (`readahead_excess`).
- **The engine's own workload.** What its cache holds comes from its arguments (the engine's
  `own_workload`), and after a run from its own lines (`Engine.calibrate`): the expert bytes it
  read per generated token set the decode traffic (`calibrated_traffic`), the loads it kept in
  flight the pricing's concurrency, its compute seconds the end-to-end prediction.
- **End to end.** A phase's tok/s as the user feels it is its tokens over the priced read time
  plus the engine's compute for them, with the overlap the engine has (colibri with PIPE off:
  none, so the two add): `e2e`.

A calibration record (the engine's `calibrate`, kept in a plan's provenance `engine_calibration`):
window ('run': the prompt's work is inside it; 'decode': only the generated tokens'), tokens
(generated), prompt_tokens, bytes_read (expert bytes over the window), cache_per_layer,
in_flight, overlap (whether reads overlap compute), compute_s, wait_s, run_s, and the engine's own
figures under `lines`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

CALIBRATION_SCHEMA = 1


def page_cache_room(ram_bytes: int, resident_bytes: int) -> int:
    """Bytes of the model the page cache can keep: the RAM less the engine's own (0 at least).
    RAM unknown (0): 0, every read priced from a drive."""
    return max(0, int(ram_bytes) - int(resident_bytes)) if ram_bytes > 0 else 0


def hits_record(cal: Mapping) -> Mapping:
    """The record whose reads say what the page cache served: the run's own when it read buffered,
    else the buffered runs it carries (`buffered_run`, the real-engine tuner's other arms, its
    winner reading with O_DIRECT)."""
    if not cal.get("buffered") and isinstance(cal.get("buffered_run"), Mapping):
        return cal["buffered_run"]
    return cal


def served_ratio(cal: Mapping, ram_bytes: int, once_bytes: int = 0) -> float | None:
    """What the drives served a buffered run (`storage_bytes`, the kernel's count of the engine's
    storage reads) per byte of experts the engine says it fetched (`bytes_read`), less the model's
    bytes outside its routed experts, which the engine reads once (`once_bytes`: its dense weights,
    kept in RAM), for a run whose reads were buffered under the same RAM (within 5 %: it holds only
    for the RAM it was measured in); for a run that read with O_DIRECT, the buffered runs the
    record carries (`hits_record`). Below 1 the page cache served part of the fetches; above 1 the
    kernel's readahead read past them. None when the record cannot say."""
    cal = hits_record(cal)
    served, fetched, ram = cal.get("storage_bytes"), cal.get("bytes_read"), cal.get("ram_bytes")
    if not cal.get("buffered") or not isinstance(served, int) or not isinstance(fetched, (int, float)) or fetched <= 0:
        return None
    if not isinstance(ram, int) or ram <= 0 or ram_bytes <= 0 or abs(ram - ram_bytes) > 0.05 * ram_bytes:
        return None
    return max(0.0, served - max(0, once_bytes)) / fetched


def measured_hits(cal: Mapping, ram_bytes: int, once_bytes: int = 0) -> float | None:
    """The share of the bytes a buffered run fetched that the page cache served it: 1 - `served_ratio`
    (0 where the drives served more than it fetched). None when the record cannot say."""
    ratio = served_ratio(cal, ram_bytes, once_bytes)
    return None if ratio is None else min(1.0, max(0.0, 1.0 - ratio))


def readahead_excess(cal: Mapping, ram_bytes: int, once_bytes: int = 0) -> float:
    """What a buffered run's drives served beyond what it fetched, as a share of it (`served_ratio`
    less 1): the kernel's readahead past the experts' bytes, which buffered reads pay for and
    O_DIRECT reads do not. 0 where the page cache served more than the readahead added (the two
    cannot be told apart then) or the record cannot say."""
    ratio = served_ratio(cal, ram_bytes, once_bytes)
    return max(0.0, ratio - 1.0) if ratio is not None else 0.0


def reread_share(steps, fresh) -> float:
    """The share of the experts a run's `steps` read that it had read before in the run (what a
    page cache can serve): 1 - the experts of `fresh` (the same steps without those read before)
    over all of theirs. 1.0 when nothing was read."""
    every = sum(len(st.experts) for st in steps)
    return 1.0 - sum(len(st.experts) for st in fresh) / every if every > 0 else 1.0


def hit_room(hits: float, reread: float) -> float:
    """The share of the model's routed bytes the page cache holds for a run that measured `hits`
    (the share of all it fetched the page cache served) and read `reread` of what it fetched a
    second time (that run's own share: a short run reads more for the first time than a long one):
    hits / reread, at most all of it."""
    return min(1.0, hits / reread) if reread > 0 else 1.0


def calibrated_misses(cal: Mapping, expert_bytes: int, prefill_experts: float) -> float | None:
    """Experts read per generated token, from the run's expert bytes: over a 'run' window the
    prompt's reads (`prefill_experts`, the workload's for the same prompt) come off first. None
    when the record cannot say."""
    tokens, read = cal.get("tokens"), cal.get("bytes_read")
    if not isinstance(tokens, int) or tokens < 1 or not isinstance(read, (int, float)) or expert_bytes <= 0:
        return None
    experts = read / expert_bytes
    if cal.get("window") == "run":
        experts -= prefill_experts
    return max(0.0, experts / tokens)


def calibrated_traffic(traffic, layers: int, expert_bytes: int, cal: Mapping):
    """The workload's traffic with the decode's experts per token the engine's run read (source
    'engine'); unchanged when the record says nothing of them."""
    m = calibrated_misses(cal, expert_bytes, traffic.experts_per_layer * layers)
    if m is None:
        return traffic
    return replace(traffic, misses_per_token=m, source="engine")


def compute_per_token(cal: Mapping) -> dict[str, float]:
    """{phase: the engine's compute seconds per token of the phase}: over a 'run' window the
    prompt's compute is inside the generated tokens' (the engine times them as one), so it is
    all charged to decode and prefill gets 0. {} when the record has no compute."""
    c, tokens = cal.get("compute_s"), cal.get("tokens")
    if not isinstance(c, (int, float)) or not isinstance(tokens, int) or tokens < 1:
        return {}
    return {"prefill": 0.0, "decode": float(c) / tokens}


def run_seconds(predicted: Mapping[str, Mapping], prompt: int, gen: int, key: str = "seconds") -> float | None:
    """Seconds of a 'run' window — `prompt` tokens prefilled, `gen` generated — at each phase's
    seconds per token from its prediction (`key`: "seconds" reads only, "e2e_seconds" end to end).
    None when the window has no generated token or a phase it needs has no prediction."""
    per = {}
    for ph in ("prefill", "decode"):
        p = predicted.get(ph) or {}
        t, s = float(p.get("tokens") or 0.0), float(p.get(key) or 0.0)
        per[ph] = s / t if t > 0 and s > 0 else None
    if not gen or per["decode"] is None or (prompt and per["prefill"] is None):
        return None
    return (prompt or 0) * (per["prefill"] or 0.0) + gen * per["decode"]


def e2e(pred: dict, compute_s_per_token: float, overlap: bool = False) -> dict:
    """The phase's prediction with the end-to-end figures beside the reads-only ones: compute_s
    (the engine's compute for the phase's tokens), e2e_seconds (reads and compute added, or the
    larger of the two where the engine overlaps them) and e2e_tok_s."""
    tokens, reads = float(pred.get("tokens") or 0), float(pred.get("seconds") or 0.0)
    comp = compute_s_per_token * tokens
    total = max(reads, comp) if overlap else reads + comp
    return {**pred, "compute_s": comp, "e2e_seconds": total, "e2e_tok_s": tokens / total if total > 0 else 0.0,
            "overlap": "reads overlap compute" if overlap else "none: reads, then compute"}
