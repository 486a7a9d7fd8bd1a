"""Per-drive ceilings: engine-shaped cold read trials, alone / grouped / together."""

from core.interrupt import guard_if_started

guard_if_started("iobench.cli", "iobench")      # a Ctrl-C while the tool is still starting: one line, exit 130
