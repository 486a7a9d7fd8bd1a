"""The embedded MoE engine: a numpy forward pass whose routed experts arrive only through reads.

Per layer: RMSNorm, one causal attention head (resident, with a KV cache), RMSNorm, router
(top-k of softmaxed logits), a resident shared expert and the routed experts (SwiGLU). A qwen3moe
model (`resident.Attention`) has llama.cpp's qwen3moe layer instead: grouped-query attention with
per-head q/k RMSNorm and NeoX RoPE, and no shared expert; its router is the same (qwen3moe's
softmax over all experts, top-k, weights renormalised to sum 1 is the softmax of the top-k logits). Prefill
routes a chunk of tokens, computes the experts already cached, then stages the union of the
selected experts that miss the cache with the target engine's reads (ds4-argodrive coalesces
contiguous experts of one tensor into reads of up to 32 MiB; colibri reads each expert whole from
the drive its placement picks) and computes each as it arrives. Decode does the same for one token.

Determinism: everything is float32 numpy with a fixed order. An expert's output for its tokens
depends only on its (dequantized) bytes and its input rows, never on whether it came from the
cache or a read, and the top-k contributions are summed in slot order after all experts of a
layer are computed, so the output token ids are the same for every cache size, source count,
weight and lane count: they change only if a read delivers wrong bytes.

Reads go through `staging.stage_reads`: the target engine's read pattern for the step (`reads_of`,
a `staging.StepReads`) executed through the `submit_read(read, phase) -> ticket` it is given (the
split reader's `submit_read`; an expert's bytes are Extents in the model's files), so
an expert is computed while the reads of the next ones are in flight; this module opens no file.
`run.run_model` is the I/O around it.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from models.cache import ExpertCache
from .constants import (
    DEQUANT_THREADS,
    PREFILL_CHUNK_TOKENS,
    QUANT_BLOCK,
    RMS_EPS,
    ROW_INT8,
    STAGE_WINDOW,
)
from .resident import Attention, Geometry, Resident
from .staging import PhaseCounters, SubmitRead, stage_reads
from .threadtimes import ENGINE_HELPERS, sample

_Q8 = np.dtype([("d", "<f2"), ("q", "i1", (QUANT_BLOCK,))])
_Q4 = np.dtype([("d", "<f2"), ("q", "u1", (QUANT_BLOCK // 2,))])


def dequantize(buf, qtype: str, rows: int, cols: int, scales: np.ndarray | None = None) -> np.ndarray:
    """Q8_0 / Q4_0 / F32 bytes -> float32 (rows, cols); equal to gguf.quants.dequantize, but one pass.
    ROW_INT8 (colibri's int8 rows): int8 bytes times `scales`, one F32 per row."""
    if qtype == ROW_INT8:
        return np.frombuffer(buf, dtype=np.int8, count=rows * cols).reshape(rows, cols) * scales[:, None]
    if qtype == "Q8_0":
        a = np.frombuffer(buf, dtype=_Q8, count=rows * cols // QUANT_BLOCK)
        out = np.empty((a.shape[0], QUANT_BLOCK), dtype=np.float32)
        np.multiply(a["q"], a["d"].astype(np.float32)[:, None], out=out, dtype=np.float32, casting="unsafe")
        return out.reshape(rows, cols)
    if qtype == "Q4_0":
        a = np.frombuffer(buf, dtype=_Q4, count=rows * cols // QUANT_BLOCK)
        q = a["q"]
        out = np.empty((a.shape[0], QUANT_BLOCK), dtype=np.float32)
        half = QUANT_BLOCK // 2
        d = a["d"].astype(np.float32)[:, None]
        np.multiply((q & 0x0F).astype(np.int8) - 8, d, out=out[:, :half], dtype=np.float32, casting="unsafe")
        np.multiply((q >> 4).astype(np.int8) - 8, d, out=out[:, half:], dtype=np.float32, casting="unsafe")
        return out.reshape(rows, cols)
    if qtype == "F32":     # copied, so a cached expert does not pin its whole staging read
        return np.frombuffer(buf, dtype=np.float32, count=rows * cols).reshape(rows, cols).copy()
    raise ValueError(f"unsupported expert type {qtype}")


@dataclass(frozen=True)
class ExpertWeights:
    gate: np.ndarray   # (ff, dim)
    up: np.ndarray     # (ff, dim)
    down: np.ndarray   # (dim, ff)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):       # exp(-x) -> inf for very negative x gives silu -> -0, as it should
        return x / (np.float32(1.0) + np.exp(-x))


def swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float = RMS_EPS) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * w


def rope_neox(x: np.ndarray, pos: int, base: float, dims: int) -> np.ndarray:
    """NeoX rotary embedding of x (tokens, heads, head_dim) at positions pos..: element i is
    rotated with element i + dims/2 by angle p * base^(-2i/dims) (ggml's rope, GGML_ROPE_TYPE_NEOX)."""
    half = dims // 2
    p = np.arange(pos, pos + x.shape[0], dtype=np.float64)[:, None]
    theta = p * np.power(float(base), -2.0 * np.arange(half, dtype=np.float64) / dims)[None, :]
    cos, sin = np.cos(theta).astype(np.float32)[:, None, :], np.sin(theta).astype(np.float32)[:, None, :]
    a, b = x[..., :half], x[..., half:dims]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, x[..., dims:]], axis=-1)


