"""Format numbers of the models floor: the expert-cache policy's clock (docs/engine.md, the cache)."""

HOTNESS_HALVING_TOKENS = 32        # selection counts halve every this many tokens (the engines' hotness clock)
