"""Format numbers for the rig, the manifest and cold I/O (one place, DESIGN §3)."""

MiB = 1 << 20
GiB = 1 << 30

# Content identity.
PIECE_SIZE = 64 * MiB          # bytes per manifest piece (default)
MANIFEST_SCHEMA = 2            # 2: a model of one or more files; 1 (one file) still loads
MANIFEST_SCHEMAS = (1, 2)
STAMP_SCHEMA = 1
JOURNAL_SCHEMA = 1

# Cold I/O.
ALIGNMENT = 4096               # O_DIRECT offset/length/buffer alignment on Linux, bytes
IO_BLOCK = 16 * MiB            # bytes per sequential read/write request (throttled and real drives both want several MiB in flight)
HUGE_PAGE = 2 * MiB            # bytes: a transparent huge page (x86-64 and arm64 with 4 KiB pages)
HUGE_BUFFER_MIN = 256 * 1024   # buffers from this size on ask for huge pages (at most one HUGE_PAGE - 4 KiB unused)
READ_AHEAD = 3                 # sequential read requests in flight per drive
WRITE_DEPTH = 4                # block writes in flight per destination

# Stamps.
XATTR_LINUX = "user.replica_tuner.stamp"
XATTR_DARWIN = "com.replica-tuner.stamp"

# Sync.
PARTIAL_SUFFIX = ".partial"
JOURNAL_SUFFIX = ".partial.journal"
HEADROOM_MIN = 16 * MiB        # free space kept beyond the file, bytes
HEADROOM_MAX = 1 * GiB
HEADROOM_FRACTION = 0.01

# The rig's records of verification (rig/verdicts.json, rig/scrub.json).
VERDICTS_SCHEMA = 1
SCRUB_SCHEMA = 1

SCRUB_SAVE_S = 5.0             # seconds between saves of verify --full's progress (a kill -9 loses at most this)

# Pacing (--max-rate).
BURST_S = 0.25                 # seconds of traffic a paced drive may move at once after idling
