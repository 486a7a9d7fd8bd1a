"""colibri's facts: its name, limits, file names, environment and the numbers its mirror code uses
(pure; read from colibri's sources, docs/engine-profiles.md names each one's function)."""

from __future__ import annotations

from ..switches import Switch, Switches

NAME = "colibri"

MAX_MIRRORS = 4                  # ST_MAX_MIR (c/st.h)
MAX_SOURCES = 1 + MAX_MIRRORS    # MIR_REPS (c/colibri.c)
WEIGHT_MIN, WEIGHT_MAX = 1, 100  # what our plans hold; colibri itself takes any positive number
PATH_FORBIDDEN = ";,"            # both separate COLI_MODEL_MIRROR entries (mirror_setup)
MIRROR_SEPARATOR = ";"           # written; colibri also accepts ','
MIRROR_LIST_MAX = 4095           # chars of the mirror list mirror_setup keeps (char buf[4096])
WEIGHTS_MAX = 255                # chars of COLI_DISK_WEIGHTS mirror_setup keeps (char wb[256])
SHARD_PATH_MAX = 2047            # chars of "<mirror>/<shard>" st_mirror_add can open (char mp[2048])
SHARD_SUFFIX = ".safetensors"    # the files st_scan_dir indexes and st_mirror_add mirrors
GLM_MODEL_TYPE = "glm_moe_dsa"   # config.json model_type of the GLM engine's models (c/family_registry.py)
TOKENIZER = "tokenizer.json"     # the coli launcher refuses a model directory without it (need_model)

HASH_BUCKETS = 256               # expert_route hashes into 0..255; cuts are out of 256
STRIPE_MIN = 4 << 20             # bytes: mir_pread_striped leaves smaller reads whole
ALIGN = 4096                     # bytes: O_DIRECT window and stripe chunk alignment

ENV_MODEL = "COLI_MODEL"                 # the coli launcher's --model default
ENV_SNAP = "SNAP"                        # what the engine binary itself reads (set by coli from --model)
ENV_MIRROR = "COLI_MODEL_MIRROR"
ENV_LEGACY_MIRROR = "SNAP_MIRROR"        # read only when COLI_MODEL_MIRROR is unset or empty
ENV_WEIGHTS = "COLI_DISK_WEIGHTS"
ENV_MODEL_DIRS = "COLI_MODEL_DIRS"       # a split layout (distinct shards per drive), not replicas
ENV_DIRECT = "DIRECT"                    # atoi: 1 = O_DIRECT expert reads, the only path that stripes
ENV_STRIPE = "COLI_MIR_STRIPE"           # atoi: 0 disables striping; unset means on
ENV_PROF = "PROF"                        # the docs ask PROF=1 for the MIRROR: statistics line
# Every key a colibri profile speaks for (sets, or unsets); all come from the plan.
ENV_KEYS = (ENV_MODEL, ENV_SNAP, ENV_MIRROR, ENV_WEIGHTS, ENV_LEGACY_MIRROR, ENV_MODEL_DIRS, ENV_DIRECT, ENV_STRIPE)
ARG_MODEL = "--model"                    # given by the profile through COLI_MODEL; never twice

GOLDEN = 2654435761              # the multiplier both placement hashes use
PLACEMENT_XOR = "xor"            # layer*2654435761 ^ eid*0x9E3779B9, mixed, & 255 (c/colibri.c expert_route)
PLACEMENT_FLAT = "flat"          # ((layer*experts_per_layer + eid) * 2654435761) >> 16 & 255 (deepseek_v4.c)
FALLBACKS = ("anchor", "shard", "tensor", "expert")
GLM53_WEIGHT_MAX = 1_000_000     # c/glm53.c glm53_mirror_setup: strtol value must be 1..1e6
GLM53_WEIGHTS_MAX = 511          # chars of COLI_DISK_WEIGHTS glm53_mirror_setup keeps (char wb[512])
V4_STATS_RESOLUTION = (1 << 30) // 100   # bytes: the v4_mirror line prints GiB with two decimals
DSV41_EXPERTS_PER_LAYER = 384    # c/deepseek_v41.c g_mir_epl default (n_routed of the released model)
DSV4_EXPERTS_PER_LAYER = 256     # c/deepseek_v4.c g_v4_mir_epl default (n_routed of V4 Flash)

# The switches (engines.switches): what each does to the reads is colibri_reads', to the environment
# mirror_env's, and to the log colibri_log's.
DIRECT, STRIPE = "direct", "stripe"
SWITCHES = Switches((
    Switch(DIRECT, "O_DIRECT expert reads of 4 KiB-aligned windows, past the page cache (DIRECT=1)"),
    Switch(STRIPE, "each expert read of 4 MiB or more striped over the drives holding it (COLI_MIR_STRIPE=1)",
           needs=(DIRECT,), why="the engine stripes only O_DIRECT reads"),
))

PREFILL_BLOCK = 64               # unique experts moe() resolves (and loads) per block (ESlot ws[64])
READ_THREADS = 8                 # loads in flight (assumed: PIPE_WORKERS' default)
STRIPE_LEGS = "equal"            # mir_pread_striped at 4ef9a99; 'weighted' since the weighted-stripe change

ENV_V41_STATS = "V41_STATS"              # c/deepseek_v41.c: its serve loop prints the per-turn MIRROR: line only then
ENV_USAGE_SAVE = "USAGE_SAVE"            # 0: do not write the usage history (c/telemetry.h usage_save)
USAGE_FILE = ".coli_usage"               # the usage history, in the model directory (c/colibri.c main)
HOW_WEIGHTS = ENV_WEIGHTS                # the split line's '(COLI_DISK_WEIGHTS)': the weights were taken
STATS_RESOLUTION = 10_000_000            # bytes: the MIRROR: line prints GB with two decimals
