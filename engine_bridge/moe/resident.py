"""A model seen by the engine: expert geometry from the tensor table, resident weights.

The geometry is `models.geometry`'s (the planner and iobench read the same); `inspect_model`
reads only the header and tensor table, so it works on the real 518 GB file, and refuses what the
engine cannot stage. `load_resident` reads the small resident tensors normally (through the page
cache); routed experts are never read here: they come only through the split reader.

Two kinds of model compute: a GGUF file `synth` writes, and a colibri-format directory
(`synth_colibri`, or any glm_moe_dsa directory of int8 rows without dense layers): safetensors
shards with one tensor per expert and component, each an int8-row weight (`NAME`, U8/I8, O*I
bytes) with its per-row F32 scales (`NAME.qs`). For that format the routed experts' per-row
scales are resident (read here, 4 bytes per row: 16 KiB per expert at the defaults); only the
int8 rows come through the reader. The engine computes its own architecture from the directory's
tensors: colibri's MLA attention is folded into the engine's single head (head 0, the q_a/kv_a
RMSNorm weights kept as diagonal scales but not their normalisation, no RoPE), the router's
softmax top-k ignores `e_score_correction_bias`, norm_topk_prob and routed_scaling_factor. So its
tokens are its own, not colibri's; what it shares with colibri is every weight and every read.

A qwen3moe GGUF (`synth --format qwen3moe`, or any qwen3moe GGUF whose routed experts are Q8_0,
Q4_0 or F32) is computed as llama.cpp's src/models/qwen3moe.cpp builds it: grouped-query
attention with per-head RMSNorm of q and k and NeoX RoPE, no shared expert (`Attention` below).
Its resident tensors may be of any type the gguf library dequantizes. A GGUF model may be one
file or a split set (resident tensors are read from the member that holds each).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from core.errors import UsageError
from models.geometry import ExpertTensor, Geometry
from models.modelset import discover
from models.tensortable import inspect_model as inspect_any
from models.tensortable import read_tensor_table

from .constants import (
    ARCH,
    COLIBRI_MODEL_TYPE,
    COLIBRI_SCALE_SUFFIX,
    COMPONENTS,
    KV_ATTN,
    KV_SEED,
    LAYER_RESIDENT,
    QWEN3MOE_ARCH,
    QWEN3MOE_RESIDENT,
    RMS_EPS,
    ROW_INT8,
)

__all__ = ["Attention", "ExpertTensor", "Geometry", "inspect_model", "Resident", "load_resident"]

_EXPERT_QTYPES = ("Q8_0", "Q4_0", "F32")


def inspect_model(path: str) -> Geometry:
    """Expert geometry of a model `run` can compute (models.tensortable reads it): a GGUF file or
    split set with stacked gate/up/down tensors whose slices are one size, as `synth` writes (its
    dequantize and resident weights assume that shape). Replay reads any geometry."""
    g = inspect_any(path)
    if g.format == "safetensors":
        return _check_colibri(g)
    if not g.stacked or g.components != COMPONENTS:
        raise UsageError(f"{g.path}: routed experts are {'per-expert tensors' if not g.stacked else '/'.join(g.components)}; "
                         "the engine reads stacked blk.N.ffn_{gate,up,down}_exps.weight tensors (a GGUF model)")
    return _uniform(g)


_INT8_DTYPES = ("U8", "I8")


def _check_colibri(g: Geometry) -> Geometry:
    """A safetensors directory `run` computes: colibri's GLM layout, one tensor per expert and
    component, every routed component int8 rows of one size."""
    from engines.colibri import known_model_types

    # another member's model_type in the same GLM-shaped layout: `synth --model-type` writes one so that
    # member's read rules can be run (the stand-in engines); the layers are computed as the GLM's
    if g.arch != COLIBRI_MODEL_TYPE and not (g.arch in known_model_types() and _synthesized(g)):
        raise UsageError(f"{g.path}: config.json model_type is {g.arch!r}; `run` computes a safetensors directory only in "
                         f"colibri's {COLIBRI_MODEL_TYPE} int8-row format (write one with `engine-bridge synth --format "
                         "colibri`; `engine-bridge replay` reads any model)")
    if g.stacked or g.components != COMPONENTS:
        raise UsageError(f"{g.path}: routed experts are {'stacked' if g.stacked else '/'.join(g.components)}; colibri's "
                         "format keeps one tensor per expert: model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight")
    dtypes = sorted({t.qtype for t in g.tensors})
    if any(d not in _INT8_DTYPES for d in dtypes):
        raise UsageError(f"{g.path}: routed experts are {', '.join(dtypes)}; the engine computes colibri's pre-quantised "
                         "int8 rows (U8 or I8 weights with F32 NAME.qs per-row scales)")
    return _uniform(g)


def _synthesized(g: Geometry) -> bool:
    """The model directory's config.json says `engine-bridge synth` wrote it (GLM-shaped whatever its model_type)."""
    import json
    import os

    try:
        with open(os.path.join(g.path if os.path.isdir(g.path) else os.path.dirname(g.path), "config.json")) as f:
            return "replica_tuner_synth" in json.load(f)
    except (OSError, ValueError):
        return False


