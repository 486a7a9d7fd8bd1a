"""Where a MoE model's routed experts are, from its tensor table alone (docs/planner.md, docs/replicas.md). Pure.

The planner, iobench and the embedded engine all need the same facts about the rig's model: how
many layers carry routed experts, how many experts each has, how many a token chooses, and the
byte ranges one expert occupies (what a decode miss reads). They are a property of the model's
files, so they live here, in the lowest layer that knows the model; `models.tensortable`
reads the table (GGUF through the gguf library, safetensors through its JSON header) and this
module turns it into a `Geometry`.

Two layouts of routed experts are recognised:

- stacked: one tensor per layer and component holds every expert, expert-major, so expert `e`
  is the e-th slice (GGUF `blk.N.ffn_{gate,up,down}_exps.weight`, ggml order (ne0, ne1, experts);
  safetensors `…layers.N.mlp.experts.{gate_up,down}_proj` with the expert first, gpt-oss/Llama 4);
- per expert: one tensor per layer, expert and component (`model.layers.N.mlp.experts.E.
  {gate,up,down}_proj.weight` in Qwen2/3-MoE, DeepSeek V2/V3 and OLMoE checkpoints,
  `model.layers.N.block_sparse_moe.experts.E.w1/w2/w3.weight` in Mixtral, old llama.cpp
  `blk.N.ffn_{gate,up,down}.E.weight`).

Components may differ in size (a Q4_K_M file keeps `down` in Q6_K in some layers; a checkpoint
may keep one projection in another dtype): every tensor keeps its own slice length, and the one
"component" read size a planner needs is the largest slice (`Geometry.component_bytes`): a decode
miss issues all of an expert's component reads at once and waits for the last, and the largest
one lands last.

Layers are numbered 0..layers-1 among the layers that have routed experts (DeepSeek V3 keeps
its first three layers dense); `layer_ids` gives each one's number in the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from core.errors import UsageError

from .modelset import Extent

# Components in the order an expert's reads are issued; a fused gate+up tensor is one component.
COMPONENT_ORDER = ("gate", "up", "gate_up", "down")
_COMPONENT = {"gate": "gate", "up": "up", "down": "down", "gate_up": "gate_up",
              "gate_proj": "gate", "up_proj": "up", "down_proj": "down", "gate_up_proj": "gate_up",
              "w1": "gate", "w3": "up", "w2": "down"}

# Stacked: (layer, component); the expert is a slice.
_STACKED = (
    re.compile(r"^blk\.(?P<layer>\d+)\.ffn_(?P<comp>gate|up|down|gate_up)_exps\.weight$"),
    re.compile(r"^(?:.*\.)?layers\.(?P<layer>\d+)\.(?:mlp|feed_forward|block_sparse_moe)\.experts\."
               r"(?P<comp>gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?$"),
)
# One tensor per expert: (layer, expert, component).
_PER_EXPERT = (
    re.compile(r"^(?:.*\.)?layers\.(?P<layer>\d+)\.(?:[a-z_]+\.)?experts\.(?P<expert>\d+)\."
               r"(?P<comp>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$"),
    re.compile(r"^blk\.(?P<layer>\d+)\.ffn_(?P<comp>gate|up|down)\.(?P<expert>\d+)\.weight$"),
)
_SHARED = re.compile(r"(?:_shexp\.|\.shared_experts?\.)")

# Where the experts-per-token and expert counts are written (GGUF keys are `<arch>.` + these).
GGUF_TOP_K = "expert_used_count"
GGUF_EXPERTS = "expert_count"
GGUF_SHARED = "expert_shared_count"
CONFIG_TOP_K = ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token")
CONFIG_EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts")
CONFIG_SHARED = ("n_shared_experts", "num_shared_experts")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the model's table, as its file header describes it."""
    name: str
    file: str                 # the file that holds it, relative to the model's root (ModelSet.files)
    offset: int               # bytes, absolute within that file
    nbytes: int               # bytes
    dtype: str                # GGML type name (Q4_K, F32 …) or safetensors dtype (BF16, F8_E4M3 …)
    shape: tuple[int, ...]    # GGUF: ggml order (ne0, ne1, …); safetensors: row-major (outermost first)


