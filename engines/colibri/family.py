"""colibri's family: one engine per model family, each with its own mirror rules (pure).

The `coli` launcher picks the engine from config.json's model_type (c/family_registry.py
`family_for_config`, called by c/coli `resolve_model` / `engine_for`): the model_type is
stripped and lower-cased and looked up among the registered families; one it does not know
raises UnknownFamilyError ("unsupported model_type: X") and nothing is launched. Older
launchers (c/coli `model_arch` at 4ef9a99) matched substrings instead and gave everything
unrecognised to the GLM engine, and "deepseek_v41" to the DeepSeek V4 engine.

Each member below was read from its engine's source; the functions and files are named where
each rule is reproduced. Everything is pure: no file is opened, no drive is probed.

Unconfirmed (docs/engine-profiles.md, "Unconfirmed"): which upstream commit brought the
weighted stripe legs (read in derived copies of a newer colibri.c, not upstream); whether the
newest deepseek_v4.c's expert store reads an expert split across shards tensor by tensor (the
answer serve() gives is the same either way: each read falls back by its own shard); the
V4 CLI-exit "v4_mirror drives=" line, read in one upstream snapshot only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from core.errors import UsageError

from .constants import (
    DSV41_EXPERTS_PER_LAYER,
    DSV4_EXPERTS_PER_LAYER,
    GLM_MODEL_TYPE,
    HASH_BUCKETS,
    PLACEMENT_FLAT,
    PLACEMENT_XOR,
)
from .placement import _float_cuts, _integer_cuts, expert_hash, flat_hash

DEFAULT_VARIANT = "glm"     # a profile exported before the family was known: the GLM engine's rules


@dataclass(frozen=True)
class FamilyMember:
    """One colibri engine's mirror rules, as its source has them."""

    name: str                       # 'glm', 'deepseek_v4', 'deepseek_v41', 'glm53'
    source: str                     # the file its rules were read from
    model_types: frozenset[str]     # config.json model_type values colibri's launcher sends to it
    integer_weights: bool           # COLI_DISK_WEIGHTS read with strtol (glm53), else atof
    stripes: bool                   # splits one expert read across drives (only the GLM engine)
    fallback: str                   # what a mirror without an expert's file does (FALLBACKS)
    stats: str | None               # 'stdout' | 'stderr' | None: where its per-drive statistics line goes
    placement: str                  # PLACEMENT_XOR | PLACEMENT_FLAT
    experts_per_layer: int | None = None   # the flat hash's default multiplier (None: the hash ignores it)

    def cuts(self, weights: Sequence[float]) -> tuple[int, ...]:
        """The 256-cut vector for one weight per loaded drive, primary first: drive r serves
        buckets [cuts[r-1], cuts[r])."""
        if not weights:
            raise ValueError("cuts need at least one weight")
        if any(not w > 0 or w != w or w == float("inf") for w in weights):
            raise ValueError(f"{self.name}: weights must be positive and finite, not {tuple(weights)}")
        if self.integer_weights:
            if any(int(w) != w for w in weights):
                raise ValueError(f"{self.name} takes integer weights (strtol), not {tuple(weights)}")
            return _integer_cuts([int(w) for w in weights])
        return _float_cuts(weights, force_last=self.name != "deepseek_v41")

    def bucket(self, layer: int, expert: int, experts_per_layer: int | None = None) -> int:
        """The placement hash of (layer, expert): 0..255. The flat hash needs experts_per_layer
        (the config's n_routed_experts; default: this member's released model's)."""
        if self.placement == PLACEMENT_XOR:
            return expert_hash(layer, expert)
        epl = experts_per_layer if experts_per_layer is not None else self.experts_per_layer
        if not epl or epl < 1:
            raise ValueError(f"{self.name}'s placement hash needs experts_per_layer")
        return flat_hash(layer, expert, epl)

    def route(self, layer: int, expert: int, experts_per_layer: int | None,
              weights: Sequence[float]) -> int:
        """The drive the cuts pick for (layer, expert) with one weight per loaded drive, before
        looking at what the mirrors hold. One drive: no mirror is active and the primary serves."""
        if len(weights) < 2:
            return 0
        c = self.cuts(weights)
        hv, r = self.bucket(layer, expert, experts_per_layer), 0
        while r + 1 < len(c) and hv >= c[r]:     # glm53's guard; the others end on cut 256
            r += 1
        return r

    def serve(self, routed: int, tensor_files: Sequence[str], holds) -> tuple[int, ...]:
        """One source per tensor of the expert, in the order given (the anchor tensor first):
        `holds(source, file)` says whether that drive's copy has that shard; the primary (0)
        holds everything.

        'anchor' (c/colibri.c expert_load_impl): the routed mirror must hold the gate_proj
        weight's shard, else the whole expert comes from the primary; when it does, each other
        tensor is read from it only if it holds that tensor's shard (mir_pread, rep_bfd fall
        back per tensor). 'shard' (c/deepseek_v4.c coli_st_read_at_rep) and 'tensor'
        (c/deepseek_v41.c expert_fetch, st_read_range_rep): each read falls back on its own,
        by the shard that holds it. 'expert' (c/glm53.c glm53_expert_read_replica): any piece
        missing and the whole expert comes from the primary."""
        files = tuple(tensor_files)
        if routed == 0 or not files:
            return (0,) * len(files)
        if self.fallback == "expert":
            r = routed if all(holds(routed, f) for f in files) else 0
            return (r,) * len(files)
        if self.fallback == "anchor" and not holds(routed, files[0]):
            return (0,) * len(files)
        return tuple(routed if holds(routed, f) else 0 for f in files)

