"""Format numbers and defaults of the tune-rig chain (one place; docs/tune-rig.md)."""

STATE_SCHEMA = 1
STATE_KIND = "tune-rig-state"       # rig/tune-rig.json: what each step did last, and on which inputs
RESULT_SCHEMA = 1
RESULT_KIND = "tune-rig"            # `engine-bridge tune-rig --json`

# The steps, in order. replicas: sync the drives that hold no replica yet; verify: every member
# against the manifest; measure: iobench, or the newest result while it still covers the drives;
# solve: the planner; export: the profile and its N-1 profiles; tune: the real engine's trials.
STEPS = ("replicas", "verify", "measure", "solve", "export", "tune")

# What a step does on this run.
RUN = "run"          # it does its work
REUSE = "reuse"      # what it made before still holds (its inputs are unchanged): said why
SKIP = "skip"        # nothing to do here (no drive to copy to, no engine binary given)

# A short measurement when the drives have none (iobench's demo shape, about 20 s per drive):
# these ceilings only steer this host's split.
BENCH_PRESETS = ("seq", "prefill", "decode")
BENCH_LANES = (1, 2, 4)
BENCH_SECONDS = 0.3
BENCH_REPEAT = 2

# What verify found, worst last (fleet's node statuses use the same words).
OK = "ok"
MISMATCH = "mismatch"
MISSING = "missing"
