"""Format numbers of the engine's split and of plan files."""

BLOCK = 262_144                  # bytes: the ds4-argodrive split granule (256 KiB)
MAX_SOURCES = {"ds4-argodrive": 3}
WEIGHT_MIN, WEIGHT_MAX = 1, 100
COMPONENT_BYTES = 6_635_520      # one expert component of DeepSeek V4.1 Flash Q4 (DESIGN §7)
PREFILL_CHUNK = 32 << 20         # bytes: prefill staging chunk
PLAN_SCHEMA = 1
