"""Replay: the engine's reads without its compute, on any model and these drives.

The expert geometry comes from the model's tensor table (only headers are read, so this works on
the real 518 GB file; `replay_geometry`), and each expert's reads are Extents in the model's files
(a split GGUF set or a directory of shards is read like one file); which experts each token chooses comes from the calibrated
routing model (`models.routing`) or from a recorded routing trace (`engine-bridge run --trace-out`).
The same expert cache and the same staging code as the engine (`staging.stage_reads`) drive the
same split reader, so the read pattern, and therefore what a plan delivers on these drives, is
the engine's: prefill stages each chunk's union of missing experts, decode reads each token's
misses behind a per-layer barrier.
"""

from __future__ import annotations

import time
from typing import ClassVar, Optional

import numpy as np

from core.errors import RigError, UsageError
from core.results import Document
from core.jsonfile import read_json
from models.routing import Router, RoutingModel
from models.modelset import FILE, ModelSet
from models.tensortable import inspect_model as inspect_any

from models.cache import ExpertCache
from .idle import PHASES, idle_sources
from .constants import PREFILL_CHUNK_TOKENS, REPLAY_SCHEMA, STAGE_WINDOW, TRACE_SCHEMA
from .resident import Geometry
from .inputs import SourceSet
from .staging import PhaseCounters, stage_reads


class ReplayResults(Document):
    """`engine-bridge replay --json`: the replay's results (kind "replay")."""

    KIND: ClassVar[str] = "replay"
    SCHEMA: ClassVar[int] = REPLAY_SCHEMA


def load_trace(path: str) -> dict:
    """A routing trace written by `run --trace-out`: {"schema", "kind": "routing-trace", "layers",
    "experts", "top_k", "steps": [{"phase": "prefill"|"decode", "layers": [[[ids] per token] per layer]}]}.
    Missing is MissingError (exit 3); anything else wrong is one RigError line (exit 2)."""
    remedy = "record one with `engine-bridge run --trace-out FILE`"
    d = read_json(path, "routing-trace", remedy, schema=TRACE_SCHEMA, what="routing trace")
    for k in ("layers", "experts", "top_k"):
        if not isinstance(d.get(k), int) or isinstance(d.get(k), bool) or d[k] < 1:
            raise RigError(f"{path}: key '{k}' must be a positive integer; {remedy}")
    if not isinstance(d.get("steps"), list) or not d["steps"]:
        raise RigError(f"{path}: key 'steps' is missing or empty; {remedy}")
    return d


def trace_steps(d: dict, path: str):
    """Yield (phase, selections (n, layers, k) int array) from a loaded trace, checked."""
    for i, st in enumerate(d["steps"]):
        if not isinstance(st, dict) or st.get("phase") not in ("prefill", "decode"):
            raise UsageError(f"{path}: steps[{i}].phase must be 'prefill' or 'decode'")
        try:
            a = np.asarray(st["layers"], dtype=np.int64)          # (layers, n, k)
        except (KeyError, ValueError, TypeError):
            raise UsageError(f"{path}: steps[{i}].layers must be [[[expert ids] per token] per layer]") from None
        if a.ndim != 3 or a.shape[0] != d["layers"] or a.shape[2] != d["top_k"] or a.min() < 0 or a.max() >= d["experts"]:
            raise UsageError(f"{path}: steps[{i}].layers has shape {a.shape}; expected ({d['layers']}, tokens, {d['top_k']}) "
                             f"with ids below {d['experts']}")
        yield st["phase"], a.transpose(1, 0, 2)


def model_steps(router: Router, prompt: int, gen: int, chunk: int):
    for s in range(0, prompt, chunk):
        yield "prefill", router.next(min(chunk, prompt - s))
    for _ in range(gen):
        yield "decode", router.next(1)


