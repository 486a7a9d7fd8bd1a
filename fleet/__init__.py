"""The same job on every node of a Ray cluster: verify the node's replicas against one manifest,
measure its drives, solve and export its plan, and report the fleet in one table (docs/fleet.md)."""