def attend_gqa(h: np.ndarray, L: dict, at: Attention, eps: float, pos: int, kc: np.ndarray, vc: np.ndarray,
               mask: np.ndarray) -> np.ndarray:
    """qwen3moe's attention (llama.cpp src/models/qwen3moe.cpp): q, k, v projections, q and k
    RMSNormed per head, NeoX RoPE, causal softmax(q k^T / sqrt(head_dim)) v with each K/V head
    shared by heads/kv_heads query heads, then the output projection. Fills the KV cache
    (ctx, kv_heads, head_dim) at positions pos..; returns the attention output (tokens, dim)."""
    n, H, KV, d = h.shape[0], at.heads, at.kv_heads, at.head_dim
    q = rmsnorm((h @ L["attn_q"].T).reshape(n, H, d), L["attn_q_norm"], eps)
    k = rmsnorm((h @ L["attn_k"].T).reshape(n, KV, d), L["attn_k_norm"], eps)
    kc[pos:pos + n] = rope_neox(k, pos, at.rope_base, at.rope_dims)
    vc[pos:pos + n] = (h @ L["attn_v"].T).reshape(n, KV, d)
    q = rope_neox(q, pos, at.rope_base, at.rope_dims)
    g = H // KV
    qg = q.reshape(n, KV, g, d).transpose(1, 2, 0, 3)                  # (KV, g, n, d)
    keys = kc[:pos + n].transpose(1, 2, 0)[:, None]                     # (KV, 1, d, T)
    vals = vc[:pos + n].transpose(1, 0, 2)[:, None]                     # (KV, 1, T, d)
    att = softmax((qg @ keys) * np.float32(1.0 / np.sqrt(d)) + mask)
    out = (att @ vals).transpose(2, 0, 1, 3).reshape(n, H * d)
    return out @ L["attn_output"].T


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def route(h: np.ndarray, router: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(selected expert ids (T, k), their weights (T, k)): top-k logits, ties to the lower id."""
    logits = h @ router.T
    sel = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    w = softmax(np.take_along_axis(logits, sel, axis=1))
    return sel, w.astype(np.float32)


def prompt_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int64)


def tokens_sha256(ids: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).hexdigest()


@dataclass
class RunOutcome:
    prompt: int
    tokens: list[int]                     # generated ids: one from the prefill logits, then one per decode step
    prefill: PhaseCounters
    decode: PhaseCounters
    step_seconds: list[float] = field(default_factory=list)   # wall time of each decode step
    kvcache_bytes: int = 0
    trace: list | None = None             # routing per step if recorded: [phase, [[layer selections...]...]]


class EmbeddedEngine:
    def __init__(self, geometry: Geometry, resident: Resident, submit_read: SubmitRead, reads_of, cache: ExpertCache,
                 chunk_tokens: int = PREFILL_CHUNK_TOKENS, window: int = STAGE_WINDOW, record_trace: bool = False,
                 dequant_threads: int = DEQUANT_THREADS, in_flight: dict | None = None):
        self.g, self.r, self.submit_read, self.reads_of, self.cache = geometry, resident, submit_read, reads_of, cache
        self.in_flight = in_flight or {}
        self.dequant_threads = max(0, dequant_threads)
        self._pool = ThreadPoolExecutor(self.dequant_threads, thread_name_prefix=ENGINE_HELPERS) if self.dequant_threads else None
        self.chunk_tokens = max(1, chunk_tokens)
        self.window = window
        self.trace: list | None = [] if record_trace else None

    # -- experts -----------------------------------------------------------------------------

    def _weights(self, layer: int, e: int, bufs) -> ExpertWeights:
        d, f, q = self.r.dim, self.r.ff, self.r.qtype
        s = self.r.row_scales[layer][e] if self.r.row_scales is not None else (None, None, None)
        return ExpertWeights(dequantize(bufs[0], q, f, d, s[0]), dequantize(bufs[1], q, f, d, s[1]),
                             dequantize(bufs[2], q, d, f, s[2]))

    def _dequant(self, layer: int, e: int, bufs):
        if self._pool is None:
            return self._weights(layer, e, bufs)
        return self._pool.submit(self._weights, layer, e, bufs)

    def _use(self, item, base: int, compute) -> None:
        e, ew, release = item
        if not isinstance(ew, ExpertWeights):
            ew = ew.result()
        release()                        # dequantized: its reads' buffers may go back
        compute(e, ew)
        self.cache.admit(base + e, ew)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _moe(self, layer: int, h: np.ndarray, phase: str, counters: PhaseCounters) -> np.ndarray:
        L = self.r.layers[layer]
        sel, w = route(h, L["ffn_gate_inp"], self.g.top_k)
        if self.trace is not None:
            self.trace[-1][1].append(sel.tolist())
        base = layer * self.g.experts
        union, counts = np.unique(sel, return_counts=True)
        self.cache.select(union + base, counts)
        contrib = np.zeros(sel.shape + (h.shape[1],), dtype=np.float32)

        def compute(e: int, ew: ExpertWeights):
            t_idx, k_idx = np.nonzero(sel == e)
            contrib[t_idx, k_idx] = swiglu(h[t_idx], ew.gate, ew.up, ew.down)

        missing = []
        for e in union.tolist():
            hit, ew = self.cache.lookup(base + e)
            if hit:
                counters.hits += 1
                compute(e, ew)
            else:
                missing.append(e)
        counters.misses += len(missing)
        # Dequantize on the helper threads while this thread multiplies the previous expert (numpy
        # releases the GIL in both); results are used in id order, so the arithmetic is unchanged.
        ahead: deque = deque()
        for e, bufs, release in stage_reads(self.submit_read, self.reads_of, self.g, layer, missing, phase, counters,
                                            self.window, self.in_flight.get(phase)):
            ahead.append((e, self._dequant(layer, e, bufs), release))
            while len(ahead) > self.dequant_threads:
                self._use(ahead.popleft(), base, compute)
        while ahead:
            self._use(ahead.popleft(), base, compute)
        if "ffn_gate_shexp" in L:
            out = swiglu(h, L["ffn_gate_shexp"], L["ffn_up_shexp"], L["ffn_down_shexp"])
        else:                                                # qwen3moe: routed experts only
            out = np.zeros_like(h)
        for k in range(sel.shape[1]):                        # fixed summation order: slot 0, 1, ...
            out += w[:, k, None] * contrib[:, k]
        return out

    # -- the model ---------------------------------------------------------------------------

    def _forward(self, ids: np.ndarray, pos: int, kv: list, phase: str, counters: PhaseCounters) -> np.ndarray:
        """Hidden states of `ids` at positions pos.. (KV cache filled); returns the last row's logits."""
        r = self.r
        if self.trace is not None:
            self.trace.append([phase, []])
        x = r.embed[ids]
        n = len(ids)
        scale = np.float32(1.0 / np.sqrt(r.attn))
        mask = np.triu(np.full((n, pos + n), -np.inf, dtype=np.float32), k=pos + 1)
        for i, L in enumerate(r.layers):
            h = rmsnorm(x, L["attn_norm"], r.eps)
            kc, vc = kv[i]
            if r.attention is not None:
                x = x + attend_gqa(h, L, r.attention, r.eps, pos, kc, vc, mask)
            else:
                kc[pos:pos + n] = h @ L["attn_k"].T
                vc[pos:pos + n] = h @ L["attn_v"].T
                q = h @ L["attn_q"].T
                att = softmax((q @ kc[:pos + n].T) * scale + mask)
                x = x + (att @ vc[:pos + n]) @ L["attn_output"].T
            x = x + self._moe(i, rmsnorm(x, L["ffn_norm"], r.eps), phase, counters)
        self.cache.advance(n)
        last = rmsnorm(x[-1:], r.output_norm, r.eps)
        return (last @ r.output.T)[0]

    def run(self, prompt: np.ndarray, gen_tokens: int) -> RunOutcome:
        r = self.r
        ctx = len(prompt) + gen_tokens
        width = (ctx, r.attn) if r.attention is None else (ctx, r.attention.kv_heads, r.attention.head_dim)
        kv = [(np.zeros(width, np.float32), np.zeros(width, np.float32)) for _ in r.layers]
        pre, dec = PhaseCounters(), PhaseCounters()
        pre.started_ns = time.monotonic_ns()
        at = sample()
        t0 = time.perf_counter()
        logits = None
        for s in range(0, len(prompt), self.chunk_tokens):
            logits = self._forward(prompt[s:s + self.chunk_tokens], s, kv, "prefill", pre)
        pre.seconds = time.perf_counter() - t0
        mid = sample()
        pre.timed(at, mid)
        tokens = [int(np.argmax(logits))]
        steps = []
        pos = len(prompt)
        dec.started_ns = time.monotonic_ns()
        t1 = time.perf_counter()
        for _ in range(gen_tokens):
            ts = time.perf_counter()
            logits = self._forward(np.array([tokens[-1]]), pos, kv, "decode", dec)
            tokens.append(int(np.argmax(logits)))
            pos += 1
            steps.append(time.perf_counter() - ts)
        dec.seconds = time.perf_counter() - t1
        dec.timed(mid, sample())
        return RunOutcome(prompt=len(prompt), tokens=tokens, prefill=pre, decode=dec, step_seconds=steps,
                          kvcache_bytes=len(r.layers) * ctx * 2 * r.attn * 4, trace=self.trace)
