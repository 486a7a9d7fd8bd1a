"""Split arithmetic, performance model, solver and plan files; planner/tui is the split tuner."""
