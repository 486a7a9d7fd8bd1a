"""Split reader, profile export, embedded MoE engine, harness and ds4 launcher."""

from core.interrupt import guard_if_started

guard_if_started("engine_bridge.cli", "engine-bridge")      # a Ctrl-C while the tool is still starting: one line, exit 130
