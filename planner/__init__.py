"""Performance model, solver and plan files for the engine's split (the rule itself is in engines/);
planner/tui is the split tuner."""
