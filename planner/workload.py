"""The reads a model issues in each phase: from its geometry, the engine and the settings. Pure.

A plan is only as good as the workload it is solved for. The drive curves answer "how long does
this read take"; this module answers "which reads": how big, how many at once, and how many per
layer, for the rig's own model rather than one fixed model.

- The model's *shape* comes from its header (`models.geometry`): layers with routed experts,
  experts per layer, experts per token, the component read size (the largest slice), components
  per expert and bytes per expert.
- Its *traffic* comes from the routing model (`models.routing`, calibrated to DESIGN §7) and the
  engine's cache policy, simulated without reads: the experts per layer a prefill of N tokens
  reads (each chunk stages its union of selected experts that are not cached) and the misses per
  decoded token for a cache of C experts after warm-up. On V4.1's geometry the simulation gives
  DESIGN §7's figures within PREFILL_TOLERANCE / MISSES_TOLERANCE (tests/planner/test_workload.py).
- The *engine* sets the read shapes: ds4 stages prefill in PREFILL_CHUNK reads with
  PREFILL_LANES in flight per drive and reads each missed expert as one component read per
  component, cut by the decode weights, through a pool of DECODE_THREADS
  (`engines.ds4_argodrive`). colibri reads each missed expert whole, from the drive its placement
  picks, with READ_THREADS loads in flight (`ColibriWorkload`, priced by `planner.colibri_model`).

The field's own numbers stay available as the named workload `ds4-v41` (planner/constants.py),
for planning that model from a header alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

from core.errors import UsageError
from engines.colibri import NAME as COLIBRI
from engines.ds4_argodrive import COMPONENT_BYTES, DECODE_THREADS, PREFILL_CHUNK, PREFILL_LANES
from models.cache import ExpertCache
from models.routing import Router, RoutingModel

from .colibri_model import READ_THREADS, ColibriWorkload
from .constants import (
    CACHE_EXPERTS,
    CACHE_FRACTION,
    DECODE_MISSES_PER_TOKEN,
    EXPERT_BYTES,
    LAYERS,
    PREFILL_EXPERTS_PER_LAYER,
    PREFILL_TOKENS,
    ROUTING_CHUNK_TOKENS,
    ROUTING_MEASURE_TOKENS,
    ROUTING_SEED,
    ROUTING_WARM_TOKENS,
    V41_EXPERTS,
    V41_NAME,
    V41_TOP_K,
)
from .model import Workload, decode_workload, prefill_workload


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a model's geometry (bytes, counts)."""
    name: str                 # the model's path, or a named workload
    layers: int               # layers with routed experts
    experts: int              # routed experts per layer
    top_k: int                # experts chosen per token
    component_bytes: int      # the decode read: the largest component slice
    components: int           # component reads per expert (3: gate, up, down; 2 with a fused gate_up)
    expert_bytes: int         # all components of one expert

    @classmethod
    def from_geometry(cls, g) -> ModelShape:
        """From a `models.geometry.Geometry`."""
        return cls(g.path, g.layers, g.experts, g.top_k, g.component_bytes, len(g.components), g.expert_bytes)


@dataclass(frozen=True)
class Traffic:
    """How many experts each phase reads, per layer and per token."""
    prompt_tokens: int            # the prompt the prefill figure is for
    experts_per_layer: float      # experts a prefill of prompt_tokens reads per layer
    cache_experts: int            # the decode cache, experts
    misses_per_token: float       # experts read per decoded token (all layers), after warm-up
    source: str                   # 'routing-model' (simulated) or 'field' (DESIGN §7, measured)


