"""Write a small but complete MoE transformer as a GGUF file, laid out like the real model.

Routed experts are quantized (Q8_0 or Q4_0; or F32 for storage-bound runs on slow CPUs) in `blk.N.ffn_{gate,up,down}_exps.weight`,
expert-major, so expert e of a tensor starts at `tensor_offset + e * component_bytes`; the file
alignment is 4096, and dims are accepted only when every component is a whole number of 4 KiB
pages, so each component is 4 KiB-aligned and cold-readable as is. Norms, router, shared expert,
attention, embeddings and output are resident (F32); the shared expert is ff/4 wide.

Every tensor is drawn from its own generator seeded by (seed, tensor index), and tensors are
generated and written one at a time, so memory stays at one tensor and the same arguments always
give the same bytes. The file is written under a temporary name and renamed.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Callable, ClassVar, Optional, Sequence

import numpy as np

from core.errors import UsageError, WriteError
from core.results import Document

from .constants import (
    ALIGNMENT,
    ARCH,
    ATTN_DIM,
    COMPONENTS,
    KV_ATTN,
    KV_DIM,
    KV_EXPERTS,
    KV_FF,
    KV_LAYERS,
    KV_SEED,
    KV_TOP_K,
    KV_VOCAB,
    QUANT_BLOCK,
    QUANT_TYPES,
    SHARED_FF_DIVISOR,
    SYNTH_DEFAULTS,
    expert_tensor_name,
)


class SynthSummary(Document):
    """`engine-bridge synth --json`: what `synthesize` (or `synthesize_colibri`) wrote."""

    KIND: ClassVar[str] = "synth"
    SCHEMA: ClassVar[int] = 1


@dataclass(frozen=True)
class SynthSpec:
    layers: int = SYNTH_DEFAULTS["layers"]
    experts: int = SYNTH_DEFAULTS["experts"]
    top_k: int = SYNTH_DEFAULTS["top_k"]
    dim: int = SYNTH_DEFAULTS["dim"]
    ff: int = SYNTH_DEFAULTS["ff"]
    vocab: int = SYNTH_DEFAULTS["vocab"]
    seed: int = SYNTH_DEFAULTS["seed"]
    quant: str = SYNTH_DEFAULTS["quant"]

    @property
    def component_bytes(self) -> int:
        """Bytes of one expert's gate (= up = down) slice."""
        values, nbytes = QUANT_TYPES[self.quant]
        return self.dim * self.ff // values * nbytes

    @property
    def expert_bytes(self) -> int:
        return 3 * self.component_bytes


def check_spec(s: SynthSpec) -> SynthSpec:
    """Refuse shapes the layout cannot hold, with the nearest fix in the message."""
    if s.quant not in QUANT_TYPES:
        raise UsageError(f"--quant {s.quant!r}: use one of {', '.join(QUANT_TYPES)}")
    for name in ("layers", "experts", "top_k", "dim", "ff", "vocab"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"--{name.replace('_', '-')} {v!r}: must be a positive integer")
    if s.top_k > s.experts:
        raise UsageError(f"--top-k {s.top_k} is more than --experts {s.experts}: choose at most {s.experts}")
    if s.vocab < 2:
        raise UsageError(f"--vocab {s.vocab}: need at least 2 tokens")
    for name in ("dim", "ff"):
        if getattr(s, name) % QUANT_BLOCK:
            raise UsageError(f"--{name} {getattr(s, name)}: must be a multiple of {QUANT_BLOCK}")
    if s.dim < ATTN_DIM:
        raise UsageError(f"--dim {s.dim}: must be at least {ATTN_DIM} (the attention head width)")
    if s.component_bytes % ALIGNMENT:
        # Q8_0 and Q4_0 block bytes (34, 18) are 2 x odd, so dim*ff must be a multiple of 65536 (f32: 1024).
        values, nbytes = QUANT_TYPES[s.quant]
        need = ALIGNMENT * values // int(np.gcd(ALIGNMENT * values, nbytes))
        raise UsageError(f"--dim {s.dim} --ff {s.ff}: an expert component would be {s.component_bytes} B, not a multiple "
                         f"of {ALIGNMENT} B; choose dim*ff a multiple of {need} (e.g. --dim 512 --ff 1024)")
    return s


def ggml_qtype(quant: str):
    """gguf's quantization type for a `--quant` name."""
    from gguf import GGMLQuantizationType
    return {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}[quant]


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]        # numpy order (outermost first), float elements
    scale: float                  # std of the normal draw
    offset: float = 0.0           # added after the draw (norms sit around 1)
    quant: Optional[str] = None   # None = F32 resident


