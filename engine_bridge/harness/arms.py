"""The harness's pure parts: arm orders, gates, medians, gains, pair deltas and the results
shape (docs/harness.md); `summary.py` turns the results into Markdown and SVG. No processes, no disk:
the harness feeds measured facts in, these functions say what they mean.

results.json (schema 1):

    {"schema": 1, "kind": BenchResults.KIND, "created": ISO, "order": "ABBA",
     "sequence": ["A", "B", "B", "A"], "control": "A", "reference": "A",
     "settings": {"prompt_tokens", "gen_tokens", "cache_experts", "max_other_cpu", ...},
     "arms": {NAME: {"plan", "sources": [paths], "prefill_weights", "decode_weights"}},
     "rows": [{"seq", "arm", "ok", "failed": [gate names or "error"], "error", "gates": {NAME: {"ok", "detail"}},
               "wall_s", "output_sha256", "metrics": {CSV columns + hits, misses, misses_per_token,
               cache_experts, cache_experts_applied}, "sources": [...], "events": [...], "idle": [...], "log"}],
     "medians": {NAME: {"n", "n_failed", METRIC: median or null}},
     "gains": {NAME: {METRIC: median(arm) / median(control) or null}},
     "pairs": [{"arm", "seq", "control_seq", METRIC + "_delta": arm - control}],
     "claims": {NAME: {METRIC: "gain" | "loss" | "unclear"}}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import ClassVar, Sequence

from core.errors import UsageError
from core.results import Document
from core.units import plural
from engines.registry import DEFAULT_ENGINE
from planner.measured import RESULTS_SCHEMA

CSV_COLUMNS = ("ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens", "gen_tps",
               "gen_first_ms", "gen_steady_tokens", "gen_steady_tps", "kvcache_bytes")
EXTRA_METRICS = ("hits", "misses", "misses_per_token", "cache_experts", "cache_experts_applied")
# Summarised per configuration; the first three are rates where higher is better.
SUMMARY_METRICS = ("prefill_tps", "gen_tps", "gen_steady_tps", "gen_first_ms", "misses_per_token")
RATE_METRICS = ("prefill_tps", "gen_tps", "gen_steady_tps")
ORDERS = ("ABBA", "BAAB", "ABAB", "ladder")
GATES = ("sha", "cache", "plan", "swap", "load")
# The load gate's limit: cores of user-mode CPU that processes other than the harness and its arm
# may use on average during the arm. Calibrated on a 2-core VM (docs/harness.md, "Calibrating the
# load gate"): arms with nothing else running read -0.002..0.026 cores, windows with no arm at all
# 0.010..0.025; one competing `python -c 'while 1: pass'` read 0.98..1.19, two 1.32..1.55. Half a
# core fails a single busy process with a factor of two to spare and passes an idle machine twenty
# times over.
MAX_OTHER_CPU = 0.5


@dataclass(frozen=True)
class ArmSpec:
    """One configuration: which sources, with which weights. plan: the plan file it came from."""

    name: str
    sources: tuple[str, ...]
    prefill_weights: tuple[int, ...]
    decode_weights: tuple[int, ...]
    plan: str = ""
    engine: str = DEFAULT_ENGINE     # whose reads the arm performs
    switches: frozenset[str] = frozenset()   # the engine's switches on in the arm

    def to_dict(self) -> dict:
        return {"plan": self.plan, "sources": list(self.sources), "prefill_weights": list(self.prefill_weights),
                "decode_weights": list(self.decode_weights), "engine": self.engine, "switches": sorted(self.switches)}


@dataclass(frozen=True)
class Snapshot:
    """System facts taken right before and right after an arm (from /proc)."""

    t: float = 0.0              # monotonic seconds
    swap_free_kb: int = 0       # /proc/meminfo SwapFree
    pswpout: int = 0            # /proc/vmstat pages swapped out, cumulative
    cpu_busy_s: float = 0.0     # /proc/stat: all CPUs' non-idle, non-iowait time, seconds
    loadavg: float = 0.0        # 1-minute load average
    own_cpu_s: float = 0.0      # CPU seconds of the harness and its finished children
    cpu_user_s: float = 0.0     # /proc/stat: all CPUs' user + nice time (guests included), seconds
    own_user_s: float = 0.0     # user CPU seconds of the harness and its finished children


@dataclass(frozen=True)
class Gate:
    ok: bool
    detail: str


@dataclass(frozen=True)
class Row:
    seq: int
    arm: str
    result: dict | None              # the run's --json output (None when it failed to run)
    error: str = ""                  # why the run produced no result
    before: Snapshot = field(default_factory=Snapshot)
    after: Snapshot = field(default_factory=Snapshot)
    log: str = ""


def parse_arm(text: str) -> tuple[str, str]:
    """'NAME=PLAN' -> (NAME, PLAN)."""
    name, eq, ref = str(text).partition("=")
    name, ref = name.strip(), ref.strip()
    if not eq or not name or not ref:
        raise UsageError(f"--arm {text!r}: use NAME=PLAN, e.g. --arm base=plans/one.json --arm split=10:5:5/10:6:6")
    if any(c in name for c in " /,=") or name.startswith("."):
        raise UsageError(f"--arm {text!r}: the name must be a short label without spaces, '/', ',' or '='")
    return name, ref


def arm_sequence(names: Sequence[str], order: str, repeat: int = 1) -> tuple[str, ...]:
    """The run order. ABBA: arms forward then backward; BAAB: backward then forward; ABAB: forward
    twice; ladder: the first arm is the control bracketing every rung, U S1 U S2 .. U Sk then the
    mirror (Sk U .. S1 U). `repeat` repeats the whole pattern."""
    names = list(names)
    if order not in ORDERS:
        raise UsageError(f"--order {order!r}: use one of {', '.join(ORDERS)}")
    if len(names) < 2:
        raise UsageError(f"--order {order}: give at least two arms (a control and one other), got {len(names)}")
    if len(set(names)) != len(names):
        raise UsageError(f"arms {', '.join(names)}: each arm name must be given once")
    if repeat < 1:
        raise UsageError(f"--repeat {repeat}: must be at least 1")
    if order == "ABBA":
        one = names + names[::-1]
    elif order == "BAAB":
        one = names[::-1] + names
    elif order == "ABAB":
        one = names + names
    else:
        half = []
        for rung in names[1:]:
            half += [names[0], rung]
        one = half + half[::-1]
    return tuple(one * repeat)


# -- gates --------------------------------------------------------------------------------

def gate_sha(sha: str | None, reference: str | None) -> Gate:
    if not sha:
        return Gate(False, "no output_sha256")
    if reference is None:
        return Gate(False, "no reference hash (the reference arm never completed)")
    if sha != reference:
        return Gate(False, f"output {sha[:12]} differs from the reference {reference[:12]}")
    return Gate(True, f"output {sha[:12]} equals the reference")


def gate_cache(result: dict, requested: int | None) -> Gate:
    applied = result.get("cache_experts_applied")
    want = result.get("cache_experts") if requested is None else requested
    if applied is None:
        return Gate(False, "run did not report cache_experts_applied")
    if requested is None and applied <= (want or applied):
        # no --cache-experts: run's default, which a model with fewer experts caps (every arm of
        # one model the same); failing it failed every arm of a small model
        return Gate(True, f"cache {applied} experts (run's default {want}, as the model allows)")
    if applied != want:
        return Gate(False, f"cache {applied} experts applied, {want} requested")
    return Gate(True, f"cache {applied} experts as requested")


PLAN_CHANGES = ("degraded", "recovered", "reweighted")     # reader events after which reads ran another plan


def plan_changes(result: dict) -> list[str]:
    """What changed the plan during a run, from its reader events, one phrase per source: degraded
    (and recovered, for a drive that came back: the arm still ran without it for a while) and
    re-weighted (weights moved with the drives' rates); and balanced (a drive read pieces the cut gave
    another: `run --balance`). Empty: the whole run read the plan asked for."""
    events = [e for e in result.get("events") or () if e.get("kind") in PLAN_CHANGES]
    took = [(s.get("index", i), s["stolen_bytes"]) for i, s in enumerate(result.get("sources") or ())
            if s.get("stolen_bytes")]
    balanced = ["balanced: " + ", ".join(f"source {i} read {n / 1e6:.1f} MB of others' pieces" for i, n in took)] if took else []
    if not events:
        return balanced
    first = min(e.get("t_ns", 0) for e in result.get("events") or ())
    at = lambda e: run_time(result, e.get("t_ns", 0), first)  # noqa: E731
    out: list[str] = []
    for src in sorted({e.get("source", -1) for e in events if e["kind"] != "reweighted"}):
        mine = [e for e in events if e.get("source") == src and e["kind"] != "reweighted"]
        out.append(f"source {src} " + ", ".join(f"{e['kind']} at {at(e)}" for e in mine))
    rw = [e for e in events if e["kind"] == "reweighted"]
    if rw:
        last = (rw[-1].get("detail") or {}).get("new") or {}
        now = "; ".join(f"{ph} {':'.join(map(str, w))}" for ph, w in last.items())
        out.append(f"re-weighted {len(rw)} time(s) from {at(rw[0])}" + (f", last to {now}" if now else ""))
    return out + balanced


def run_time(result: dict, t_ns: int, first_ns: int | None = None) -> str:
    """A time on the reader's clock (time.monotonic_ns, its events' `t_ns`) as said of a run: from
    the start of its prefill, with the phase it fell in, when the run recorded its phases' starts
    (`started_ns`); else from `first_ns` (the run's first event)."""
    starts = [(ph, (result.get(ph) or {}).get("started_ns") or 0) for ph in ("prefill", "decode")]
    if starts[0][1] <= 0:
        return f"{(t_ns - (first_ns or 0)) / 1e9:.1f} s"
    phase = [ph for ph, s in starts if 0 < s <= t_ns]
    return f"{(t_ns - starts[0][1]) / 1e9:.2f} s" + (f" ({phase[-1]})" if phase else " (before the prefill)")


def gate_plan(result: dict, spec: ArmSpec | None) -> Gate:
    """The arm measured the plan it asked for: every source read, none degraded by the reader's
    failover (a degraded arm ran a different plan; its speed says nothing about the one asked),
    the plan never changed during the run (no source degraded, even one that recovered, and no
    re-weighting: `plan_changes`), and none read nothing in a phase it was given bytes in (the
    run's `idle` entries of kind 'unread'). A source the split gave nothing in a phase (kind
    'split') passes, named in the detail: the arm ran what was asked, and the reader of the results
    should know a drive sat out."""
    sources = result.get("sources") or []
    if not sources:
        return Gate(False, "run reported no per-source counters")
    want = len(spec.sources) if spec is not None else len(sources)
    if len(sources) != want:
        return Gate(False, f"{len(sources)} sources read, the arm has {want}")
    bad = [s.get("index", i) for i, s in enumerate(sources) if s.get("degraded")]
    if bad:
        return Gate(False, f"source(s) {', '.join(map(str, bad))} degraded during the run "
                           f"({len(result.get('events') or [])} reader events)")
    changed = plan_changes(result)
    if changed:
        return Gate(False, "plan changed during the run, so the arm measured another plan: " + "; ".join(changed))
    idle = result.get("idle") or []
    unread = [e for e in idle if e.get("kind") == "unread"]
    if unread:
        return Gate(False, "; ".join(e["message"] for e in unread))
    sat_out = "".join(f"; source {e['source']} given nothing by the split in {e['phase']}" for e in idle)
    return Gate(True, f"{plural(want, 'source')}, none degraded{sat_out}")


def gate_swap(before: Snapshot, after: Snapshot) -> Gate:
    out = after.pswpout - before.pswpout
    shrink = before.swap_free_kb - after.swap_free_kb
    if out > 0 or shrink > 0:
        return Gate(False, f"swap grew: {out} pages swapped out, SwapFree down {shrink} KiB")
    return Gate(True, "no swap growth")


def cpu_seconds(proc_stat: str, ticks_per_s: float) -> tuple[float, float]:
    """(busy, user) CPU seconds of all CPUs together from the text of /proc/stat (its aggregate
    'cpu' line; (0, 0) without one). busy: every state but idle and iowait (user nice system irq
    softirq steal); user: user + nice, which already include the time of guests."""
    for line in proc_stat.splitlines():
        if line.startswith("cpu "):
            f = [int(x) for x in line.split()[1:]] + [0] * 8
            user, nice, system, _idle, _iowait, irq, softirq, steal = f[:8]
            return (user + nice + system + irq + softirq + steal) / ticks_per_s, (user + nice) / ticks_per_s
    return 0.0, 0.0


def other_cpu(before: Snapshot, after: Snapshot) -> float:
    """Average cores of user-mode CPU used by processes other than the harness and its arm, over
    the arm.

    User mode only: the kernel's work for the arm's own reads runs in no process of ours (a loop
    device's kworkers copying from the backing file, block interrupts and softirqs) and lands in
    /proc/stat's system, irq and softirq columns; reading through a loop device at 4-5 GB/s put
    0.5-1 core there on a 2-core VM. A process competing for the CPU computes in user mode."""
    wall = after.t - before.t
    if wall <= 0:
        return 0.0
    others = (after.cpu_user_s - before.cpu_user_s) - (after.own_user_s - before.own_user_s)
    return max(0.0, others / wall)


def kernel_cpu(before: Snapshot, after: Snapshot) -> float:
    """Average cores of kernel time (system, irq, softirq, steal) not charged to the harness or its
    arm, over the arm: reported beside the gate, not gated (see other_cpu)."""
    wall = after.t - before.t
    if wall <= 0:
        return 0.0
    busy = after.cpu_busy_s - before.cpu_busy_s - (after.cpu_user_s - before.cpu_user_s)
    own = after.own_cpu_s - before.own_cpu_s - (after.own_user_s - before.own_user_s)
    return max(0.0, (busy - own) / wall)


def gate_load(before: Snapshot, after: Snapshot, max_other: float = MAX_OTHER_CPU) -> Gate:
    cores = other_cpu(before, after)
    detail = (f"others used {cores:.2f} cores in user mode (limit {max_other:.2f}); kernel "
              f"{kernel_cpu(before, after):.2f} cores not charged to the arm; load {before.loadavg:.2f} before")
    return Gate(cores <= max_other, detail)


def reference_sha(rows: Sequence[Row], reference: str) -> str | None:
    """The reference hash: the first completed run of the reference arm."""
    for r in rows:
        if r.arm == reference and r.result and r.result.get("output_sha256"):
            return r.result["output_sha256"]
    return None


def gate_row(row: Row, ref_sha: str | None, requested_cache: int | None, max_other: float,
             spec: ArmSpec | None = None) -> dict[str, Gate]:
    if row.result is None:
        return {}
    return {"sha": gate_sha(row.result.get("output_sha256"), ref_sha),
            "cache": gate_cache(row.result, requested_cache),
            "plan": gate_plan(row.result, spec),
            "swap": gate_swap(row.before, row.after),
            "load": gate_load(row.before, row.after, max_other)}


def failure_reasons(row: dict) -> list[tuple[str, str]]:
    """(gate, reason) for each gate a results row failed; ("error", why) when the arm's process
    produced no result at all."""
    if "error" in row["failed"]:
        return [("error", row["error"] or "the arm produced no result")]
    return [(name, g["detail"]) for name, g in row["gates"].items() if not g["ok"]]


def without_passing_arm(doc: dict) -> list[str]:
    """The configurations none of whose arms passed every gate: they have no median, so the run
    says nothing about them."""
    return [a for a in doc["arms"] if doc["medians"][a]["n"] == 0]


# -- summary ------------------------------------------------------------------------------

def finite_or_none(x):
    """x when it is a finite number (a metric that was measured), else None."""
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def row_dict(row: Row, gates: dict[str, Gate]) -> dict:
    res = row.result or {}
    failed = [n for n, g in gates.items() if not g.ok] if row.result is not None else ["error"]
    metrics = {k: res.get(k) for k in CSV_COLUMNS + EXTRA_METRICS}
    return {"seq": row.seq, "arm": row.arm, "ok": not failed, "failed": failed, "error": row.error,
            "gates": {n: {"ok": g.ok, "detail": g.detail} for n, g in gates.items()},
            "wall_s": round(row.after.t - row.before.t, 3) if row.after.t else None,
            "output_sha256": res.get("output_sha256"), "metrics": metrics,
            "weights": res.get("weights"), "sources": res.get("sources", []), "events": res.get("events", []),
            "idle": res.get("idle", []), "log": row.log}


def summarize(rows: Sequence[dict], arms: Sequence[str], control: str) -> dict:
    """Medians per configuration over passing rows, gains vs the control, pair deltas (each arm
    row against the nearest passing control row, earlier on a tie) and claims (a gain or a loss
    only when every pair agrees)."""
    medians = {}
    for a in arms:
        mine = [r for r in rows if r["arm"] == a]
        good = [r for r in mine if r["ok"]]
        m = {"n": len(good), "n_failed": len(mine) - len(good)}
        for k in SUMMARY_METRICS:
            vals = [v for v in (finite_or_none(r["metrics"].get(k)) for r in good) if v is not None]
            m[k] = median(vals) if vals else None
        medians[a] = m
    gains = {}
    for a in arms:
        g = {}
        for k in RATE_METRICS:
            c, x = medians[control][k], medians[a][k]
            g[k] = x / c if c and x is not None else None
        gains[a] = g
    controls = [r for r in rows if r["arm"] == control and r["ok"]]
    pairs = []
    for r in rows:
        if r["arm"] == control or not r["ok"] or not controls:
            continue
        c = min(controls, key=lambda c: (abs(c["seq"] - r["seq"]), c["seq"]))
        p = {"arm": r["arm"], "seq": r["seq"], "control_seq": c["seq"]}
        for k in RATE_METRICS:
            x, y = finite_or_none(r["metrics"].get(k)), finite_or_none(c["metrics"].get(k))
            p[k + "_delta"] = x - y if x is not None and y is not None else None
        pairs.append(p)
    claims = {}
    for a in arms:
        if a == control:
            continue
        mine = [p for p in pairs if p["arm"] == a]
        cl = {}
        for k in RATE_METRICS:
            d = [p[k + "_delta"] for p in mine if p[k + "_delta"] is not None]
            cl[k] = "gain" if d and all(x > 0 for x in d) else "loss" if d and all(x < 0 for x in d) else "unclear"
        claims[a] = cl
    return {"medians": medians, "gains": gains, "pairs": pairs, "claims": claims}


class BenchResults(Document):
    """`engine-bridge bench/ladder --json`: the run folder's results.json (`build_results`)."""

    KIND: ClassVar[str] = "bench-results"
    SCHEMA: ClassVar[int] = RESULTS_SCHEMA


def build_results(specs: Sequence[ArmSpec], order: str, sequence: Sequence[str], rows: Sequence[Row],
                  settings: dict, created: str, reference: str | None = None, control: str | None = None) -> dict:
    """The whole results.json document from the arms and the measured rows."""
    names = [s.name for s in specs]
    control = control or names[0]
    reference = reference or control
    ref = reference_sha(rows, reference)
    max_other = settings.get("max_other_cpu", MAX_OTHER_CPU)
    want_cache = settings.get("cache_experts")
    by_name = {s.name: s for s in specs}
    row_docs = [row_dict(r, gate_row(r, ref, want_cache, max_other, by_name.get(r.arm))) for r in rows]
    doc = {"schema": RESULTS_SCHEMA, "kind": "bench-results", "created": created, "order": order,
           "sequence": list(sequence), "control": control, "reference": reference, "reference_sha256": ref,
           "settings": dict(settings), "arms": {s.name: s.to_dict() for s in specs}, "rows": row_docs}
    doc.update(summarize(row_docs, names, control))
    return doc

