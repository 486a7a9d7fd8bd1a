"""Format numbers of the engine's split and of plan files."""

BLOCK = 262_144                  # bytes: the ds4-argodrive split granule (256 KiB)
MAX_SOURCES = {"ds4-argodrive": 3}
WEIGHT_MIN, WEIGHT_MAX = 1, 100
COMPONENT_BYTES = 6_635_520      # one expert component of DeepSeek V4.1 Flash Q4 (DESIGN §7)
PREFILL_CHUNK = 32 << 20         # bytes: prefill staging chunk
PLAN_SCHEMA = 1

# Workload shapes the model and solver use (DESIGN §4, §7).
PREFILL_LANES = 8                # pieces in flight per drive while prefill stages chunks
DECODE_THREADS = 9               # the engine's expert pread pool
DECODE_BATCH = 3                 # component reads issued together: one missed expert (gate, up, down)
LAYERS = 40
EXPERT_BYTES = 3 * COMPONENT_BYTES
PREFILL_EXPERTS_PER_LAYER = 187.4   # mean union of selected experts per layer at 512 tokens
DECODE_MISSES_PER_TOKEN = 11.06     # expert misses per decoded token with a 4,600-expert cache
ENGRAM_READS_PER_TOKEN = 48         # 2 tables x 24 rows, primary only
ENGRAM_READ_BYTES = 4096            # one 264 B row costs one 4 KiB page read
TOP_ALTERNATIVES = 5
TIE_TOLERANCE = 0.001           # predicted times within 0.1 % of the best are ties: the smaller weights win