@dataclass(frozen=True)
class ModelWorkload:
    """The workload a plan is solved for: the model, its traffic and each phase's reads."""
    name: str                     # 'model' (the rig's, from its header) or a named workload
    engine: str
    shape: ModelShape
    traffic: Traffic
    prefill: Workload
    decode: Workload
    colibri: ColibriWorkload | None = None   # colibri's reads (engine colibri), else None

    def as_dict(self) -> dict:
        """The plan's `workload` block (`modelled_as`: the engine whose reads were predicted,
        now always the engine itself; kept so older readers find it)."""
        if self.colibri is not None:
            c = self.colibri
            phases = {"prefill": {"read_bytes": c.expert_bytes, "in_flight": c.threads, "reads_per_layer": c.prefill_reads,
                                  "block": c.block, "stripe_window": c.window},
                      "decode": {"read_bytes": c.expert_bytes, "in_flight": c.threads, "reads_per_layer": c.misses_per_layer,
                                 "top_k": c.top_k, "stripe_window": c.window}}
        else:
            phases = {"prefill": _workload_dict(self.prefill), "decode": _workload_dict(self.decode)}
        return {"name": self.name, "engine": self.engine, "modelled_as": self.engine, "traffic": asdict(self.traffic),
                **phases}


def _workload_dict(w: Workload) -> dict:
    d = {"read_bytes": w.read_bytes, "in_flight": w.in_flight, "batches_per_layer": w.batches_per_layer}
    if w.phase == "decode":
        d["threads"] = w.threads
    return d


# The Workload fields a plan's provenance 'model' records per phase besides the read shape, so the
# tuner predicts what `planner solve` predicted.
TRAFFIC_KEYS = ("layers", "expert_bytes", "experts_per_layer", "misses_per_token")


def traffic_of(w: Workload) -> dict:
    return {k: getattr(w, k) for k in TRAFFIC_KEYS}


def traffic_kw(d) -> dict:
    """Workload keyword arguments from a recorded phase (older plans record none: ds4-v41's)."""
    return {k: (int if k in ("layers", "expert_bytes") else float)(d[k]) for k in TRAFFIC_KEYS if k in d}


V41_SHAPE = ModelShape(V41_NAME, LAYERS, V41_EXPERTS, V41_TOP_K, COMPONENT_BYTES, 3, EXPERT_BYTES)
V41_TRAFFIC = Traffic(PREFILL_TOKENS, PREFILL_EXPERTS_PER_LAYER, CACHE_EXPERTS, DECODE_MISSES_PER_TOKEN, "field")
NAMED = {V41_NAME: (V41_SHAPE, V41_TRAFFIC)}


# ---------------------------------------------------------------------------------------------
# Traffic from the routing model

def _step(cache: ExpertCache, sel: np.ndarray, experts: int) -> int:
    """One step of selections (tokens, layers, k) through the cache, layer by layer as the engine
    goes; returns the experts read (misses)."""
    misses = 0
    for layer in range(sel.shape[1]):
        base = layer * experts
        union, counts = np.unique(sel[:, layer], return_counts=True)
        cache.select(union + base, counts)
        for e in union[~cache.resident[union + base]]:
            cache.admit(base + int(e))
            misses += 1
    cache.advance(sel.shape[0])
    return misses


@lru_cache(maxsize=32)
def simulate(layers: int, experts: int, top_k: int, prompt_tokens: int, cache_experts: int,
             chunk_tokens: int = ROUTING_CHUNK_TOKENS, warm: int = ROUTING_WARM_TOKENS,
             measure: int = ROUTING_MEASURE_TOKENS, seed: int = ROUTING_SEED) -> tuple[float, float]:
    """(experts read per layer by a cold prefill of prompt_tokens in chunks, misses per decoded
    token over `measure` tokens after `warm`), through the engine's cache policy."""
    router = Router(RoutingModel(layers, experts, top_k, seed=seed))
    cache = ExpertCache(min(cache_experts, layers * experts), layers * experts)
    read = 0
    for s in range(0, prompt_tokens, chunk_tokens):
        read += _step(cache, router.next(min(chunk_tokens, prompt_tokens - s)), experts)
    for _ in range(warm):
        _step(cache, router.next(1), experts)
    missed = sum(_step(cache, router.next(1), experts) for _ in range(measure))
    return read / layers, missed / max(1, measure)