def _uniform(g: Geometry) -> Geometry:
    """g, when every expert component has one slice size (the dequantize and resident weights assume it)."""
    if not g.uniform:
        sizes = sorted({t.component_bytes for t in g.tensors})
        raise UsageError(f"{g.path}: expert tensors differ in slice size {sizes}; this engine needs one geometry for every layer")
    return g


@dataclass(frozen=True)
class Attention:
    """Grouped-query attention as qwen3moe computes it: `heads` query heads over `kv_heads` K/V
    heads of `head_dim`, q and k RMSNormed per head, NeoX RoPE (pairs i and i + rope_dims/2)."""
    heads: int
    kv_heads: int
    head_dim: int
    rope_base: float
    rope_dims: int


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
    qtype: str                   # routed experts' GGML type, or ROW_INT8 (colibri's int8 rows)
    seed: int
    # ROW_INT8 only: per layer, per expert, the (gate, up, down) per-row F32 scales (resident)
    row_scales: tuple | None = None
    # None: the engine's own single head (`synth`'s models); else qwen3moe's attention
    attention: Attention | None = None
    eps: float = RMS_EPS         # RMSNorm epsilon


def load_resident(geometry: Geometry) -> Resident:
    """Read the resident tensors of a model written by `synth` or `synth --format qwen3moe` (plain
    reads), or of a colibri-format directory (`synth_colibri`; see the module doc)."""
    if geometry.format == "safetensors":
        return _colibri_resident(geometry)
    if geometry.arch == QWEN3MOE_ARCH:
        return _qwen3moe_resident(geometry, _Table(geometry.path, "engine-bridge synth --format qwen3moe"))
    if geometry.arch != ARCH:
        raise UsageError(f"{geometry.path}: architecture {geometry.arch!r} is neither {ARCH!r} nor {QWEN3MOE_ARCH!r}; `run` "
                         "computes models written by `engine-bridge synth` (use `engine-bridge replay` for other models)")
    T = _Table(geometry.path, "engine-bridge synth")

    def get(name: str) -> np.ndarray:
        t = T.info(name)
        if t.dtype != "F32":
            raise UsageError(f"{geometry.path}: tensor {name} is {t.dtype}, expected F32")
        return T.floats(name)

    qtype = _expert_qtype(geometry)
    layers = tuple({n: get(f"blk.{i}.{n}.weight") for n in LAYER_RESIDENT} for i in range(geometry.layers))
    embed = get("token_embd.weight")
    first = layers[0]
    gate = geometry.tensor(0, "gate").shape  # (dim, ff, experts)
    return Resident(embed=embed, output_norm=get("output_norm.weight"), output=get("output.weight"), layers=layers,
                    dim=int(gate[0]), ff=int(gate[1]), attn=int(T.meta.get(f"{ARCH}.{KV_ATTN}") or first["attn_q"].shape[0]),
                    vocab=int(embed.shape[0]), qtype=qtype, seed=int(T.meta.get(f"{ARCH}.{KV_SEED}") or 0))