def tensor_plan(s: SynthSpec) -> list[_Tensor]:
    """Every tensor of the model in file order (pure)."""
    d, f, e, a, v = s.dim, s.ff, s.experts, ATTN_DIM, s.vocab
    fs = max(QUANT_BLOCK, f // SHARED_FF_DIVISOR)
    routed = None if s.quant == "f32" else s.quant      # f32 experts are plain F32 tensors
    out = [_Tensor("token_embd.weight", (v, d), 1.0)]
    for i in range(s.layers):
        p = f"blk.{i}."
        out += [
            _Tensor(p + "attn_norm.weight", (d,), 0.05, 1.0),
            _Tensor(p + "attn_q.weight", (a, d), d ** -0.5),
            _Tensor(p + "attn_k.weight", (a, d), d ** -0.5),
            _Tensor(p + "attn_v.weight", (a, d), d ** -0.5),
            _Tensor(p + "attn_output.weight", (d, a), a ** -0.5),
            _Tensor(p + "ffn_norm.weight", (d,), 0.05, 1.0),
            _Tensor(p + "ffn_gate_inp.weight", (e, d), d ** -0.5),
            _Tensor(p + "ffn_gate_shexp.weight", (fs, d), d ** -0.5),
            _Tensor(p + "ffn_up_shexp.weight", (fs, d), d ** -0.5),
            _Tensor(p + "ffn_down_shexp.weight", (d, fs), fs ** -0.5),
        ]
        for comp in COMPONENTS:
            shape = (e, d, f) if comp == "down" else (e, f, d)
            fan_in = shape[-1]
            out.append(_Tensor(expert_tensor_name(i, comp), shape, fan_in ** -0.5, 0.0, routed))
    out += [_Tensor("output_norm.weight", (d,), 0.05, 1.0), _Tensor("output.weight", (v, d), d ** -0.5)]
    return out


def tensor_nbytes(t) -> int:
    """The bytes of a planned tensor (`.shape` in float elements, `.quant` None for F32) in the file."""
    values, nbytes = QUANT_TYPES[t.quant or "f32"]
    return int(np.prod(t.shape)) // values * nbytes


def byte_shape(t) -> tuple[int, ...]:
    """A planned tensor's shape as the GGUF writer takes it: bytes in the last axis when quantized."""
    if t.quant is None:
        return t.shape
    values, nbytes = QUANT_TYPES[t.quant]
    return t.shape[:-1] + (t.shape[-1] // values * nbytes,)


def _generate(t: _Tensor, seed: int, index: int) -> np.ndarray:
    from gguf import quants

    rng = np.random.default_rng([seed, index])
    if t.quant is None:
        x = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(t.scale) + np.float32(t.offset)
        return np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(byte_shape(t), dtype=np.uint8)
    for e in range(t.shape[0]):       # one expert at a time keeps the float draw small
        x = rng.standard_normal(t.shape[1:], dtype=np.float32) * np.float32(t.scale)
        out[e] = quants.quantize(x, ggml_qtype(t.quant))
    return out


def write_gguf(path: str, arch: str, plan: Sequence, metadata: Callable[[object], None],
               generate: Callable[[object, int], np.ndarray], progress: Callable[[int, int], None] | None = None,
               force: bool = False) -> str:
    """Write a GGUF of `plan` (tensors with `.name`, `.shape`, `.quant`, in file order) to `path`
    through `path.tmp-PID`, fsynced, then renamed; `metadata(writer)` adds the key/values,
    `generate(tensor, index)` gives each tensor's data. Anything already at `path` is refused
    unless `force`, which replaces a file atomically, never a folder; a failed write leaves no
    temporary file. progress(done_bytes, total_bytes) after each tensor. Returns the absolute path."""
    import gguf

    total = sum(tensor_nbytes(t) for t in plan)
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        raise UsageError(f"{path}: directory {d} does not exist; create it first")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a folder; give the .gguf file to write")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{path}: already exists; give another name, or --force to replace it")
    tmp = f"{path}.tmp-{os.getpid()}"
    w = gguf.GGUFWriter(tmp, arch)
    try:
        metadata(w)
        for t in plan:
            if t.quant is None:
                w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), tensor_nbytes(t))
            else:
                w.add_tensor_info(t.name, byte_shape(t), np.dtype(np.uint8), tensor_nbytes(t),
                                  raw_dtype=ggml_qtype(t.quant))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        done = 0
        for i, t in enumerate(plan):
            w.write_tensor_data(generate(t, i))
            done += tensor_nbytes(t)
            if progress:
                progress(done, total)
        w.flush()
        for f in w.fout or ():
            os.fsync(f.fileno())
        w.close()
        os.replace(tmp, path)
    except OSError as e:
        raise WriteError(f"{path}: writing the model failed ({e.strerror or e}); check free space and permissions") from None
    finally:
        w.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def synthesize(path: str, spec: SynthSpec, progress: Callable[[int, int], None] | None = None,
               force: bool = False) -> dict:
    """Write the model to `path` (through `path.tmp-PID`, then rename); returns a summary dict.
    Anything already at `path` is refused unless `force` (one typo must not replace a model or a
    replica); with `force` a file is replaced atomically, a folder never.

    progress(done_bytes, total_bytes) is called after each tensor.
    """
    spec = check_spec(spec)

    def metadata(w) -> None:
        w.add_custom_alignment(ALIGNMENT)
        w.add_name(f"{ARCH}-synth-L{spec.layers}-E{spec.experts}-k{spec.top_k}-d{spec.dim}-f{spec.ff}-{spec.quant}")
        for key, val in ((KV_LAYERS, spec.layers), (KV_EXPERTS, spec.experts), (KV_TOP_K, spec.top_k),
                         (KV_DIM, spec.dim), (KV_FF, spec.ff), (KV_VOCAB, spec.vocab), (KV_ATTN, ATTN_DIM)):
            w.add_uint32(f"{ARCH}.{key}", val)
        w.add_uint64(f"{ARCH}.{KV_SEED}", spec.seed)

    path = write_gguf(path, ARCH, tensor_plan(spec), metadata, lambda t, i: _generate(t, spec.seed, i), progress, force)
    size = os.path.getsize(path)
    return {"path": path, "bytes": size, **asdict(spec), "component_bytes": spec.component_bytes,
            "expert_bytes": spec.expert_bytes, "routed_bytes": spec.layers * spec.experts * spec.expert_bytes}
