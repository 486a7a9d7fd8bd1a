"""Performance model, solver and plan files for the engine's split (the rule itself is in engines/);
planner/tui is the split tuner."""

from core.interrupt import guard_if_started

guard_if_started("planner.cli", "planner")      # a Ctrl-C while the tool is still starting: one line, exit 130
