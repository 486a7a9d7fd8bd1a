"""Write a tiny GLM-shaped MoE model directory exactly as colibri's GLM engine loads it.

colibri (github.com/JustVugg/colibri; read at tekintian/colibri 4ef9a99) loads a directory of
safetensors shards plus config.json and tokenizer.json (c/colibri.c `model_init`, c/st.h
`st_init_multi`, c/tok.h `tok_load`). What it accepts, and what this module writes:

- config.json (`load_cfg`): hidden_size, num_hidden_layers, num_attention_heads,
  n_routed_experts, num_experts_per_tok, moe_intermediate_size, intermediate_size,
  first_k_dense_replace, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
  v_head_dim, n_shared_experts, vocab_size, n_group (must be 1), topk_group, norm_topk_prob,
  rms_norm_eps, routed_scaling_factor, rope_parameters.rope_theta, eos_token_id, index_topk
  (0: no DSA indexer). model_type `glm_moe_dsa` is what the `coli` launcher sends to this engine
  (c/coli `model_arch`: everything not inkling/kimi/olmoe/deepseek_v4 is GLM).
- every 2-D weight pre-quantised as colibri's converter writes it (c/tools/convert_fp8_to_int4.py
  `quant_int8`, `convert_shard`): `NAME` = the int8 rows as a flat U8 tensor of O*I bytes and
  `NAME.qs` = one F32 scale per row ([O]); colibri tells the format from the byte counts alone
  (`qt_resolve_fmt`: O*I weight bytes and O*4 scale bytes is fmt=1, "int8-row"), and streams a
  routed expert only when its `.qs` exists (`expert_load_impl`). Norms, the router
  (`mlp.gate.weight`) and its `e_score_correction_bias` are F32 (`ld`).
- tensor names (`model_init`, `expert_load_impl`): model.embed_tokens.weight, lm_head.weight,
  model.norm.weight; per layer model.layers.N.{input_layernorm, post_attention_layernorm}.weight,
  self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
  o_proj}.weight, mlp.gate.weight, mlp.gate.e_score_correction_bias,
  mlp.shared_experts.{gate,up,down}_proj.weight and the routed
  mlp.experts.E.{gate,up,down}_proj.weight (gate/up [I, D], down [D, I]). No MTP layer, no
  indexer, no dense layers (first_k_dense_replace 0).
- shards named as the converter names them (`out-NNNNN.safetensors`; `st_scan_dir` takes every
  *.safetensors). Layers are spread over the shards in order, each layer whole in one shard (the
  first also holds the embeddings, the last the final norm and lm_head, as the converter's output
  has them), so a mirror may hold a subset of the shards (`st_mirror_add` keeps the others on the
  primary). The safetensors library writes a shard's F32 tensors first, then its U8 tensors by
  name, so an expert's down/gate/up weights are contiguous and colibri reads them with one pread
  (`expert_load_impl`'s `contig`); the three `.qs` are separate small reads.
- tokenizer.json (`tok_load`): a byte-level BPE (the 256 GPT-2 byte symbols, letter-pair merges up
  to the vocabulary, then `<|endoftext|>`, `[gMASK]`, `<sop>` as added special tokens), every id
  below vocab_size covered.

Every tensor is drawn from its own generator seeded by (seed, its index in the model's tensor
list), independent of the shard count, so the same arguments always give the same bytes and a
different shard count the same tensors. The directory is written as DEST.tmp-PID and renamed; an
existing DEST is refused unless `force`. A shard is built in memory before it is written (the
library's API), so memory is one shard.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np

from core.errors import UsageError, WriteError
from core.fsutil import fsync_dir

from .constants import COLIBRI_MODEL_TYPE, COLIBRI_SCALE_SUFFIX

SHARD_NAME = "out-{:05d}.safetensors"          # the converter's naming (convert_fp8_to_int4.py)
SPECIAL_TOKENS = ("<|endoftext|>", "[gMASK]", "<sop>")   # run_text looks these up by content
# cl100k's split rule, which colibri's tok.h implements (it only checks the pattern for o200k/Han).
PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_MERGE_ALPHABET = "etaoinshrdlucmfwypvbgkjqxz"
_INT8_STD = float(np.sqrt((255.0 ** 2 - 1) / 12.0))   # std of integers uniform in [-127, 127]
_DIM_MULTIPLE = 64


@dataclass(frozen=True)
class ColibriSpec:
    """The model's shape. Defaults: 4 layers x 16 experts, top-4, hidden 1024, expert width 1536,
    so one expert (three int8 components of 1.5 MiB) is a 4.5 MiB read, above colibri's 4 MiB
    striping threshold (`mir_pread_striped`); about 300 MB in 4 shards."""
    layers: int = 4
    experts: int = 16
    top_k: int = 4
    dim: int = 1024            # hidden_size
    ff: int = 1536             # moe_intermediate_size (routed and shared expert width)
    vocab: int = 512
    shards: int = 4
    seed: int = 0
    heads: int = 4
    q_lora: int = 256
    kv_lora: int = 128
    qk_nope: int = 48
    qk_rope: int = 16
    v_head: int = 64
    # config.json model_type: colibri's launcher picks the engine by it. The GLM engine's by default;
    # another member's (deepseek_v41, ...) gives a GLM-shaped model that member's read rules place
    # (the stand-in engine's demos): the real engine of that member cannot run it.
    model_type: str = COLIBRI_MODEL_TYPE

    @property
    def qk_head(self) -> int:
        return self.qk_nope + self.qk_rope

    @property
    def component_bytes(self) -> int:
        return self.dim * self.ff              # one int8 byte per weight

    @property
    def expert_bytes(self) -> int:
        return 3 * self.component_bytes

def max_vocab() -> int:
    return 256 + len(_MERGE_ALPHABET) ** 2 + len(SPECIAL_TOKENS)


def check_spec(s: ColibriSpec) -> ColibriSpec:
    """Refuse shapes colibri (or this writer) cannot take, with the fix in the message."""
    from engines.colibri import known_model_types

    if s.model_type not in known_model_types():
        raise UsageError(f"--model-type {s.model_type!r}: use one of colibri's {', '.join(known_model_types())}")
    for name, v in asdict(s).items():
        if name == "model_type":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and name != "seed") or v < 0:
            raise UsageError(f"--{name.replace('_', '-')} {v!r}: must be a positive integer")
    if s.top_k > s.experts:
        raise UsageError(f"--top-k {s.top_k} is more than --experts {s.experts}: choose at most {s.experts}")
    if s.top_k > 64 or s.experts > 4096 or s.layers > 128:
        raise UsageError("colibri's load_cfg accepts at most 128 layers, 4096 experts and top-k 64")
    for name in ("dim", "ff"):
        if getattr(s, name) % _DIM_MULTIPLE:
            raise UsageError(f"--{name} {getattr(s, name)}: must be a multiple of {_DIM_MULTIPLE}")
    if s.qk_rope % 2:
        raise UsageError(f"qk_rope {s.qk_rope}: RoPE needs an even width")
    if not 256 + len(SPECIAL_TOKENS) <= s.vocab <= max_vocab():
        raise UsageError(f"--vocab {s.vocab}: the tokenizer needs {256 + len(SPECIAL_TOKENS)}..{max_vocab()} ids "
                         "(256 bytes, letter-pair merges, 3 special tokens)")
    if s.shards > s.layers:
        raise UsageError(f"--shards {s.shards}: each layer sits whole in one shard, so at most --layers ({s.layers})")
    return s


# -- the tensors ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]      # (O, I) for int8 rows; (n,) for F32 vectors, (E, D) for the router
    std: float                  # of the weights
    offset: float = 0.0         # added (norms sit around 1)
    rows: bool = False          # True: int8 rows + NAME.qs (F32 per row); False: F32
    layer: int = -1             # -1: global (embeddings, final norm, lm_head)


def tensor_plan(s: ColibriSpec) -> list[_Tensor]:
    """Every tensor of the model in a fixed order (the generator index); pure."""
    d, f, e, h = s.dim, s.ff, s.experts, s.heads
    out = [_Tensor("model.embed_tokens.weight", (s.vocab, d), 1.0, rows=True)]
    for i in range(s.layers):
        p = f"model.layers.{i}."

        def T(name, shape, std, offset=0.0, rows=False):
            return _Tensor(p + name, shape, std, offset, rows, i)

        out += [
            T("input_layernorm.weight", (d,), 0.05, 1.0),
            T("post_attention_layernorm.weight", (d,), 0.05, 1.0),
            T("self_attn.q_a_proj.weight", (s.q_lora, d), d ** -0.5, rows=True),
            T("self_attn.q_a_layernorm.weight", (s.q_lora,), 0.05, 1.0),
            T("self_attn.q_b_proj.weight", (h * s.qk_head, s.q_lora), s.q_lora ** -0.5, rows=True),
            T("self_attn.kv_a_proj_with_mqa.weight", (s.kv_lora + s.qk_rope, d), d ** -0.5, rows=True),
            T("self_attn.kv_a_layernorm.weight", (s.kv_lora,), 0.05, 1.0),
            T("self_attn.kv_b_proj.weight", (h * (s.qk_nope + s.v_head), s.kv_lora), s.kv_lora ** -0.5, rows=True),
            T("self_attn.o_proj.weight", (d, h * s.v_head), (h * s.v_head) ** -0.5, rows=True),
            T("mlp.gate.weight", (e, d), d ** -0.5),
            T("mlp.gate.e_score_correction_bias", (e,), 0.01),
            T("mlp.shared_experts.gate_proj.weight", (f, d), d ** -0.5, rows=True),
            T("mlp.shared_experts.up_proj.weight", (f, d), d ** -0.5, rows=True),
            T("mlp.shared_experts.down_proj.weight", (d, f), f ** -0.5, rows=True),
        ]
        for x in range(e):
            out += [T(f"mlp.experts.{x}.gate_proj.weight", (f, d), d ** -0.5, rows=True),
                    T(f"mlp.experts.{x}.up_proj.weight", (f, d), d ** -0.5, rows=True),
                    T(f"mlp.experts.{x}.down_proj.weight", (d, f), f ** -0.5, rows=True)]
    out += [_Tensor("model.norm.weight", (d,), 0.05, 1.0), _Tensor("lm_head.weight", (s.vocab, d), d ** -0.5, rows=True)]
    return out


def _generate(t: _Tensor, seed: int, index: int) -> dict[str, np.ndarray]:
    """The tensor's entries of a shard: {name: F32} or {name: U8 int8 rows (flat), name.qs: F32 [O]}."""
    rng = np.random.default_rng([seed, index])
    if not t.rows:
        x = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(t.std) + np.float32(t.offset)
        return {t.name: np.ascontiguousarray(x, dtype=np.float32)}
    o, i = t.shape
    q = rng.integers(-127, 128, size=o * i, dtype=np.int8)
    scale = (np.float32(t.std / _INT8_STD) * (np.float32(0.75) + np.float32(0.5) * rng.random(o, dtype=np.float32)))
    return {t.name: q.view(np.uint8), t.name + COLIBRI_SCALE_SUFFIX: scale.astype(np.float32)}