@dataclass(frozen=True)
class TensorTable:
    """Every tensor of a model (all files of a split set or directory) and its metadata."""
    path: str                 # the model's path (file, first split member, directory)
    format: str               # 'gguf' or 'safetensors'
    layout: str               # models.modelset layout: 'file', 'gguf-split', 'dir'
    size: int                 # bytes of all the model's files together
    arch: str                 # GGUF general.architecture, config.json model_type, or '?'
    alignment: int            # bytes: GGUF data alignment; 1 for safetensors
    tensors: tuple[TensorInfo, ...]
    meta: dict = field(default_factory=dict)   # GGUF scalar metadata, or config.json (text_config merged in)
    file_sizes: tuple[tuple[str, int], ...] = ()   # (file, bytes) of every file of the model


@dataclass(frozen=True)
class ExpertTensor:
    """A tensor holding routed-expert weights: a whole stack (`expert` None) or one expert's."""
    layer: int                # index among the layers that have routed experts
    component: str            # 'gate', 'up', 'gate_up' or 'down'
    offset: int               # bytes, absolute within `file`: expert 0's slice (stacked) or the tensor
    nbytes: int               # bytes of the whole tensor
    component_bytes: int      # bytes of one expert's slice
    qtype: str                # GGML type name or safetensors dtype
    shape: tuple[int, ...]    # as in TensorInfo
    file: str = ""            # relative to the model's root
    expert: int | None = None # None: stacked, expert e at offset + e * component_bytes


@dataclass(frozen=True)
class Geometry:
    path: str                 # the model's path
    file_size: int            # bytes of all the model's files
    arch: str
    layers: int               # layers with routed experts
    experts: int              # routed experts per layer
    top_k: int                # experts chosen per token
    component_bytes: int      # bytes: the largest component slice (the decode read; see the module doc)
    tensors: tuple[ExpertTensor, ...]   # stacked: [layer][component]; per expert: [layer][expert][component]
    alignment: int            # bytes
    format: str = "gguf"
    layout: str = "file"
    stacked: bool = True
    components: tuple[str, ...] = ("gate", "up", "down")
    layer_ids: tuple[int, ...] = ()     # each MoE layer's number in the model (empty: 0..layers-1)
    shared_experts: int | None = None   # always-run experts per layer, when the model says or shows them
    file_sizes: tuple[tuple[str, int], ...] = ()   # (file, bytes) of every file of the model, when known

    def file_bytes(self, file: str) -> int | None:
        """Bytes of one of the model's files (None when the geometry does not know)."""
        for name, size in self.file_sizes:
            if name == file:
                return size
        return None

    @property
    def routed_bytes(self) -> int:
        """Bytes of every routed expert of every layer."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def dense_bytes(self) -> int:
        """Bytes of the model's files outside its routed experts (its dense weights and headers:
        what an engine reads once and keeps)."""
        return max(0, int(self.file_size) - self.routed_bytes)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert (all its components), averaged over layers when they differ."""
        return round(self.routed_bytes / (self.layers * self.experts))

    @property
    def component_sizes(self) -> dict[str, tuple[int, ...]]:
        """Each component's distinct slice lengths (bytes) over the layers."""
        return {c: tuple(sorted({t.component_bytes for t in self.tensors if t.component == c})) for c in self.components}

    @property
    def uniform(self) -> bool:
        """True when every component of every layer has the same slice length."""
        return len({t.component_bytes for t in self.tensors}) == 1

    def tensor(self, layer: int, component: str, expert: int = 0) -> ExpertTensor:
        """The tensor holding `component` of `expert` in `layer` (the stack, when stacked)."""
        c = self.components.index(component)
        n = len(self.components)
        if self.stacked:
            return self.tensors[layer * n + c]
        return self.tensors[(layer * self.experts + expert) * n + c]

    def expert_ranges(self, layer: int, expert: int) -> tuple[Extent, ...]:
        """Where one expert's bytes are: one Extent per component, in `components` order."""
        if not 0 <= layer < self.layers or not 0 <= expert < self.experts:
            raise IndexError(f"expert {expert} of layer {layer}: the model has {self.layers} x {self.experts}")
        out = []
        for c in self.components:
            t = self.tensor(layer, c, expert)
            off = t.offset + expert * t.component_bytes if self.stacked else t.offset
            out.append(Extent(t.file, off, t.component_bytes))
        return tuple(out)

    def as_dict(self) -> dict:
        return {"path": self.path, "file_size": self.file_size, "arch": self.arch, "layers": self.layers,
                "experts": self.experts, "top_k": self.top_k, "component_bytes": self.component_bytes,
                "expert_bytes": self.expert_bytes, "alignment": self.alignment, "format": self.format,
                "layout": self.layout, "stacked": self.stacked, "components": list(self.components),
                "component_sizes": {c: list(v) for c, v in self.component_sizes.items()},
                "shared_experts": self.shared_experts}