FAMILY: dict[str, FamilyMember] = {m.name: m for m in (
    FamilyMember(name="glm", source="c/colibri.c",
           model_types=frozenset({GLM_MODEL_TYPE, "glm5_moe", "glm"}),
           integer_weights=False, stripes=True, fallback="anchor", stats="stdout",
           placement=PLACEMENT_XOR),
    FamilyMember(name="deepseek_v4", source="c/deepseek_v4.c",
           model_types=frozenset({"deepseek_v4"}),
           integer_weights=False, stripes=False, fallback="shard", stats="stderr",
           placement=PLACEMENT_FLAT, experts_per_layer=DSV4_EXPERTS_PER_LAYER),
    FamilyMember(name="deepseek_v41", source="c/deepseek_v41.c",
           model_types=frozenset({"deepseek_v41", "deepseek_v41_text"}),
           integer_weights=False, stripes=False, fallback="tensor", stats="stderr",
           placement=PLACEMENT_FLAT, experts_per_layer=DSV41_EXPERTS_PER_LAYER),
    FamilyMember(name="glm53", source="c/glm53.c",
           model_types=frozenset({"glm5_next", "glm5_next_text"}),
           integer_weights=True, stripes=False, fallback="expert", stats=None,
           placement=PLACEMENT_XOR),
)}

# colibri's other families (c/family_registry.py FAMILIES): the launcher runs them on engines
# whose mirror rules replica-tuner does not reproduce.
OTHER_FAMILIES: dict[str, str] = {
    "inkling_mm_model": "inkling", "inkling": "inkling", "kimi_k3": "kimi_k3", "kimi_linear": "kimi_k3",
    "olmoe": "olmoe", "qwen3_5_moe": "qwen36", "qwen3_5_moe_text": "qwen36",
    "qwen4_exp": "qwen38", "qwen4_exp_text": "qwen38",
}


def known_model_types() -> tuple[str, ...]:
    return tuple(sorted(t for m in FAMILY.values() for t in m.model_types))


def member_for(model_type: str | None) -> FamilyMember:
    """The engine colibri's launcher runs for config.json's model_type (c/family_registry.py
    family_for_config: stripped, lower-cased, looked up exactly). colibri refuses a model_type
    it does not know, and so does this (UsageError); so it does for a missing one."""
    known = ", ".join(known_model_types())
    if not isinstance(model_type, str) or not model_type.strip():
        raise UsageError(f"config.json has no model_type; colibri picks its engine by it (known: {known})")
    key = model_type.strip().lower()
    for m in FAMILY.values():
        if key in m.model_types:
            return m
    if key in OTHER_FAMILIES:
        raise UsageError(f"model_type {key!r} runs colibri's {OTHER_FAMILIES[key]} engine, whose mirror rules "
                         f"replica-tuner does not reproduce; known: {known}")
    raise UsageError(f"colibri has no engine for model_type {key!r} (unsupported model_type); known: {known}")


def cuts_many(member: FamilyMember, weights_2d) -> np.ndarray:
    """member.cuts for every row of `weights_2d` (K x drives) at once: a K x drives int array."""
    w = np.atleast_2d(np.asarray(weights_2d, dtype=np.float64))
    if w.ndim != 2 or w.shape[1] < 1:
        raise ValueError("cuts_many needs a K x drives array of weights")
    if not (np.isfinite(w).all() and (w > 0).all()):
        raise ValueError(f"{member.name}: weights must be positive and finite")
    k, n = w.shape
    out = np.empty((k, n), dtype=np.int64)
    if member.integer_weights:
        if not (w == np.floor(w)).all():
            raise ValueError(f"{member.name} takes integer weights (strtol)")
        wi = w.astype(np.int64)
        acc = np.cumsum(wi, axis=1)
        total = acc[:, -1:]
        out[:] = np.clip((HASH_BUCKETS * acc + total // 2) // total, 1, HASH_BUCKETS)
        out[:, -1] = HASH_BUCKETS
        return out
    cum = np.cumsum(w, axis=1)                       # sequential, as the C loops add
    raw = np.floor(256.0 * cum / cum[:, -1:] + 0.5).astype(np.int64)
    prev = np.zeros(k, dtype=np.int64)
    for r in range(n):
        c = np.minimum(np.where(raw[:, r] <= prev, prev + 1, raw[:, r]), HASH_BUCKETS)
        out[:, r] = c
        prev = c
    if member.name != "deepseek_v41":
        out[:, -1] = HASH_BUCKETS
    return out



def member_of(name: str) -> FamilyMember:
    """The member a profile names ('' : the GLM engine, whose rules profiles had before the family)."""
    try:
        return FAMILY[name or DEFAULT_VARIANT]
    except KeyError:
        raise UsageError(f"colibri has no engine {name!r} in its family; known: {', '.join(FAMILY)} "
                         "(export the profile again)") from None

