"""The same job on every node of a Ray cluster: verify the node's replicas against one manifest,
measure its drives, solve and export its plan, and report the fleet in one table (docs/fleet.md)."""

from core.interrupt import guard_if_started

guard_if_started("fleet.cli", "fleet")      # a Ctrl-C while the tool is still starting: one line, exit 130