# ---------------------------------------------------------------------------------------------

def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _first(meta: dict, keys) -> int | None:
    for k in keys:
        v = _int(meta.get(k))
        if v is not None:
            return v
    return None


def _match(patterns, name: str):
    for p in patterns:
        m = p.match(name)
        if m:
            return m
    return None


def _experts_axis(t: TensorInfo, fmt: str) -> int:
    """How many experts a stacked tensor holds: ggml's outermost dimension is the last one."""
    return t.shape[-1] if fmt == "gguf" else t.shape[0]


def geometry_from_table(table: TensorTable) -> Geometry:
    """The routed-expert geometry of a tensor table; UsageError (exit 2) naming the model and what
    is wrong when there are no routed experts, an expert is incomplete, or experts-per-token is
    not recorded."""
    path = table.path
    stacked: dict[tuple[int, str], TensorInfo] = {}
    per: dict[tuple[int, int, str], TensorInfo] = {}
    shared_seen = False
    for t in table.tensors:
        m = _match(_STACKED, t.name)
        if m:
            stacked[(int(m["layer"]), _COMPONENT[m["comp"]])] = t
            continue
        m = _match(_PER_EXPERT, t.name)
        if m:
            per[(int(m["layer"]), int(m["expert"]), _COMPONENT[m["comp"]])] = t
            continue
        shared_seen = shared_seen or bool(_SHARED.search(t.name))
    if not stacked and not per:
        raise UsageError(f"{path}: no routed expert tensors (blk.N.ffn_{{gate,up,down}}_exps.weight or "
                         "…layers.N.mlp.experts.E.{gate,up,down}_proj.weight); not a MoE model")
    if stacked and per:
        raise UsageError(f"{path}: routed experts are both stacked ({next(iter(stacked.values())).name}) and per expert "
                         f"({next(iter(per.values())).name}); a model keeps them one way")
    if stacked:
        geometry = _stacked(table, stacked)
    else:
        geometry = _per_expert(table, per)
    return _with_counts(table, geometry, shared_seen)


def _components(path: str, keys) -> tuple[str, ...]:
    """The components every expert must have: gate, up, down, or a fused gate_up and down."""
    seen = {k[-1] for k in keys}
    if "gate_up" in seen and seen & {"gate", "up"}:
        raise UsageError(f"{path}: experts have both a fused gate_up and separate gate/up tensors; a model keeps one form")
    return ("gate_up", "down") if "gate_up" in seen else ("gate", "up", "down")


