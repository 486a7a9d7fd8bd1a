"""Format numbers of iobench: presets, result schema, the plausibility limits (one place)."""

MiB = 1 << 20

RESULT_SCHEMA = 2               # 2: queue limits per drive, restarted trials per lane count
READ_RESULT_SCHEMAS = (1, 2)    # what `load_result` accepts (schema 1: no queue, one trial each)
RESULT_KIND = "iobench"

# Order of `--preset all`: seq first (its ceilings set the default split weights), rand4k last
# (small random reads: the drive model's per-request latency and IOPS ceiling).
PRESETS = ("seq", "prefill", "decode", "rand4k")
SEQ_PIECE = 1 * MiB             # bytes per seq request (SEQ1M)
RAND_PIECE = 4096               # bytes per rand4k request (RND4K)
SEQ_LANES = (8,)                # seq: 8 in flight (SEQ1M Q8)
PREFILL_LANES = (1, 2, 4, 8, 16)
DECODE_LANES = (1, 2, 3, 4)
RAND_LANES = (1, 16)
DEFAULT_LANES = {"seq": SEQ_LANES, "prefill": PREFILL_LANES, "decode": DECODE_LANES, "rand4k": RAND_LANES}
# Lanes per drive for grouped / together runs when no alone result says otherwise: the engine's
# prefill staging default (8 per drive) and its decode pool (~9 threads over 3 drives).
TOGETHER_LANES = {"seq": 8, "prefill": 8, "decode": 3, "rand4k": 16}

DEFAULT_SECONDS = 0.5           # s per measured window (a trial is `repeat` windows)
DEFAULT_REPEAT = 3              # windows per trial; the spread is taken over them
# Restarted trials per lane count (fresh lanes, fresh offsets, the median trial counts): decode's
# few, small, random reads per window vary from one trial to the next; bulk presets do not.
DEFAULT_RESTARTS = {"seq": 1, "prefill": 1, "decode": 3, "rand4k": 1}
MAX_RESTARTS = 20
# A lane count (or a together run) whose first two trials agree within this many % is not
# restarted again: a third trial could only confirm them, and the median of two is their mean.
RESTART_AGREE_PCT = 1.0

KNEE_FRACTION = 0.95            # knee: lowest lane count within 5 % of the best
SPREAD_WARN_PCT = 5.0           # spread over repeats worth a repeat (docs/iobench.md)
# No single drive delivers more than this (PCIe 5.0 x4 is ~15.8 GB/s raw): faster means the
# page cache answered.
PLAUSIBLE_BW = 16e9             # bytes/s
PLAUSIBLE_MIN_LAT_NS = 5_000    # no cold read from a drive lands in under 5 us (median)
RESIDENT_WARN = 0.05            # macOS F_NOCACHE: >5 % of the file already cached taints a run

DRIVE_IO_UNIT = 1 * MiB         # bytes per device request, when neither the queue nor the fit says

SCRATCH_FOLDER = "scratch"      # rig/bench/scratch: results of drives measured on a scratch file (no replica yet)
SCRATCH_SIZE = 1 << 30          # bytes of scratch file by default: every preset's deepest lanes fit many times
