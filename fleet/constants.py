"""Format numbers and defaults of the fleet (one place; docs/fleet.md)."""

REPORT_SCHEMA = 1
REPORT_KIND = "fleet"
NODE_STATE_SCHEMA = 1
NODE_STATE_KIND = "fleet-node"
FLEET_FILE_SCHEMA = 1

# A node advertises itself to the fleet with this Ray custom resource (`ray start --resources
# '{"fleet:NAME": 1}'`); a node of the fleet file without one is matched by address or hostname.
RESOURCE_PREFIX = "fleet:"

DEFAULT_TIMEOUT_S = 3600.0      # s a node's job may take, from submission, before it is reported as hanging

# The drive measurement a node makes when no result in its rig covers its members is the chain's
# (engine_bridge/tunerig/constants.py): one shape for `engine-bridge tune-rig` and the fleet.

# What became of a node's job.
OK = "ok"                # verified, measured, solved, exported
MISMATCH = "mismatch"    # a replica differs from the manifest (or the model from its upstream digests)
MISSING = "missing"      # the node has no rig, no model, or a member's file is gone
FAILED = "failed"        # a step refused or raised (its message is the problem)
LOST = "lost"            # the node left the cluster (or its worker died) before it answered
TIMEOUT = "timeout"      # no answer within the timeout; the task was cancelled
DOWN = "down"            # no live node of the cluster matches the fleet file's entry
STATUSES = (OK, MISMATCH, MISSING, FAILED, LOST, TIMEOUT, DOWN)