def default_cache(shape: ModelShape) -> int:
    """The cache a plan assumes unless told: ds4-v41's fraction of all routed experts."""
    return max(1, round(CACHE_FRACTION * shape.layers * shape.experts))


def simulate_traffic(shape: ModelShape, prompt_tokens: int = PREFILL_TOKENS, cache_experts: int | None = None) -> Traffic:
    if prompt_tokens < 1:
        raise UsageError(f"--prompt-tokens {prompt_tokens}: must be at least 1")
    cache = default_cache(shape) if cache_experts is None else cache_experts
    if cache < 0:
        raise UsageError(f"--cache-experts {cache}: must be at least 0")
    per_layer, misses = simulate(shape.layers, shape.experts, shape.top_k, prompt_tokens, cache)
    return Traffic(prompt_tokens, per_layer, cache, misses, "routing-model")


# ---------------------------------------------------------------------------------------------
# Each phase's reads, per engine

def phase_workloads(engine: str, shape: ModelShape, traffic: Traffic, lanes: int = PREFILL_LANES,
                    batch: int | None = None, threads: int | None = DECODE_THREADS) -> tuple[Workload, Workload]:
    """(prefill, decode) Workloads: what ds4 reads for this model and traffic (colibri's reads are
    `colibri_workload`'s). `batch`: component reads issued together per missed expert (default:
    the model's components); `threads`: ds4's pread pool (None: DECODE_THREADS)."""
    model = dict(layers=shape.layers, expert_bytes=shape.expert_bytes, experts_per_layer=traffic.experts_per_layer,
                 misses_per_token=traffic.misses_per_token)
    return (prefill_workload(lanes, PREFILL_CHUNK, **model),
            decode_workload(batch or shape.components, threads or DECODE_THREADS, shape.component_bytes, **model))


def colibri_workload(shape: ModelShape, traffic: Traffic, threads: int | None = None) -> ColibriWorkload:
    """colibri's reads of this model: whole experts (all components, one read each), the prefill's
    and decode's expert reads per layer from the traffic, `threads` loads in flight (None:
    READ_THREADS)."""
    return ColibriWorkload(shape.layers, shape.experts, shape.top_k, shape.expert_bytes, traffic.experts_per_layer,
                           traffic.misses_per_token, threads or READ_THREADS)


def _assemble(name: str, engine: str, shape: ModelShape, traffic: Traffic, lanes: int, batch: int | None,
              threads: int | None) -> ModelWorkload:
    if engine == COLIBRI:
        pre, dec = phase_workloads(engine, shape, traffic, lanes, batch)
        return ModelWorkload(name, engine, shape, traffic, pre, dec, colibri_workload(shape, traffic, threads))
    pre, dec = phase_workloads(engine, shape, traffic, lanes, batch, threads)
    return ModelWorkload(name, engine, shape, traffic, pre, dec)


def model_workload(engine: str, shape: ModelShape, prompt_tokens: int = PREFILL_TOKENS,
                   cache_experts: int | None = None, lanes: int = PREFILL_LANES, batch: int | None = None,
                   threads: int | None = None) -> ModelWorkload:
    """The workload of the rig's model (its shape from the header), traffic simulated. `threads`
    None: the engine's own default (ds4's pread pool, colibri's loads in flight)."""
    traffic = simulate_traffic(shape, prompt_tokens, cache_experts)
    return _assemble("model", engine, shape, traffic, lanes, batch, threads)


def named_workload(name: str, engine: str, lanes: int = PREFILL_LANES, batch: int | None = None,
                   threads: int | None = None) -> ModelWorkload:
    """A named workload (the field's measured traffic of one model): `ds4-v41`."""
    if name not in NAMED:
        raise UsageError(f"--workload {name!r}: the named workloads are {', '.join(NAMED)}; or plan the rig's model")
    shape, traffic = NAMED[name]
    return _assemble(name, engine, shape, traffic, lanes, batch, threads)
