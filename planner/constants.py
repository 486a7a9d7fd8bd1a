"""Format numbers of plan files, the named workload `ds4-v41`, and the routing simulation's settings.

The engines' own numbers (split granule, source limit, weight range, read shapes) live in
`engines/`. A model's workload is derived from its geometry and the routing model
(`planner.workload`); the numbers below are the one model the field measured, DeepSeek V4.1
Flash Q4 on ds4 (docs/planner.md), kept as the named workload `ds4-v41`: what the planner assumes when
asked to plan that model from its header alone, and the calibration the routing model is held to.
"""

from models.constants import V41_COMPONENT_BYTES

PLAN_SCHEMA = 3                     # 2: the geometry and workload it was solved for; 3: its switches as one list
PLAN_SCHEMAS = (1, 2, 3)            # what loads (schema 1 plans have no geometry or workload; 1 and 2 a key per switch)

# The named workload ds4-v41 (docs/planner.md).
V41_NAME = "ds4-v41"
LAYERS = 40                         # layers with routed experts
V41_EXPERTS = 384                   # routed experts per layer
V41_TOP_K = 6                       # experts chosen per token
EXPERT_BYTES = 3 * V41_COMPONENT_BYTES  # gate + up + down, 19,906,560 B
PREFILL_TOKENS = 512                # the prompt the prefill figure is for
PREFILL_EXPERTS_PER_LAYER = 187.4   # mean union of selected experts per layer at 512 tokens
V41_CACHE_EXPERTS = 4600                # the largest cache that fit a 128 GB machine
DECODE_MISSES_PER_TOKEN = 11.06     # expert misses per decoded token with a 4,600-expert cache
ENGRAM_READS_PER_TOKEN = 48         # 2 tables x 24 rows, primary only
ENGRAM_READ_BYTES = 4096            # one 264 B row costs one 4 KiB page read

# Any other model: the cache holds this fraction of its routed experts unless told (ds4-v41's
# 4,600 of 15,360), and the routing model is simulated like its calibration (docs/planner.md protocol):
# prefill in chunks of ROUTING_CHUNK_TOKENS, then WARM decode tokens, misses averaged over MEASURE.
CACHE_FRACTION = V41_CACHE_EXPERTS / (LAYERS * V41_EXPERTS)
ROUTING_CHUNK_TOKENS = 512
ROUTING_WARM_TOKENS = 32
ROUTING_MEASURE_TOKENS = 168
ROUTING_SEED = 2                    # the seed the decode calibration was measured with (models/routing.py)
# How close the simulation must come to the field on V4.1's geometry (tests/planner/test_workload.py).
PREFILL_TOLERANCE = 0.03            # coverage, absolute (11.5 of 384 experts)
MISSES_TOLERANCE = 0.15             # relative

TOP_ALTERNATIVES = 5
TIE_TOLERANCE = 0.001           # predicted times within 0.1 % of the best are ties: the smaller weights win
NO_READS = 1e-9                 # a phase whose fastest is under this share of the run's reads (next to) nothing
IDLE_TOLERANCE = 0.01           # a split using every drive within 1 % of the fastest wins over one leaving a drive idle
TAIL_LANES = 3                  # the decode preset's lane count whose latency quantiles shape a drive's tail (--tails)
