"""Format numbers of the embedded engine: the synthetic model's layout, the cache, result schemas.

Tensor names follow llama.cpp's MoE naming (docs/planner.md, docs/engine.md), so the engine's reads have the real
model's shape: routed experts live in `blk.N.ffn_{gate,up,down}_exps.weight`, expert-major.
"""

ARCH = "replica-moe"                     # general.architecture of models written by `synth`
ALIGNMENT = 4096                         # bytes: file alignment and expert component granule
QUANT_BLOCK = 32                         # values per Q8_0 / Q4_0 block; dims are multiples of it
# Routed expert types synth writes: (values, bytes) per block. f32 is not quantized: it costs no
# dequantize and a quarter of the multiply per byte read, for storage-bound runs on slow CPUs.
QUANT_TYPES = {"q8_0": (32, 34), "q4_0": (32, 18), "f32": (1, 4)}
SHARED_FF_DIVISOR = 4                    # the shared expert is ff / 4 wide (resident compute kept small)

COMPONENTS = ("gate", "up", "down")      # the three tensors of one routed expert


def expert_tensor_name(layer: int, component: str) -> str:
    return f"blk.{layer}.ffn_{component}_exps.weight"


# Resident (read normally at load, kept in RAM) tensors of one layer, in file order.
LAYER_RESIDENT = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                  "ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
# A qwen3moe layer's (llama.cpp src/models/qwen3moe.cpp `load_arch_tensors`): no shared expert.
QWEN3MOE_ARCH = "qwen3moe"
QWEN3MOE_RESIDENT = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                     "ffn_norm", "ffn_gate_inp")

# colibri's GLM engine (c/colibri.c): the model_type its launcher sends to it, the suffix of a
# pre-quantised weight's per-row F32 scales (`NAME.qs`), and colibri's name for int8 rows (fmt=1).
COLIBRI_MODEL_TYPE = "glm_moe_dsa"
# `synth --format`: a GGUF file, the directory colibri's GLM engine loads, a qwen3moe GGUF llama.cpp runs
SYNTH_FORMATS = ("gguf", "colibri", "qwen3moe")
GGUF_FORMAT, COLIBRI_FORMAT, QWEN3MOE_FORMAT = SYNTH_FORMATS
COLIBRI_SCALE_SUFFIX = ".qs"
ROW_INT8 = "int8-row"

# Synth defaults: small, but each component (557,056 B = 2 split blocks + 32 KiB) still splits.
SYNTH_DEFAULTS = dict(layers=4, experts=16, top_k=2, dim=512, ff=1024, vocab=512, seed=0, quant="q8_0")
ATTN_DIM = 64                            # width of the single attention head (resident, cheap)
RMS_EPS = 1e-6

# Metadata keys written by synth (prefixed with ARCH + ".").
KV_LAYERS = "block_count"
KV_EXPERTS = "expert_count"
KV_TOP_K = "expert_used_count"
KV_DIM = "embedding_length"
KV_FF = "expert_feed_forward_length"
KV_VOCAB = "vocab_size"
KV_ATTN = "attention.key_length"
KV_SEED = "synth.seed"


# Run defaults (docs/engine-profiles.md, docs/harness.md).
PROMPT_TOKENS = 512
GEN_TOKENS = 200
PREFILL_CHUNK_TOKENS = 512               # tokens routed together per prefill chunk
DEFAULT_CACHE_EXPERTS = 64
LANES = 8
PRIMARY_WEIGHT = 10
PROMPT_SEED = 1234
DEQUANT_THREADS = 2                      # helper threads dequantizing experts ahead of the multiply
STAGE_WINDOW = 256 << 20                 # bytes of expert reads submitted ahead of the one being computed

CSV_COLUMNS = ("ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens", "gen_tps",
               "gen_first_ms", "gen_steady_tokens", "gen_steady_tps", "kvcache_bytes")
RUN_SCHEMA = 1
REPLAY_SCHEMA = 1
TRACE_SCHEMA = 1
