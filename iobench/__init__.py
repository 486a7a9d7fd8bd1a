"""Per-drive ceilings: engine-shaped cold read trials, alone / grouped / together."""