def _stacked(table: TensorTable, found: dict[tuple[int, str], TensorInfo]) -> Geometry:
    path = table.path
    comps = _components(path, found)
    layer_ids = sorted({k[0] for k in found})
    tensors: list[ExpertTensor] = []
    counts = set()
    for i, lid in enumerate(layer_ids):
        for c in comps:
            t = found.get((lid, c))
            if t is None:
                name = f"blk.{lid}.ffn_{c}_exps.weight" if table.format == "gguf" else f"layer {lid}'s experts.{c}_proj"
                raise UsageError(f"{path}: missing {name}; the model's experts are incomplete")
            n = _experts_axis(t, table.format)
            if len(t.shape) < 2 or n < 1 or t.nbytes % n:
                raise UsageError(f"{path}: {t.name} has shape {t.shape} and {t.nbytes} B; expected whole experts along "
                                 f"its {'last' if table.format == 'gguf' else 'first'} dimension")
            counts.add(n)
            tensors.append(ExpertTensor(i, c, t.offset, t.nbytes, t.nbytes // n, t.dtype, t.shape, t.file, None))
    if len(counts) != 1:
        raise UsageError(f"{path}: expert tensors hold different numbers of experts {sorted(counts)}; "
                         "every layer needs the same count")
    return _geometry(table, tensors, comps, layer_ids, counts.pop(), stacked=True)


def _per_expert(table: TensorTable, found: dict[tuple[int, int, str], TensorInfo]) -> Geometry:
    path = table.path
    comps = _components(path, found)
    layer_ids = sorted({k[0] for k in found})
    experts = 1 + max(k[1] for k in found)
    tensors: list[ExpertTensor] = []
    for i, lid in enumerate(layer_ids):
        for e in range(experts):
            for c in comps:
                t = found.get((lid, e, c))
                if t is None:
                    raise UsageError(f"{path}: layer {lid} has no {c} tensor for expert {e} (it has experts up to "
                                     f"{experts - 1}); the model's experts are incomplete")
                tensors.append(ExpertTensor(i, c, t.offset, t.nbytes, t.nbytes, t.dtype, t.shape, t.file, e))
    return _geometry(table, tensors, comps, layer_ids, experts, stacked=False)


def _geometry(table: TensorTable, tensors, comps, layer_ids, experts: int, stacked: bool) -> Geometry:
    return Geometry(path=table.path, file_size=table.size, arch=table.arch, layers=len(layer_ids), experts=experts,
                    top_k=0, component_bytes=max(t.component_bytes for t in tensors), tensors=tuple(tensors),
                    alignment=table.alignment, format=table.format, layout=table.layout, stacked=stacked,
                    components=comps, layer_ids=tuple(layer_ids), file_sizes=table.file_sizes)


def _with_counts(table: TensorTable, g: Geometry, shared_seen: bool) -> Geometry:
    """Experts per token, the declared expert count (checked) and shared experts, from the metadata."""
    meta, path = table.meta, table.path
    if table.format == "gguf":
        key = f"{table.arch}.{GGUF_TOP_K}"
        top_k = _int(meta.get(key))
        declared = _int(meta.get(f"{table.arch}.{GGUF_EXPERTS}"))
        shared = _int(meta.get(f"{table.arch}.{GGUF_SHARED}"))
        where = f"metadata {key}"
    else:
        top_k = _first(meta, CONFIG_TOP_K)
        declared = _first(meta, CONFIG_EXPERTS)
        shared = _first(meta, CONFIG_SHARED)
        if shared is None and (_int(meta.get("shared_expert_intermediate_size")) or 0) > 0:
            shared = 1                                  # Qwen2-MoE: one shared expert of that width
        where = f"config.json {CONFIG_TOP_K[0]}"
    if top_k is None or not 1 <= top_k <= g.experts:
        raise UsageError(f"{path}: {where} is {top_k!r}; need the number of experts chosen per token "
                         f"(1..{g.experts}) in the model's {'metadata' if table.format == 'gguf' else 'config.json'}")
    if declared is not None and declared != g.experts:
        raise UsageError(f"{path}: the model says {declared} experts per layer but its tensors hold {g.experts}; "
                         "the files are incomplete or mixed up — re-download them")
    if shared is None and shared_seen:
        shared = 1          # the shared expert's tensors are there but no count is written: one, merged
    return Geometry(**{**g.__dict__, "top_k": top_k, "shared_experts": shared})


def stacked_geometry(name: str, layers: int, experts: int, top_k: int, component_bytes: int,
                     components: int = 3, alignment: int = 4096, arch: str = "?") -> Geometry:
    """The geometry of a model known only by its shape (a named workload): stacked expert tensors,
    one per layer and component, laid one after another in one file named `name`. The reads an
    engine issues depend on where experts are, so a shape needs a layout; this is a GGUF's."""
    comps = ("gate", "up", "down") if components == 3 else ("gate_up", "down")
    tensors, offset = [], 0
    for layer in range(layers):
        for c in comps:
            nbytes = experts * component_bytes
            tensors.append(ExpertTensor(layer, c, offset, nbytes, component_bytes, "?", (0, 0, experts), name, None))
            offset += (nbytes + alignment - 1) // alignment * alignment
    return Geometry(path=name, file_size=offset, arch=arch, layers=layers, experts=experts, top_k=top_k,
                    component_bytes=component_bytes, tensors=tuple(tensors), alignment=alignment, format="gguf",
                    layout="file", stacked=True, components=comps, file_sizes=((name, offset),))
