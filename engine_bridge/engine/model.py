"""A GGUF model seen by the engine: expert geometry from the tensor table, resident weights.

`inspect_model` reads only the header and tensor table (`gguf.GGUFReader` maps the file but
touches no tensor data), so it works on the real 518 GB file. `load_resident` reads the small
resident tensors of a `synth` model normally (through the page cache); routed experts are never
read here: they come only through the split reader.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from core.errors import MissingError, UsageError

from .constants import ARCH, COMPONENTS, KV_ATTN, KV_SEED, KV_TOP_K, LAYER_RESIDENT, expert_tensor_name

_EXPS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")


@dataclass(frozen=True)
class ExpertTensor:
    layer: int
    component: str           # 'gate', 'up' or 'down'
    offset: int              # bytes, absolute file offset of expert 0
    nbytes: int              # bytes of the whole tensor
    component_bytes: int     # bytes of one expert's slice
    qtype: str               # GGML type name, e.g. 'Q8_0'
    shape: tuple[int, ...]   # GGUF order (ne0, ne1, experts)


@dataclass(frozen=True)
class Geometry:
    path: str
    file_size: int           # bytes
    arch: str
    layers: int
    experts: int             # routed experts per layer
    top_k: int               # experts chosen per token
    component_bytes: int     # bytes of one component (gate/up/down slices are equal in size)
    tensors: tuple[ExpertTensor, ...]   # layer-major, gate/up/down
    alignment: int           # the file's data alignment, bytes

    @property
    def expert_bytes(self) -> int:
        return 3 * self.component_bytes

    @property
    def layer_bytes(self) -> int:
        return self.experts * self.expert_bytes

    def tensor(self, layer: int, component: str) -> ExpertTensor:
        return self.tensors[layer * 3 + COMPONENTS.index(component)]

    def expert_ranges(self, layer: int, expert: int) -> tuple[tuple[int, int], ...]:
        """(offset, length) of the expert's gate, up and down slices."""
        cb = self.component_bytes
        return tuple((self.tensor(layer, c).offset + expert * cb, cb) for c in COMPONENTS)

    def as_dict(self) -> dict:
        return {"path": self.path, "file_size": self.file_size, "arch": self.arch, "layers": self.layers,
                "experts": self.experts, "top_k": self.top_k, "component_bytes": self.component_bytes,
                "expert_bytes": self.expert_bytes, "alignment": self.alignment}


def _open_reader(path: str):
    import gguf

    if not os.path.exists(path):
        raise MissingError(f"{path}: model not found; give the path of a GGUF file (make one with `engine-bridge synth`)")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: not a regular file; give a GGUF model file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise UsageError(f"{path}: not a GGUF file (magic {magic!r}); give a .gguf model (make one with `engine-bridge synth`)")
    try:
        return gguf.GGUFReader(path, "r")
    except ValueError as e:
        if "GGMLQuantizationType" in str(e):
            raise UsageError(f"{path}: a tensor type this gguf library does not know ({e}); upgrade the gguf package") from None
        raise UsageError(f"{path}: damaged or truncated GGUF header (ValueError: {e}); re-copy or re-create the file") from None
    except Exception as e:  # the library raises IndexError/struct errors/... on damaged headers
        raise UsageError(f"{path}: damaged or truncated GGUF header ({type(e).__name__}: {e}); re-copy or re-create the file") from None


def _field(reader, key: str):
    f = reader.get_field(key)
    return None if f is None else f.contents()


