"""Format numbers of the models floor: the expert-cache policy's clock (docs/engine.md, the cache),
and the one fact about the field's model that both its engine and the planner's named workload use."""

HOTNESS_HALVING_TOKENS = 32        # selection counts halve every this many tokens (the engines' hotness clock)

# DeepSeek V4.1 Flash Q4 (the 518 GB GGUF the field measured, docs/planner.md): one routed expert's
# component, a Q4_K slice of 4096 x 2880 values. ds4-argodrive's read size where no header is at
# hand (engines/ds4_argodrive) and the named workload ds4-v41's (planner/constants.py).
V41_COMPONENT_BYTES = 6_635_520
