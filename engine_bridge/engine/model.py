"""A GGUF model seen by the engine: expert geometry from the tensor table, resident weights.

The geometry is `models.geometry`'s (the planner and iobench read the same); `inspect_model`
reads only the header and tensor table, so it works on the real 518 GB file, and refuses what the
engine cannot stage. `load_resident` reads the small resident tensors of a `synth` model normally
(through the page cache); routed experts are never read here: they come only through the split
reader.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.errors import UsageError
from models.geometry import ExpertTensor, Geometry
from models.tensortable import inspect_model as inspect_any
from models.tensortable import open_gguf

from .constants import ARCH, COMPONENTS, KV_ATTN, KV_SEED, LAYER_RESIDENT

__all__ = ["ExpertTensor", "Geometry", "inspect_model", "Resident", "load_resident"]


def inspect_model(path: str) -> Geometry:
    """Expert geometry of a model `run` can compute (models.tensortable reads it): one GGUF file
    with stacked gate/up/down tensors whose slices are one size, as `synth` writes (its
    dequantize and resident weights assume that shape). Replay reads any geometry."""
    g = inspect_any(path)
    if not g.stacked or g.components != COMPONENTS:
        raise UsageError(f"{g.path}: routed experts are {'per-expert tensors' if not g.stacked else '/'.join(g.components)}; "
                         "the engine reads stacked blk.N.ffn_{gate,up,down}_exps.weight tensors (a GGUF model)")
    if g.layout != "file":
        # The resident weights are read from one file, as synth writes it.
        raise UsageError(f"{g.path}: a {g.layout} model of {len(set(t.file for t in g.tensors))} files; the engine reads "
                         "a single GGUF file (merge the set with llama-gguf-split --merge)")
    if not g.uniform:
        sizes = sorted({t.component_bytes for t in g.tensors})
        raise UsageError(f"{g.path}: expert tensors differ in slice size {sizes}; this engine needs one geometry for every layer")
    return g


def _open_reader(path: str):
    return open_gguf(path)


def _field(reader, key: str):
    f = reader.get_field(key)
    return None if f is None else f.contents()


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
