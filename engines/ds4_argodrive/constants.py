"""ds4-argodrive's facts: its name, limits, read shapes, environment and arguments (pure).

Read from the engine's expert reader and profile handling (docs/engine-profiles.md).
"""

from __future__ import annotations

from models.constants import V41_COMPONENT_BYTES

NAME = "ds4-argodrive"

BLOCK_BYTES = 262_144                  # bytes: the split granule (256 KiB)
MAX_SOURCES = 3                  # primary + at most 2 replicas
WEIGHT_MIN, WEIGHT_MAX = 1, 100
PATH_FORBIDDEN = ",*"            # DS4_ARGODRIVE_REPLICAS is "path*weight,path*weight"

# The read shapes the engine issues (docs/iobench.md, docs/planner.md).
PREFILL_CHUNK = 32 << 20         # bytes: one prefill staging chunk
PREFILL_LANES = 8                # chunks in flight per drive while prefill stages (DS4_ARGODRIVE_PREFILL_LANES default)
DECODE_THREADS = 9               # the expert pread pool (DS4_METAL_STREAMING_EXPERT_PREAD_THREADS)
DECODE_BATCH = 3                 # component reads issued together: one missed expert (gate, up, down)
# One expert component of DeepSeek V4.1 Flash Q4, the engine's model: the decode read size used
# only when no model header is at hand to ask.
COMPONENT_BYTES = V41_COMPONENT_BYTES

# ---------------------------------------------------------------------------------------------
# Environment and arguments (docs/engine-profiles.md)

ENV_PREFIX = "DS4_"              # every variable the engine reads starts so
ENV_PRIMARY_WEIGHT = "DS4_ARGODRIVE_PRIMARY_WEIGHT"     # base weight of source 0
ENV_REPLICAS = "DS4_ARGODRIVE_REPLICAS"                 # "path*weight,path*weight": replicas, base weights
ENV_DECODE_WEIGHTS = "DS4_ARGODRIVE_DECODE_WEIGHTS"     # "w0,w1,w2": one per source, decode phase only
SPLIT_KEYS = (ENV_PRIMARY_WEIGHT, ENV_REPLICAS, ENV_DECODE_WEIGHTS)

ENV_PREFILL_SPLIT = "DS4_ARGODRIVE_PREFILL_SPLIT"
ENV_PREFILL_LANES = "DS4_ARGODRIVE_PREFILL_LANES"
ENV_PREAD_THREADS = "DS4_METAL_STREAMING_EXPERT_PREAD_THREADS"
# On/off switches the engine tests by presence: setting one to 0 still turns it on, so a
# profile that does not want a switch must unset it.
PRESENCE_FLAGS = (
    ENV_PREFILL_SPLIT, "DS4_ARGODRIVE_PREFILL_SELECTIVE", "DS4_ARGODRIVE_PREFILL_AHEAD",
    "DS4_ARGODRIVE_FLAG_READBACK", "DS4_ARGODRIVE_BF16_EPILOGUES", "DS4_ARGODRIVE_PSO_CACHE",
)
VALUE_KEYS = (ENV_PREFILL_LANES, ENV_PREAD_THREADS)     # read as numbers
KNOWN_KEYS = PRESENCE_FLAGS + VALUE_KEYS                # the engine's knobs besides the split
# The cache report carries the expert-cache budget line only when this is set.
ENV_TIMING_SUMMARY = "DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY"

ARG_STREAMING = "--ssd-streaming"
ARG_MODEL, ARG_MODEL_LONG = "-m", "--model"
ARG_CACHE_EXPERTS = "--ssd-streaming-cache-experts"    # the expert-cache size is an argument, not a variable
PROFILE_ARGS = frozenset({ARG_MODEL, ARG_MODEL_LONG, ARG_CACHE_EXPERTS})   # given by a profile, never twice