def _expert_qtype(geometry: Geometry) -> str:
    qtypes = {t.qtype for t in geometry.tensors}
    if qtypes - set(_EXPERT_QTYPES) or len(qtypes) != 1:
        raise UsageError(f"{geometry.path}: routed experts are {sorted(qtypes)}; the engine computes one of "
                         f"{', '.join(_EXPERT_QTYPES)}")
    return qtypes.pop()


def _qwen3moe_resident(g: Geometry, T: "_Table") -> Resident:
    """The resident weights of a qwen3moe GGUF, with the hyperparameters llama.cpp reads
    (src/llama-model.cpp `load_hparams`, src/models/qwen3moe.cpp), dequantized to float32."""
    a = QWEN3MOE_ARCH
    dim = T.meta_int(f"{a}.embedding_length")
    heads = T.meta_int(f"{a}.attention.head_count")
    kv_heads = T.meta_int(f"{a}.attention.head_count_kv", heads)
    head_dim = T.meta_int(f"{a}.attention.key_length", dim // heads)
    if T.meta_int(f"{a}.attention.value_length", head_dim) != head_dim or heads % kv_heads:
        raise UsageError(f"{g.path}: attention key/value widths or head counts ({heads} heads, {kv_heads} K/V heads) are "
                         "not qwen3moe's: equal key and value widths, heads a multiple of K/V heads")
    rope_dims = T.meta_int(f"{a}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UsageError(f"{g.path}: {a}.rope.dimension_count {rope_dims} is not the head width {head_dim} (qwen3moe "
                         "ropes whole heads)")
    rope_base = float(T.meta.get(f"{a}.rope.freq_base", 10000.0))
    eps = float(T.meta.get(f"{a}.attention.layer_norm_rms_epsilon", RMS_EPS))
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {"attn_norm": (dim,), "attn_q": (q, dim), "attn_k": (kv, dim), "attn_v": (kv, dim),
              "attn_output": (dim, q), "attn_q_norm": (head_dim,), "attn_k_norm": (head_dim,), "ffn_norm": (dim,),
              "ffn_gate_inp": (g.experts, dim)}
    layers = tuple({n: T.floats(f"blk.{lid}.{n}.weight", shapes[n]) for n in QWEN3MOE_RESIDENT}
                   for lid in (g.layer_ids or range(g.layers)))
    embed = T.floats("token_embd.weight")
    vocab = int(embed.shape[0])
    output = T.floats("output.weight", (vocab, dim)) if "output.weight" in T.byname else embed   # tied when absent
    gate = g.tensor(0, "gate").shape  # (dim, ff, experts)
    if int(gate[0]) != dim or embed.shape != (vocab, dim):
        raise UsageError(f"{g.path}: experts or embeddings are not {dim} wide ({a}.embedding_length)")
    return Resident(embed=embed, output_norm=T.floats("output_norm.weight", (dim,)), output=output, layers=layers,
                    dim=dim, ff=int(gate[1]), attn=kv, vocab=vocab, qtype=_expert_qtype(g), seed=0,
                    attention=Attention(heads, kv_heads, head_dim, rope_base, rope_dims), eps=eps)


# -- colibri's format ----------------------------------------------------------------------------

class _Table:
    """Plain reads of named tensors of a model's files: a GGUF file or split set, or a safetensors
    directory (offsets from its tensor table). `writer`: the command that makes such a model."""

    def __init__(self, path: str, writer: str = "engine-bridge synth --format colibri"):
        self.model = discover(path)
        table = read_tensor_table(self.model)
        self.path, self.meta, self.format, self.writer = path, table.meta, table.format, writer
        self.byname = {t.name: t for t in table.tensors}

    def info(self, name: str):
        t = self.byname.get(name)
        if t is None:
            raise UsageError(f"{self.path}: tensor {name} is missing; re-create the model with `{self.writer}`")
        return t

    def meta_int(self, key: str, default: int | None = None) -> int:
        v = self.meta.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{self.path}: metadata {key} is {v!r}; need a positive integer")
        return v

    def floats(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A GGUF tensor as float32 in numpy order (ggml's ne reversed), dequantized by the gguf
        library when it is not F32; UsageError when its shape is not `shape`."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        t = self.info(name)
        want = tuple(reversed(t.shape))
        raw = np.frombuffer(self.raw(name), dtype=np.uint8)
        if t.dtype == "F32":
            a = raw.view("<f4").astype(np.float32)
        else:
            try:
                qt = GGMLQuantizationType[t.dtype]
                rows = int(np.prod(want[:-1])) if len(want) > 1 else 1
                a = dequantize(raw.reshape(rows, -1), qt).astype(np.float32)
            except (KeyError, NotImplementedError, ValueError) as e:
                raise UsageError(f"{self.path}: tensor {name} is {t.dtype}, which the engine cannot read ({e})") from None
        if a.size != int(np.prod(want)) or (shape is not None and want != tuple(shape)):
            raise UsageError(f"{self.path}: tensor {name} has shape {want}, expected {tuple(shape or want)}")
        return a.reshape(want)

    def raw(self, name: str) -> bytes:
        t = self.info(name)
        fd = os.open(self.model.abs(t.file), os.O_RDONLY)
        try:
            data = os.pread(fd, t.nbytes, t.offset)
        finally:
            os.close(fd)
        if len(data) != t.nbytes:
            raise UsageError(f"{self.path}: {t.file} is truncated (tensor {name}); re-create or re-copy the model")
        return data

    def f32(self, name: str, n: int | None = None) -> np.ndarray:
        t = self.info(name)
        if t.dtype == "F32":
            a = np.frombuffer(self.raw(name), dtype="<f4").astype(np.float32)
        elif t.dtype == "BF16":
            a = (np.frombuffer(self.raw(name), dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise UsageError(f"{self.path}: tensor {name} is {t.dtype}, expected F32 or BF16")
        if n is not None and a.size != n:
            raise UsageError(f"{self.path}: tensor {name} holds {a.size} values, expected {n}")
        return a

    def rows(self, name: str, out_rows: int, in_cols: int) -> np.ndarray:
        """A pre-quantised weight (int8 rows x per-row scale) as float32 (out_rows, in_cols)."""
        t = self.info(name)
        if t.dtype not in _INT8_DTYPES or t.nbytes != out_rows * in_cols:
            raise UsageError(f"{self.path}: {name} is {t.dtype}, {t.nbytes} B; the engine reads int8 rows "
                             f"({out_rows} x {in_cols} = {out_rows * in_cols} B, colibri's fmt=1)")
        q = np.frombuffer(self.raw(name), dtype=np.int8).reshape(out_rows, in_cols)
        return q * self.f32(name + COLIBRI_SCALE_SUFFIX, out_rows)[:, None]

    def cfg(self, key: str) -> int:
        v = self.meta.get(key)
        if isinstance(v, bool) or not isinstance(v, int):
            raise UsageError(f"{self.path}: config.json {key} is {v!r}; need an integer")
        return v


def _fold_head(T: _Table, p: str, D: int, H: int, qn: int, qr: int, vh: int, ql: int, kl: int) -> dict:
    """colibri's MLA attention, head 0, as the engine's single head (see the module doc), widths
    padded with zeros to one head width a = max(qn + qr, vh)."""
    q_a = T.rows(p + "self_attn.q_a_proj.weight", ql, D).astype(np.float64)
    q_b = T.rows(p + "self_attn.q_b_proj.weight", H * (qn + qr), ql)[:qn + qr].astype(np.float64)
    kv_a = T.rows(p + "self_attn.kv_a_proj_with_mqa.weight", kl + qr, D).astype(np.float64)
    kv_b = T.rows(p + "self_attn.kv_b_proj.weight", H * (qn + vh), kl)[:qn + vh].astype(np.float64)
    o = T.rows(p + "self_attn.o_proj.weight", D, H * vh)[:, :vh]
    q_ln = T.f32(p + "self_attn.q_a_layernorm.weight", ql).astype(np.float64)
    kv_ln = T.f32(p + "self_attn.kv_a_layernorm.weight", kl).astype(np.float64)
    latent = kv_ln[:, None] * kv_a[:kl]                       # (kl, D)
    q = (q_b * q_ln[None, :]) @ q_a                           # (qn + qr, D)
    k = np.vstack([kv_b[:qn] @ latent, kv_a[kl:]])            # (qn + qr, D)
    v = kv_b[qn:] @ latent                                    # (vh, D)
    a = max(qn + qr, vh)

    def pad_rows(m):
        return np.vstack([m, np.zeros((a - m.shape[0], m.shape[1]))]).astype(np.float32)

    out = np.hstack([o, np.zeros((D, a - vh), np.float32)]).astype(np.float32)
    return {"attn_q": pad_rows(q), "attn_k": pad_rows(k), "attn_v": pad_rows(v), "attn_output": out}


def _colibri_resident(g: Geometry) -> Resident:
    """The resident weights of a colibri-format directory, plus the routed experts' per-row scales."""
    T = _Table(g.path)
    D, F, V = T.cfg("hidden_size"), T.cfg("moe_intermediate_size"), T.cfg("vocab_size")
    H, layers = T.cfg("num_attention_heads"), T.cfg("num_hidden_layers")
    qn, qr, vh = T.cfg("qk_nope_head_dim"), T.cfg("qk_rope_head_dim"), T.cfg("v_head_dim")
    ql, kl, shared = T.cfg("q_lora_rank"), T.cfg("kv_lora_rank"), T.cfg("n_shared_experts")
    dense = T.meta.get("first_k_dense_replace", 0)
    if dense or layers != g.layers or g.layer_ids != tuple(range(layers)):
        raise UsageError(f"{g.path}: {dense} dense layer(s) of {layers} (routed experts in {g.layers}); the engine "
                         "computes colibri models whose every layer routes (first_k_dense_replace 0)")
    if shared < 1:
        raise UsageError(f"{g.path}: n_shared_experts is {shared}; the engine computes a shared expert")
    if g.component_bytes != D * F:
        raise UsageError(f"{g.path}: an expert component is {g.component_bytes} B, not hidden_size x "
                         f"moe_intermediate_size = {D * F} int8 bytes")
    sI = F * shared
    out_layers, scales = [], []
    for i in range(layers):
        p = f"model.layers.{i}."
        L = {"attn_norm": T.f32(p + "input_layernorm.weight", D), "ffn_norm": T.f32(p + "post_attention_layernorm.weight", D),
             "ffn_gate_inp": T.f32(p + "mlp.gate.weight", g.experts * D).reshape(g.experts, D),
             "ffn_gate_shexp": T.rows(p + "mlp.shared_experts.gate_proj.weight", sI, D),
             "ffn_up_shexp": T.rows(p + "mlp.shared_experts.up_proj.weight", sI, D),
             "ffn_down_shexp": T.rows(p + "mlp.shared_experts.down_proj.weight", D, sI)}
        L.update(_fold_head(T, p, D, H, qn, qr, vh, ql, kl))
        out_layers.append(L)
        per = []
        for e in range(g.experts):
            n = f"{p}mlp.experts.{e}."
            per.append(tuple(T.f32(f"{n}{c}_proj.weight{COLIBRI_SCALE_SUFFIX}", rows)
                             for c, rows in (("gate", F), ("up", F), ("down", D))))
        scales.append(tuple(per))
    synth = T.meta.get("replica_tuner_synth")
    seed = synth.get("seed", 0) if isinstance(synth, dict) else 0
    first = out_layers[0]
    return Resident(embed=T.rows("model.embed_tokens.weight", V, D), output_norm=T.f32("model.norm.weight", D),
                    output=T.rows("lm_head.weight", V, D), layers=tuple(out_layers), dim=D, ff=F,
                    attn=int(first["attn_q"].shape[0]), vocab=V, qtype=ROW_INT8, seed=int(seed),
                    row_scales=tuple(scales))