def shard_of_layer(s: ColibriSpec) -> list[int]:
    """Shard index of each layer: layers in order, as even a split as the count allows."""
    return [i * s.shards // s.layers for i in range(s.layers)]


def _shard_of(t: _Tensor, s: ColibriSpec, layer_shard: list[int]) -> int:
    if t.layer >= 0:
        return layer_shard[t.layer]
    return 0 if t.name == "model.embed_tokens.weight" else s.shards - 1


# -- config and tokenizer -----------------------------------------------------------------------

def config_doc(s: ColibriSpec) -> dict:
    """config.json: the keys load_cfg reads, plus the HF identity of a GLM MoE DSA checkpoint."""
    eos = s.vocab - len(SPECIAL_TOKENS)         # <|endoftext|>
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": s.model_type,
        "hidden_size": s.dim,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.heads,
        "n_routed_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "moe_intermediate_size": s.ff,
        "intermediate_size": s.ff,              # dense MLP width; unused (no dense layer) but load_cfg wants >= 1
        "first_k_dense_replace": 0,
        "n_shared_experts": 1,
        "q_lora_rank": s.q_lora,
        "kv_lora_rank": s.kv_lora,
        "qk_nope_head_dim": s.qk_nope,
        "qk_rope_head_dim": s.qk_rope,
        "v_head_dim": s.v_head,
        "vocab_size": s.vocab,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 4096,
        "index_topk": 0,
        "tie_word_embeddings": False,
        "eos_token_id": eos,
        "bos_token_id": eos + 1,
        "torch_dtype": "bfloat16",
        "replica_tuner_synth": {"seed": s.seed, "shards": s.shards, "format": "colibri int8-row"},
    }


