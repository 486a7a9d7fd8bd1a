"""The rig folder's layout, the environment names and the cold-I/O numbers every stage shares (one place)."""

MiB = 1 << 20
GiB = 1 << 30

RIG_ENV = "REPLICA_TUNER_RIG"      # --rig fallback
DEBUG_ENV = "REPLICA_TUNER_DEBUG"  # tracebacks instead of one-line errors
DEFAULT_RIG = "rig"
RIG_SCHEMA = 1

# Files and folders inside the rig (the contract between the stages: docs/architecture.md).
RIG_FILE = "rig.toml"              # model + replicas, hand-editable
MANIFEST_FILE = "manifest.json"    # content identity (replicas)
BENCH_DIR = "bench"                # iobench results, <UTC>.json
PLANS_DIR = "plans"                # planner output, <UTC>.json
PROFILES_DIR = "profiles"          # exported engine profiles (.env, .json) and the user's named profiles (.toml)
RUNS_DIR = "runs"                  # harness and launcher runs, one folder each
USAGE_DIR = "usage"                # expert usage history (per-expert misses of each run or replay), <UTC>.json
STAMPS_DIR = "stamps"              # sidecar stamps for files we may not or cannot tag
RESULTS_FILE = "results.json"      # a harness run's results, in runs/<stamp>/
VERDICTS_FILE = "verdicts.json"    # replicas verify's last verdict per member (status remembers it)
SCRUB_FILE = "scrub.json"          # how far an interrupted `replicas verify --full` got, per member
FLEET_DIR = "fleet"                # the asker's fleet reports, <UTC>.json + <UTC>.txt (docs/fleet.md)
TUNE_RIG_FILE = "tune-rig.json"      # what `engine-bridge tune-rig` (and a fleet node) did last, step by step, for reruns
FLEET_NODE_FILE = "fleet-node.json"  # on each node's rig: its last fleet job, for reruns that redo only what changed
UPSTREAM_FILE = "upstream.json"    # the model's published digests (SHA-256 per file), `replicas upstream`
RIG_LOCK = ".lock"                 # flock'ed around each read-modify-write of rig.toml and its records

# Cold I/O.
ALIGNMENT = 4096               # O_DIRECT offset/length/buffer alignment on Linux, bytes
IO_BLOCK = 16 * MiB            # bytes per sequential read/write request (throttled and real drives both want several
                               # MiB in flight)
MAPPED_BLOCK = 128 * MiB       # bytes per view of a file in RAM (a map: no request to size, and fewer, larger hash
                               # updates keep both cores busy longer: bench/hash_bench.py)
HUGE_PAGE = 2 * MiB            # bytes: a transparent huge page (x86-64 and arm64 with 4 KiB pages)
HUGE_BUFFER_MIN = 256 * 1024   # buffers from this size on ask for huge pages (at most one HUGE_PAGE - 4 KiB unused)
READ_AHEAD = 3                 # sequential read requests in flight per drive


# Stamps.
XATTR_LINUX = "user.replica_tuner.stamp"
XATTR_DARWIN = "com.replica-tuner.stamp"
