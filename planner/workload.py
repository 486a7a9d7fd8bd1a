"""The reads a model issues in each phase: from its geometry and the routing model. Pure.

A plan is only as good as the workload it is solved for. The drive curves answer "how long does
this read take", the engine's read pattern "which reads for this step"; this module answers
"which steps": for the rig's own model, which experts each layer reads in a prefill and in each
decoded token.

- The model's *shape* and *layout* come from its header (`models.geometry`): layers with routed
  experts, experts per layer, experts per token, where each expert's bytes are.
- Its *traffic* comes from the routing model (`models.routing`, calibrated to the field's
  DeepSeek V4.1 figures) run through the engines' expert-cache policy (`models.cache`), without
  reads: each prefill chunk reads, per layer, the union of its selected experts not cached; each
  decoded token, after warm-up, the experts it misses. On V4.1's geometry the simulation gives the
  field's figures within PREFILL_TOLERANCE / MISSES_TOLERANCE (tests/planner/test_workload.py).
  Those steps, sampled for a large model (`planner.pricing.sample_steps`), are what a plan prices.

The field's own numbers stay available as the named workload `ds4-v41` (planner/constants.py),
for planning that model from a header alone: its layout is a stacked GGUF's
(`models.geometry.stacked_geometry`) and its steps are scaled to the field's traffic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

import numpy as np

from core.errors import UsageError
from engines.pattern import Step
from models.cache import ExpertCache
from models.constants import V41_COMPONENT_BYTES
from models.geometry import stacked_geometry
from models.routing import Router, RoutingModel

from .constants import (
    V41_CACHE_EXPERTS,
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
from .pricing import DECODE_SAMPLE, PREFILL_SAMPLE, PhaseSteps, sample_steps
from .world import calibrated_traffic, reread_share


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
    source: str                   # 'routing-model' (simulated), 'field' (docs/planner.md, measured) or
                                  # 'engine' (the decode calibrated by the engine's own lines, planner.world)


@dataclass(frozen=True)
class ModelWorkload:
    """The workload a plan is solved for: the model (its layout), its traffic and each phase's steps."""
    name: str                     # 'model' (the rig's, from its header) or a named workload
    shape: ModelShape
    traffic: Traffic
    geometry: object = field(repr=False)          # models.geometry.Geometry: where each expert's bytes are
    phases: dict = field(repr=False, default_factory=dict)   # 'prefill' / 'decode' -> PhaseSteps

    def as_dict(self) -> dict:
        """The plan's `workload` block: the model, its traffic, and the steps each phase prices."""
        return {"name": self.name, "traffic": asdict(self.traffic),
                **{ph: {"steps": len(st.steps), "scale": st.scale, "empty": st.empty, "tokens": st.tokens,
                        "experts_per_step": (sum(len(x.experts) for x in st.steps) / len(st.steps)) if st.steps else 0.0}
                   for ph, st in self.phases.items()}}


V41_SHAPE = ModelShape(V41_NAME, LAYERS, V41_EXPERTS, V41_TOP_K, V41_COMPONENT_BYTES, 3, EXPERT_BYTES)
V41_TRAFFIC = Traffic(PREFILL_TOKENS, PREFILL_EXPERTS_PER_LAYER, V41_CACHE_EXPERTS, DECODE_MISSES_PER_TOKEN, "field")
NAMED = {V41_NAME: (V41_SHAPE, V41_TRAFFIC)}
NAMED_ARCH = {V41_NAME: "deepseek_v41"}     # its config.json model_type (colibri runs it on its V4.1 engine)


# ---------------------------------------------------------------------------------------------
# Traffic from the routing model

def _step(cache: ExpertCache, sel: np.ndarray, experts: int, phase: str, out: list, fresh: list, seen: set) -> int:
    """One step of selections (tokens, layers, k) through the cache, layer by layer as the engine
    goes; appends each layer's `Step` (the experts it reads) to `out` and the same without the
    experts read before in the run (`seen`: a buffered engine may find those in the page cache) to
    `fresh`; returns the experts read."""
    misses = 0
    for layer in range(sel.shape[1]):
        base = layer * experts
        union, counts = np.unique(sel[:, layer], return_counts=True)
        cache.select(union + base, counts)
        missing = [int(e) for e in union[~cache.resident[union + base]]]
        for e in missing:
            cache.admit(base + e)
        misses += len(missing)
        out.append(Step(phase, layer, tuple(missing)))
        fresh.append(Step(phase, layer, tuple(e for e in missing if base + e not in seen)))
        seen.update(base + e for e in missing)
    cache.advance(sel.shape[0])
    return misses


@lru_cache(maxsize=32)
def simulate_steps(layers: int, experts: int, top_k: int, prompt_tokens: int, cache_experts: int,
                   chunk_tokens: int = ROUTING_CHUNK_TOKENS, warm: int = ROUTING_WARM_TOKENS,
                   measure: int = ROUTING_MEASURE_TOKENS, seed: int = ROUTING_SEED) -> tuple[tuple[Step, ...], ...]:
    """(the steps of a cold prefill of prompt_tokens in chunks, the steps of `measure` decoded
    tokens after `warm`, and both again without the experts the run had read before): which
    experts each layer reads, through the engine's cache policy (`models.cache`), as the embedded
    engine would run them."""
    router = Router(RoutingModel(layers, experts, top_k, seed=seed))
    cache = ExpertCache(min(cache_experts, layers * experts), layers * experts)
    seen: set = set()
    pre: list[Step] = []
    pre_fresh: list[Step] = []
    for s in range(0, prompt_tokens, chunk_tokens):
        _step(cache, router.next(min(chunk_tokens, prompt_tokens - s)), experts, "prefill", pre, pre_fresh, seen)
    for _ in range(warm):
        _step(cache, router.next(1), experts, "decode", [], [], seen)
    dec: list[Step] = []
    dec_fresh: list[Step] = []
    for _ in range(measure):
        _step(cache, router.next(1), experts, "decode", dec, dec_fresh, seen)
    return tuple(pre), tuple(dec), tuple(pre_fresh), tuple(dec_fresh)


