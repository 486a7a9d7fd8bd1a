"""Write a tiny qwen3moe GGUF that the real llama.cpp loads and runs, and the embedded engine computes.

What llama.cpp requires, read from its source (llama.cpp 0c1e57098, the `vendor/llama.cpp` of
llama-cpp-python 0.3.36; docs/engine.md, "synth --format qwen3moe"):

- metadata: `general.architecture = qwen3moe`; `qwen3moe.context_length`, `.embedding_length`,
  `.block_count` (src/llama-model.cpp `load_hparams`), `.attention.layer_norm_rms_epsilon`
  (src/models/qwen3moe.cpp `load_arch_hparams`), `.expert_count` and `.expert_used_count`
  (`load_arch_tensors` throws "n_expert must be > 0 for QWEN3MOE" without them),
  `.attention.head_count` (without it there are no attention dims), `.attention.head_count_kv`,
  `.attention.key_length` = `.value_length` (qwen3moe asserts both equal the RoPE width),
  `.expert_feed_forward_length`, `.rope.freq_base`;
- tensors (`load_arch_tensors`; numpy shape = ggml ne reversed): `token_embd.weight`,
  `output_norm.weight`, `output.weight`; per layer `attn_norm`, `attn_q`, `attn_k`, `attn_v`,
  `attn_output`, `attn_q_norm`, `attn_k_norm`, `ffn_norm`, `ffn_gate_inp` and the routed experts
  stacked expert-major in `ffn_gate_exps`, `ffn_up_exps` {dim, ff, experts} and `ffn_down_exps`
  {ff, dim, experts}; no other tensor ("wrong number of tensors" otherwise);
- a tokenizer (src/llama-vocab.cpp `llama_vocab::impl::load`): `tokenizer.ggml.model = gpt2` (BPE,
  which needs `tokenizer.ggml.merges`), `tokenizer.ggml.pre = qwen2`, tokens, token types, bos/eos.

Routed experts are Q8_0 by default (Q4_0 and F32 too): llama.cpp's CPU backend repacks Q4_0 (and
Q4_K, IQ4_NL, ...) into anonymous memory on AVX2 machines (ggml/src/ggml-cpu/repack.cpp), so
such experts are no longer read from the file after load; Q8_0 stays mmap-backed. Every other
tensor is F32 (small; llama.cpp multiplies F32 weights without quantizing the activations). The
file keeps GGUF's default 32-byte alignment, as published GGUFs and llama.cpp's gguf-split do.

The tokenizer is a real byte-level BPE: the 256 GPT-2 byte symbols, merges learnt from a built-in
paragraph (pieces cut as the qwen2 pre-tokenizer cuts ASCII text), then three control tokens
(`<|endoftext|>` bos/pad, `<|im_start|>`, `<|im_end|>` eos). The output rows of the control tokens
are zero, so greedy decoding does not end on them early.

Every tensor is drawn from its own generator seeded by (seed, tensor index) and written as it is
generated (experts quantized one at a time), so memory stays at one tensor and the same arguments
give the same bytes. The file is written as OUT.tmp-PID and renamed; an existing OUT is refused
unless `force`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Callable, Optional

import numpy as np

from core.errors import UsageError

from .constants import COMPONENTS, QUANT_BLOCK, QUANT_TYPES, QWEN3MOE_ARCH, RMS_EPS, expert_tensor_name
from .synth import byte_shape, ggml_qtype, write_gguf

ARCH = QWEN3MOE_ARCH
FILE_TYPE = {"f32": 0, "q4_0": 2, "q8_0": 7}     # llama_ftype: ALL_F32, MOSTLY_Q4_0, MOSTLY_Q8_0
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ROPE_BASE = 1_000_000.0                          # Qwen3's rope_theta
MAX_LAYERS, MAX_EXPERTS = 512, 1024              # llama.cpp src/llama-hparams.h LLAMA_MAX_LAYERS / _EXPERTS
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = """
hello world. the quick brown fox jumps over the lazy dog. a model is a set of files on a drive.
replicas of a model live on several drives, and the engine reads the experts it needs from them.
the quick reader reads the next layer while the current layer computes. hello again, world.
one, two, three, four, five, six, seven, eight, nine, ten. once upon a time there was a tiny model
that spoke in random tokens, but it always said the same thing for the same prompt and seed.
"""
# The qwen2 pre-tokenizer (llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2) for ASCII text:
# contractions, letters with one leading non-letter, single digits, punctuation runs, newlines, spaces.
PRETOKENIZE = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
                         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Qwen3MoeSpec:
    """The model's shape. Defaults: 6 layers (75 tensors) x 16 experts, top-4, width 512, expert
    width 256, 4 query heads and 2 K/V heads of 64: about 50 MB, 80 % of it routed experts (Q8_0:
    a component is 139,264 B, an expert 417,792 B)."""
    layers: int = 6
    experts: int = 16
    top_k: int = 4
    dim: int = 512
    ff: int = 256              # expert FFN width (ignored when `size` is given: solved from it)
    vocab: int = 0             # 0: every merge the corpus yields (see max_vocab)
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    seed: int = 0
    quant: str = "q8_0"        # routed experts; everything else is F32
    size: int = 0              # bytes the file should come close to (0: use ff)
    ctx: int = 4096

    @property
    def component_bytes(self) -> int:
        values, nbytes = QUANT_TYPES[self.quant]
        return self.dim * self.ff // values * nbytes

    @property
    def expert_bytes(self) -> int:
        return 3 * self.component_bytes


# -- the tokenizer (pure) ------------------------------------------------------------------------

@lru_cache(maxsize=1)
def byte_symbols() -> tuple[str, ...]:
    """GPT-2's reversible byte -> printable symbol map (what llama.cpp's BPE vocab holds)."""
    direct = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out, n = [], 0
    for b in range(256):
        if b in direct:
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return tuple(out)


def _merge(word: tuple[str, ...], a: str, b: str) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


@lru_cache(maxsize=4)
def train_bpe(text: str = CORPUS, n_merges: int = 1 << 16) -> tuple[str, ...]:
    """Merges ("a b") learnt from `text`: the most frequent adjacent pair (ties to the larger pair)
    while some pair occurs at least twice, at most `n_merges`."""
    sym = byte_symbols()
    words = Counter(tuple(sym[b] for b in p.encode("utf-8")) for p in PRETOKENIZE.findall(text))
    merges: list[str] = []
    while len(merges) < n_merges:
        pairs: Counter = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if count < 2:
            break
        merges.append(f"{a} {b}")
        merged: Counter = Counter()
        for w, c in words.items():
            merged[_merge(w, a, b)] += c
        words = merged
    return tuple(merges)


def max_vocab() -> int:
    return 256 + len(train_bpe()) + len(SPECIAL_TOKENS)


def vocabulary(vocab: int) -> tuple[list[str], list[str]]:
    """(tokens, merges) of a vocabulary of `vocab` ids: bytes, the first merges, the control tokens."""
    merges = list(train_bpe()[:vocab - 256 - len(SPECIAL_TOKENS)])
    tokens = list(byte_symbols()) + [m.replace(" ", "") for m in merges] + list(SPECIAL_TOKENS)
    return tokens, merges


def encode(text: str, vocab: int) -> list[int]:
    """Token ids of `text` as llama.cpp's BPE tokenizer gives them for this vocabulary (no BOS:
    the model says add_bos_token false): pre-tokenize, map bytes, apply merges by rank."""
    tokens, merges = vocabulary(vocab)
    rank = {tuple(m.split(" ")): i for i, m in enumerate(merges)}
    ids = {t: i for i, t in enumerate(tokens[:len(tokens) - len(SPECIAL_TOKENS)])}
    sym = byte_symbols()
    out: list[int] = []
    for piece in PRETOKENIZE.findall(text):
        word = tuple(sym[b] for b in piece.encode("utf-8"))
        while len(word) > 1:
            best = min(zip(word, word[1:]), key=lambda p: rank.get(p, len(rank)))
            if best not in rank:
                break
            word = _merge(word, *best)
        out += [ids[w] for w in word]
    return out


def decode(ids, vocab: int) -> bytes:
    """The bytes of token ids (control tokens give none, as llama.cpp's detokenizer prints them)."""
    tokens, _ = vocabulary(vocab)
    back = {s: b for b, s in enumerate(byte_symbols())}
    n_text = len(tokens) - len(SPECIAL_TOKENS)
    return b"".join(bytes(back[c] for c in tokens[i]) for i in ids if i < n_text)


# -- the shape (pure) ----------------------------------------------------------------------------

def _resident_bytes(s: Qwen3MoeSpec, vocab: int) -> int:
    d, q, kv = s.dim, s.heads * s.head_dim, s.kv_heads * s.head_dim
    per_layer = 2 * d + 2 * d * q + 2 * d * kv + 2 * s.head_dim + d * s.experts
    return 4 * (2 * vocab * d + d + s.layers * per_layer)


def solve_ff(s: Qwen3MoeSpec, vocab: int) -> int:
    """The widest expert FFN (a multiple of 32) that keeps the file within `s.size` bytes (0: none fits)."""
    values, nbytes = QUANT_TYPES[s.quant]
    per_ff = 3 * s.layers * s.experts * s.dim * nbytes / values      # bytes per unit of expert width
    room = s.size - _resident_bytes(s, vocab) - 64 * 1024             # header, tokenizer and padding
    return max(0, int(room // per_ff) // QUANT_BLOCK * QUANT_BLOCK)


def check_spec(s: Qwen3MoeSpec) -> Qwen3MoeSpec:
    """Refuse shapes llama.cpp or this writer cannot take, with the fix in the message; returns the
    spec with `vocab` and (when `size` is given) `ff` filled in."""
    if s.quant not in QUANT_TYPES:
        raise UsageError(f"--quant {s.quant!r}: use one of {', '.join(QUANT_TYPES)}")
    for name in ("layers", "experts", "top_k", "dim", "ff", "heads", "kv_heads", "head_dim", "ctx"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"--{name.replace('_', '-')} {v!r}: must be a positive integer")
    for name in ("seed", "size", "vocab"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UsageError(f"--{name} {v!r}: must be an integer >= 0")
    if s.top_k > s.experts:
        raise UsageError(f"--top-k {s.top_k} is more than --experts {s.experts}: choose at most {s.experts}")
    if s.layers > MAX_LAYERS or s.experts > MAX_EXPERTS:
        raise UsageError(f"--layers {s.layers} --experts {s.experts}: llama.cpp takes at most {MAX_LAYERS} layers and "
                         f"{MAX_EXPERTS} experts (LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS)")
    if s.heads % s.kv_heads:
        raise UsageError(f"heads {s.heads}: must be a multiple of kv_heads {s.kv_heads} (grouped K/V heads)")
    if s.head_dim % 2:
        raise UsageError(f"head_dim {s.head_dim}: RoPE needs an even head width")
    low, high = 256 + len(SPECIAL_TOKENS) + 1, max_vocab()
    vocab = s.vocab or high
    if not low <= vocab <= high:
        raise UsageError(f"--vocab {s.vocab}: the tokenizer has {low}..{high} ids (256 bytes, the merges its text "
                         f"yields, {len(SPECIAL_TOKENS)} control tokens)")
    if s.dim % QUANT_BLOCK:
        raise UsageError(f"--dim {s.dim}: must be a multiple of {QUANT_BLOCK} (a row of quantized blocks)")
    ff = s.ff
    if s.size:
        ff = solve_ff(s, vocab)
        if ff < QUANT_BLOCK:
            floor = _resident_bytes(s, vocab) + 64 * 1024 + 3 * s.layers * s.experts * s.dim * QUANT_BLOCK
            raise UsageError(f"--size {s.size}: too small for {s.layers} layers x {s.experts} experts of width "
                             f"{s.dim}; give at least {floor} bytes, or fewer layers or experts")
    elif ff % QUANT_BLOCK:
        raise UsageError(f"--ff {ff}: must be a multiple of {QUANT_BLOCK} (a row of quantized blocks)")
    return replace(s, vocab=vocab, ff=ff)


# -- the tensors ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]        # numpy order (outermost first), float elements
    std: float                    # of the normal draw; 0: every element is `fill`
    fill: float = 0.0
    quant: Optional[str] = None   # None: F32
    zero_rows: int = 0            # output head: the last rows (the control tokens) are zero


def tensor_plan(s: Qwen3MoeSpec) -> list[_Tensor]:
    """Every tensor in file order (pure); `s` as check_spec returns it."""
    d, f, e, v, hd = s.dim, s.ff, s.experts, s.vocab, s.head_dim
    q, kv = s.heads * hd, s.kv_heads * hd
    routed = None if s.quant == "f32" else s.quant
    out = [_Tensor("token_embd.weight", (v, d), 1.0)]
    for i in range(s.layers):
        p = f"blk.{i}."
        out += [
            _Tensor(p + "attn_norm.weight", (d,), 0.0, 1.0),
            _Tensor(p + "attn_q.weight", (q, d), d ** -0.5),
            _Tensor(p + "attn_k.weight", (kv, d), d ** -0.5),
            _Tensor(p + "attn_v.weight", (kv, d), d ** -0.5),
            _Tensor(p + "attn_output.weight", (d, q), q ** -0.5),
            _Tensor(p + "attn_q_norm.weight", (hd,), 0.0, 1.0),
            _Tensor(p + "attn_k_norm.weight", (hd,), 0.0, 1.0),
            _Tensor(p + "ffn_norm.weight", (d,), 0.0, 1.0),
            # a wide router spread, so tokens pick different experts
            _Tensor(p + "ffn_gate_inp.weight", (e, d), 4 * d ** -0.5),
        ]
        for comp in COMPONENTS:
            shape = (e, d, f) if comp == "down" else (e, f, d)
            out.append(_Tensor(expert_tensor_name(i, comp), shape, shape[-1] ** -0.5, 0.0, routed))
    out += [_Tensor("output_norm.weight", (d,), 0.0, 1.0),
            _Tensor("output.weight", (v, d), d ** -0.5, zero_rows=len(SPECIAL_TOKENS))]
    return out


def _generate(t: _Tensor, seed: int, index: int) -> np.ndarray:
    from gguf import quants

    rng = np.random.default_rng([seed, index])
    if t.quant is None:
        if t.std == 0:
            return np.full(t.shape, t.fill, dtype=np.float32)
        x = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(t.std)
        if t.zero_rows:
            x[-t.zero_rows:] = 0.0
        return np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(byte_shape(t), dtype=np.uint8)
    for e in range(t.shape[0]):       # one expert at a time keeps the float draw small
        x = rng.standard_normal(t.shape[1:], dtype=np.float32) * np.float32(t.std)
        out[e] = quants.quantize(x, ggml_qtype(t.quant))
    return out


def _metadata(w, s: Qwen3MoeSpec) -> None:
    tokens, merges = vocabulary(s.vocab)
    n_text = len(tokens) - len(SPECIAL_TOKENS)
    w.add_name(f"{ARCH}-synth-L{s.layers}-E{s.experts}-k{s.top_k}-d{s.dim}-f{s.ff}-{s.quant}-seed{s.seed}")
    w.add_file_type(FILE_TYPE[s.quant])
    w.add_context_length(s.ctx)
    w.add_embedding_length(s.dim)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ff * s.top_k)
    w.add_expert_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_expert_count(s.experts)
    w.add_expert_used_count(s.top_k)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * n_text + [3] * len(SPECIAL_TOKENS))      # gguf TokenType NORMAL, CONTROL
    w.add_token_merges(merges)
    w.add_bos_token_id(n_text)                  # <|endoftext|>
    w.add_eos_token_id(n_text + 2)              # <|im_end|>
    w.add_pad_token_id(n_text)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_uint32("general.quantization_version", 2)


def synthesize_qwen3moe(path: str, spec: Qwen3MoeSpec, force: bool = False,
                        progress: Callable[[int, int], None] | None = None) -> dict:
    """Write the model to `path` (through `path.tmp-PID`, then rename); returns a summary dict.
    Anything already at `path` is refused unless `force`, which replaces a file, never a folder.
    progress(done_bytes, total_bytes) is called after each tensor."""
    spec = check_spec(spec)
    plan = tensor_plan(spec)
    path = write_gguf(path, ARCH, plan, lambda w: _metadata(w, spec), lambda t, i: _generate(t, spec.seed, i),
                      progress, force)
    return {"path": path, "format": ARCH, "bytes": os.path.getsize(path), **asdict(spec),
            "merges": len(vocabulary(spec.vocab)[1]), "tensors": len(plan),
            "component_bytes": spec.component_bytes, "expert_bytes": spec.expert_bytes,
            "routed_bytes": spec.layers * spec.experts * spec.expert_bytes}