def replay_steps(g: Geometry, steps, layers: int, cache: ExpertCache, submit_read, reads_of,
                 window: int = STAGE_WINDOW, in_flight: dict | None = None) -> dict:
    """Drive the cache and the reader through the steps: the target engine's reads of each step
    (`reads_of`, a `staging.StepReads`) through `submit_read`; returns counters per phase (pure of
    I/O but for `submit_read`)."""
    ph = {"prefill": PhaseCounters(), "decode": PhaseCounters()}
    tokens = {"prefill": 0, "decode": 0}
    unions: list[int] = []
    steps_s: list[float] = []
    for phase, sel in steps:
        c = ph[phase]
        c.started_ns = c.started_ns or time.monotonic_ns()
        t0 = time.perf_counter()
        for layer in range(layers):
            base = layer * g.experts
            union, counts = np.unique(sel[:, layer], return_counts=True)
            if phase == "prefill":
                unions.append(int(union.size))
            cache.select(union + base, counts)
            missing = [int(e) for e in union if not cache.resident[base + e]]
            cache.count_misses([base + e for e in missing])
            c.hits += int(union.size) - len(missing)
            c.misses += len(missing)
            for e, _bufs, release in stage_reads(submit_read, reads_of, g, layer, missing, phase, c, window,
                                                 (in_flight or {}).get(phase)):
                release()
                cache.admit(base + e)
        cache.advance(sel.shape[0])
        dt = time.perf_counter() - t0
        c.seconds += dt
        tokens[phase] += sel.shape[0]
        if phase == "decode":
            steps_s.append(dt)
    return {"counters": ph, "tokens": tokens, "unions": unions, "step_seconds": steps_s}


def replay_geometry(model: ModelSet) -> Geometry:
    """The expert geometry replay stages, from the primary's headers: any model whose routed
    experts the tensor table shows (a GGUF file or split set, stacked or one tensor per expert; a
    safetensors directory), since staging reads each expert's Extents wherever they are. Only
    `run`, which computes, needs the engine's own model (`model.inspect_model`). A one-file model
    is looked at afresh: a rig written before models could be several files does not say its format."""
    return inspect_any(model.path if model.layout == FILE else model)


