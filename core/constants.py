"""The rig folder's layout and the environment names every stage shares (one place)."""

RIG_ENV = "REPLICA_TUNER_RIG"      # --rig fallback
DEBUG_ENV = "REPLICA_TUNER_DEBUG"  # tracebacks instead of one-line errors
DEFAULT_RIG = "rig"
RIG_SCHEMA = 1

# Files and folders inside the rig (DESIGN-level contract between the stages).
RIG_FILE = "rig.toml"              # model + replicas, hand-editable
MANIFEST_FILE = "manifest.json"    # content identity (replicas)
BENCH_DIR = "bench"                # iobench results, <UTC>.json
PLANS_DIR = "plans"                # planner output, <UTC>.json
PROFILES_DIR = "profiles"          # exported engine profiles (.env, .json) and the user's named profiles (.toml)
RUNS_DIR = "runs"                  # harness and launcher runs, one folder each
STAMPS_DIR = "stamps"              # sidecar stamps for files we may not or cannot tag
RESULTS_FILE = "results.json"      # a harness run's results, in runs/<stamp>/
VERDICTS_FILE = "verdicts.json"    # replicas verify's last verdict per member (status remembers it)
SCRUB_FILE = "scrub.json"          # how far an interrupted `replicas verify --full` got, per member