def inspect_model(path: str) -> Geometry:
    """Expert geometry from the GGUF tensor table; refuses files that are truncated or have no
    routed experts laid out expert-major."""
    path = os.path.abspath(path)
    r = _open_reader(path)
    size = os.path.getsize(path)
    arch = _field(r, "general.architecture") or "?"
    end = max((t.data_offset + t.n_bytes for t in r.tensors), default=r.data_offset)
    if end > size:
        raise UsageError(f"{path}: truncated: tensor data ends at byte {end} but the file has {size}; re-copy or re-create it")
    found: dict[tuple[int, str], ExpertTensor] = {}
    for t in r.tensors:
        m = _EXPS.match(t.name)
        if not m:
            continue
        layer, comp = int(m.group(1)), m.group(2)
        shape = tuple(int(x) for x in t.shape)
        if len(shape) != 3 or t.n_bytes % shape[2]:
            raise UsageError(f"{path}: {t.name} has shape {shape}; expected (ne0, ne1, experts) with whole experts")
        found[(layer, comp)] = ExpertTensor(layer, comp, int(t.data_offset), int(t.n_bytes), int(t.n_bytes) // shape[2],
                                            t.tensor_type.name, shape)
    if not found:
        raise UsageError(f"{path}: no routed expert tensors (blk.N.ffn_{{gate,up,down}}_exps.weight); not a MoE model")
    layers = 1 + max(k[0] for k in found)
    tensors = []
    for layer in range(layers):
        for comp in COMPONENTS:
            if (layer, comp) not in found:
                raise UsageError(f"{path}: missing {expert_tensor_name(layer, comp)}; the model's experts are incomplete")
            tensors.append(found[(layer, comp)])
    experts = {t.shape[2] for t in tensors}
    cbytes = {t.component_bytes for t in tensors}
    if len(experts) != 1 or len(cbytes) != 1:
        raise UsageError(f"{path}: expert tensors differ in expert count {sorted(experts)} or slice size {sorted(cbytes)}; "
                         "this engine needs one geometry for every layer")
    top_k = _field(r, f"{arch}.{KV_TOP_K}")
    n_exp = experts.pop()
    if not isinstance(top_k, int) or not 1 <= top_k <= n_exp:
        raise UsageError(f"{path}: metadata {arch}.{KV_TOP_K} is {top_k!r}; need the number of experts chosen per token")
    return Geometry(path=path, file_size=size, arch=str(arch), layers=layers, experts=n_exp, top_k=int(top_k),
                    component_bytes=cbytes.pop(), tensors=tuple(tensors), alignment=int(r.alignment))


@dataclass(frozen=True)
class Resident:
    """Weights kept in RAM (float32), numpy order: a matrix (out, in) maps x @ W.T."""
    embed: np.ndarray            # (vocab, dim)
    output_norm: np.ndarray      # (dim,)
    output: np.ndarray           # (vocab, dim)
    layers: tuple[dict, ...]     # per layer: LAYER_RESIDENT names -> arrays
    dim: int
    ff: int
    attn: int
    vocab: int
    qtype: str                   # routed experts' GGML type
    seed: int


def load_resident(geometry: Geometry) -> Resident:
    """Read the resident tensors of a model written by `synth` (plain reads)."""
    r = _open_reader(geometry.path)
    if geometry.arch != ARCH:
        raise UsageError(f"{geometry.path}: architecture {geometry.arch!r} is not {ARCH!r}; `run` computes only models "
                         "written by `engine-bridge synth` (use `engine-bridge replay` for other models)")
    byname = {t.name: t for t in r.tensors}

    def get(name: str) -> np.ndarray:
        t = byname.get(name)
        if t is None:
            raise UsageError(f"{geometry.path}: tensor {name} is missing; re-create the model with `engine-bridge synth`")
        if t.tensor_type.name != "F32":
            raise UsageError(f"{geometry.path}: tensor {name} is {t.tensor_type.name}, expected F32")
        return np.array(t.data, dtype=np.float32)  # copies out of the map: a plain read

    qtypes = {t.qtype for t in geometry.tensors}
    if qtypes - {"Q8_0", "Q4_0", "F32"} or len(qtypes) != 1:
        raise UsageError(f"{geometry.path}: routed experts are {sorted(qtypes)}; the engine computes one of Q8_0, Q4_0, F32")
    layers = tuple({n: get(f"blk.{i}.{n}.weight") for n in LAYER_RESIDENT} for i in range(geometry.layers))
    embed = get("token_embd.weight")
    first = layers[0]
    gate = geometry.tensor(0, "gate").shape  # (dim, ff, experts)
    return Resident(embed=embed, output_norm=get("output_norm.weight"), output=get("output.weight"), layers=layers,
                    dim=int(gate[0]), ff=int(gate[1]), attn=int(_field(r, f"{ARCH}.{KV_ATTN}") or first["attn_q"].shape[0]),
                    vocab=int(embed.shape[0]), qtype=qtypes.pop(), seed=int(_field(r, f"{ARCH}.{KV_SEED}") or 0))
