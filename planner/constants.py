"""Format numbers of plan files and the workload facts the model and solver use.

The engine's own numbers (split granule, source limit, weight range, read shapes) live in
`engines.ds4_argodrive`; the workload below is DeepSeek V4.1 Flash's (DESIGN §7).
"""

from engines.ds4_argodrive import COMPONENT_BYTES

PLAN_SCHEMA = 1

LAYERS = 40
EXPERT_BYTES = 3 * COMPONENT_BYTES
PREFILL_EXPERTS_PER_LAYER = 187.4   # mean union of selected experts per layer at 512 tokens
DECODE_MISSES_PER_TOKEN = 11.06     # expert misses per decoded token with a 4,600-expert cache
ENGRAM_READS_PER_TOKEN = 48         # 2 tables x 24 rows, primary only
ENGRAM_READ_BYTES = 4096            # one 264 B row costs one 4 KiB page read
TOP_ALTERNATIVES = 5
TIE_TOLERANCE = 0.001           # predicted times within 0.1 % of the best are ties: the smaller weights win