def _byte_symbols() -> list[str]:
    """GPT-2 ByteLevel: the printable symbol of each byte 0..255 (tok.h tk_build_bytemap)."""
    direct = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out, n = [], 0
    for b in range(256):
        if b in direct:
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return out


def tokenizer_doc(s: ColibriSpec) -> dict:
    """A minimal valid byte-level BPE tokenizer.json whose ids cover 0..vocab-1."""
    vocab = {sym: i for i, sym in enumerate(_byte_symbols())}
    merges = []
    n_merges = s.vocab - 256 - len(SPECIAL_TOKENS)
    for a in _MERGE_ALPHABET:
        for b in _MERGE_ALPHABET:
            if len(merges) == n_merges:
                break
            vocab[a + b] = len(vocab)
            merges.append([a, b])
    added = [{"id": len(vocab) + k, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, c in enumerate(SPECIAL_TOKENS)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRETOKENIZE_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }


# -- writing ------------------------------------------------------------------------------------

def _write_json(path: str, doc: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def synthesize_colibri(path: str, spec: ColibriSpec, force: bool = False,
                       progress: Callable[[int, int], None] | None = None) -> dict:
    """Write the model directory at `path` (through `path.tmp-PID`, then renamed); returns a summary.

    progress(done_bytes, total_bytes) is called after each shard."""
    from safetensors.numpy import save_file

    spec = check_spec(spec)
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise UsageError(f"{path}: directory {parent} does not exist; create it first")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{path}: already exists; give another destination or --force to replace it")
    plan = tensor_plan(spec)
    layer_shard = shard_of_layer(spec)
    by_shard: list[list[tuple[int, _Tensor]]] = [[] for _ in range(spec.shards)]
    for idx, t in enumerate(plan):
        by_shard[_shard_of(t, spec, layer_shard)].append((idx, t))
    total = sum(int(np.prod(t.shape)) * (1 if t.rows else 4) + (4 * t.shape[0] if t.rows else 0) for t in plan)
    tmp = f"{path}.tmp-{os.getpid()}"
    old: Optional[str] = None
    try:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp)
        os.mkdir(tmp)
        done = 0
        for k, members in enumerate(by_shard):
            tensors: dict[str, np.ndarray] = {}
            for idx, t in members:
                tensors.update(_generate(t, spec.seed, idx))
            shard = os.path.join(tmp, SHARD_NAME.format(k))
            save_file(tensors, shard)
            _fsync(shard)
            done += sum(a.nbytes for a in tensors.values())
            del tensors
            if progress:
                progress(done, total)
        _write_json(os.path.join(tmp, "config.json"), config_doc(spec))
        _write_json(os.path.join(tmp, "tokenizer.json"), tokenizer_doc(spec))
        mode = os.stat(os.path.join(tmp, "config.json")).st_mode & 0o777
        for k in range(spec.shards):                # the library creates shards 0600; give them the umask's mode
            os.chmod(os.path.join(tmp, SHARD_NAME.format(k)), mode)
        fsync_dir(tmp)
        if os.path.lexists(path):           # force: move the old one aside, then drop it
            old = f"{path}.old-{os.getpid()}"
            os.rename(path, old)
        os.rename(tmp, path)
        fsync_dir(parent)
    except OSError as e:
        if old and not os.path.lexists(path):
            os.rename(old, path)
            old = None
        raise WriteError(f"{path}: writing the model failed ({e.strerror or e}); check free space and permissions") from None
    finally:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    files = sorted(os.listdir(path))
    size = sum(os.path.getsize(os.path.join(path, n)) for n in files)
    return {"path": path, "format": "colibri", "bytes": size, "files": files, **asdict(spec),
            "component_bytes": spec.component_bytes, "expert_bytes": spec.expert_bytes,
            "routed_bytes": spec.layers * spec.experts * spec.expert_bytes}
