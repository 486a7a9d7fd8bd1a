"""Format numbers for the rig, the manifest and cold I/O (one place, docs/replicas.md)."""

from core.constants import GiB, MiB

# Content identity.
PIECE_SIZE = 64 * MiB          # bytes per manifest piece (default)
MANIFEST_SCHEMA = 2            # 2: a model of one or more files; 1 (one file) still loads
MANIFEST_SCHEMAS = (1, 2)
STAMP_SCHEMA = 1
JOURNAL_SCHEMA = 1

# Sync's writes (cold reads' numbers are core.constants').
WRITE_DEPTH = 4                # block writes in flight per destination

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