def replay(sources: SourceSet, prompt: int, gen: int, cache_experts: int, reader=None,
           chunk_tokens: int = PREFILL_CHUNK_TOKENS, routing_seed: int = 0, trace_path: Optional[str] = None,
           cold: bool = True) -> dict:
    """Replay a run's expert reads against `sources` (the primary's geometry); returns the replay
    result (REPLAY_SCHEMA). reader: the split reader's `ReaderSettings` (default `EMBEDDED`, as in
    `run`: hedging, re-weighting and balancing on)."""
    from engine_bridge.reader import SplitReader
    from engine_bridge.reader.settings import EMBEDDED

    from .session import frozen_heap, phase_dict

    reader = EMBEDDED if reader is None else reader

    g = replay_geometry(sources.models[0])
    for name, v, lo in (("--prompt-tokens", prompt, 1), ("--gen-tokens", gen, 0), ("--cache-experts", cache_experts, 0),
                        ("--chunk-tokens", chunk_tokens, 1)):
        if v < lo:
            raise UsageError(f"{name} {v}: must be at least {lo}")
    if trace_path:
        d = load_trace(trace_path)
        if (d["layers"], d["experts"]) != (g.layers, g.experts):
            raise UsageError(f"{trace_path}: trace is for {d['layers']} layers x {d['experts']} experts, the model has "
                             f"{g.layers} x {g.experts}; record the trace on this model's geometry")
        steps = list(trace_steps(d, trace_path))
        routing = {"trace": trace_path}
    else:
        rm = RoutingModel(g.layers, g.experts, g.top_k, seed=routing_seed)
        steps = model_steps(Router(rm), prompt, gen, chunk_tokens)
        routing = {"model": {"sigma": rm.sigma, "tau": rm.tau, "rho": rm.rho, "seed": rm.seed}}
    total = g.layers * g.experts
    applied = min(cache_experts, total)
    cache = ExpertCache(applied, total)
    holds = sources.holds()
    with SplitReader(sources.models, sources.prefill, sources.decode, settings=reader, cold=cold,
                     engine=sources.engine, holds=holds) as split:
        with frozen_heap():
            out = replay_steps(g, steps, g.layers, cache, split.submit_read,
                               sources.step_reads(g, split.healthy, holds, split.weights_now),
                               in_flight=sources.in_flight())
        reader_stats = split.stats()
        stats = reader_stats.to_dict()
        text = split.format_stats()
        lanes, hedging = split.settings.lanes, split.settings.to_dict()
    pre, dec = out["counters"]["prefill"], out["counters"]["decode"]
    tp, td = out["tokens"]["prefill"], out["tokens"]["decode"]
    steps_s = out["step_seconds"]

    weights = {"prefill": list(sources.prefill), "decode": list(sources.decode)}

    def rate(n, s):
        return round(n / s, 3) if s > 0 and n else 0.0

    return {
        "schema": REPLAY_SCHEMA,
        "kind": ReplayResults.KIND,
        "ctx_tokens": tp + td,
        "prefill_tokens": tp,
        "prefill_tps": rate(tp, pre.seconds),
        "gen_tokens": td,
        "gen_tps": rate(td, dec.seconds),
        "gen_first_ms": round(steps_s[0] * 1000, 3) if steps_s else 0.0,
        "gen_steady_tokens": max(0, td - 1),
        "gen_steady_tps": rate(td - 1, sum(steps_s[1:])),
        "kvcache_bytes": 0,
        "prefill_read_gbps": round(pre.bytes / pre.seconds / 1e9, 4) if pre.seconds > 0 else 0.0,
        "decode_read_gbps": round(dec.bytes / dec.seconds / 1e9, 4) if dec.seconds > 0 else 0.0,
        "coverage": round(float(np.mean(out["unions"])) / g.experts, 4) if out["unions"] else 0.0,
        "cache_experts": cache_experts,
        "cache_experts_applied": applied,
        "hits": pre.hits + dec.hits,
        "misses": pre.misses + dec.misses,
        "misses_per_token": round(dec.misses / td, 4) if td else 0.0,
        "engine": sources.engine,
        "switches": sorted(sources.switches),
        "weights": weights,
        "sources": stats["sources"],
        "events": stats["events"],
        "routing": routing,
        "lanes": lanes,
        **hedging,
        "weights_now": stats["weights_now"],
        "reweighs": stats["reweighs"],
        "model": g.as_dict(),
        "prefill": phase_dict(pre, stats["phases"]["prefill"]),
        "decode": phase_dict(dec, stats["phases"]["decode"]),
        "planned": {ph: sources.planned.get(ph) for ph in PHASES},
        "idle": idle_sources(stats["phases"], weights, sources.paths, [s.degraded for s in reader_stats.sources],
                             sources.planned),
        "reader": {"reads": stats["reads"], "bytes": stats["bytes"], "text": text},
        "expert_misses": cache.miss_counts.reshape(g.layers, g.experts),
    }


class _Unread:
    """A read that is not made: `pattern_bytes` counts pieces, it reads nothing."""

    def __init__(self, n: int):
        self._view = memoryview(bytearray(n))

    def result(self) -> memoryview:
        return self._view

    def release(self) -> None:
        pass


def pattern_bytes(g: Geometry, steps, cache_experts: int, reads_of, in_flight: dict | None = None) -> dict:
    """Per phase, the bytes each source reads when the engine behind `reads_of` (a
    `staging.StepReads`) performs these routing steps from a cold cache of `cache_experts`,
    counted from its patterns without a read: what a run of the same routing must have read."""
    n = len(reads_of.weights["prefill"])
    got = {ph: [0] * n for ph in PHASES}

    def submit(read, phase):
        for p in read.pieces:
            got[phase][p.source] += p.length
        return _Unread(read.length)

    replay_steps(g, steps, g.layers, ExpertCache(min(cache_experts, g.layers * g.experts), g.layers * g.experts),
                 submit, reads_of, in_flight=in_flight)
    return got