def simulate(layers: int, experts: int, top_k: int, prompt_tokens: int, cache_experts: int,
             chunk_tokens: int = ROUTING_CHUNK_TOKENS, warm: int = ROUTING_WARM_TOKENS,
             measure: int = ROUTING_MEASURE_TOKENS, seed: int = ROUTING_SEED) -> tuple[float, float]:
    """(experts read per layer by a cold prefill of prompt_tokens in chunks, misses per decoded
    token over `measure` tokens after `warm`), through the engine's cache policy."""
    pre, dec, _, _ = simulate_steps(layers, experts, top_k, prompt_tokens, cache_experts, chunk_tokens, warm, measure, seed)
    return sum(len(s.experts) for s in pre) / layers, sum(len(s.experts) for s in dec) / max(1, measure)


def run_reread_share(shape: ModelShape, cal, cache_experts: int | None) -> float:
    """The share of what the engine's calibration run (`cal`, `planner.world`) read that it had
    read before in the run — what a page cache could have served it: its own prompt and tokens
    through the routing model and the cache it ran with (its `cache_per_layer`, else
    `cache_experts`), every step (no warm-up: the run starts cold); over a 'decode' window, the
    generated tokens' steps only. 1.0 when the record does not say how many tokens it ran."""
    tokens, prompt = cal.get("tokens"), cal.get("prompt_tokens") or 0
    if not isinstance(tokens, int) or tokens < 1 or not isinstance(prompt, int) or prompt < 0:
        return 1.0
    per_layer = cal.get("cache_per_layer")
    cache = per_layer * shape.layers if isinstance(per_layer, int) else cache_experts or 0
    pre, dec, pre_fresh, dec_fresh = simulate_steps(shape.layers, shape.experts, shape.top_k, prompt, max(0, cache),
                                                    warm=0, measure=tokens)
    if cal.get("window") == "decode":
        return reread_share(dec, dec_fresh)
    return reread_share(pre + dec, pre_fresh + dec_fresh)


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
# The workload of a model

def phase_steps(shape: ModelShape, traffic: Traffic, measure: int = ROUTING_MEASURE_TOKENS) -> dict[str, PhaseSteps]:
    """Each phase's steps for the traffic's prompt and cache (sampled for a large model). A named
    workload's field traffic differs a little from the simulation: its steps are scaled to it."""
    pre, dec, pre_fresh, dec_fresh = simulate_steps(shape.layers, shape.experts, shape.top_k, traffic.prompt_tokens,
                                                    traffic.cache_experts)
    p = sample_steps("prefill", pre, traffic.prompt_tokens, shape.layers, PREFILL_SAMPLE, pre_fresh)
    d = sample_steps("decode", dec, measure, shape.layers, DECODE_SAMPLE, dec_fresh)
    if traffic.source in ("field", "engine"):
        # scaled so the steps priced (a named workload's field figures, or what the engine's own
        # lines said it read: planner.world.calibrated_traffic) (the sample, each standing for `scale` steps) read the field's
        # experts per layer and misses per token exactly
        sampled_pre = sum(len(s.experts) for s in p.steps) * p.scale / shape.layers
        sampled_dec = sum(len(s.experts) for s in d.steps) * d.scale / max(1, d.tokens)
        p = replace(p, scale=p.scale * traffic.experts_per_layer / max(sampled_pre, 1e-12))
        scale = d.scale * traffic.misses_per_token / max(sampled_dec, 1e-12)
        # the decoded tokens still cross every layer: the steps that read nothing make up the rest
        empty = max(0, round(d.tokens * d.layers - len(d.steps) * scale))
        d = replace(d, scale=scale, empty=empty)
    return {"prefill": p, "decode": d}


def model_workload(geometry, prompt_tokens: int = PREFILL_TOKENS, cache_experts: int | None = None) -> ModelWorkload:
    """The workload of the rig's model (its header's `geometry`), traffic simulated."""
    shape = ModelShape.from_geometry(geometry)
    traffic = simulate_traffic(shape, prompt_tokens, cache_experts)
    return ModelWorkload("model", shape, traffic, geometry, phase_steps(shape, traffic))


def calibrated_workload(wl: ModelWorkload, cal) -> ModelWorkload:
    """The workload with the decode's experts per token the engine's run read (its calibration
    record, `planner.world`); unchanged when the record says nothing of them."""
    if not cal:
        return wl
    traffic = calibrated_traffic(wl.traffic, wl.shape.layers, wl.shape.expert_bytes, cal)
    if traffic is wl.traffic:
        return wl
    return replace(wl, traffic=traffic, phases=phase_steps(wl.shape, traffic))


def named_workload(name: str) -> ModelWorkload:
    """A named workload (the field's measured traffic of one model): `ds4-v41`."""
    if name not in NAMED:
        raise UsageError(f"--workload {name!r}: the named workloads are {', '.join(NAMED)}; or plan the rig's model")
    shape, traffic = NAMED[name]
    g = stacked_geometry(shape.name, shape.layers, shape.experts, shape.top_k, shape.component_bytes, shape.components,
                         arch=NAMED_ARCH[name])
    return ModelWorkload(name, shape, traffic, g, phase_steps(shape, traffic))
