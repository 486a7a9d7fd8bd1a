"""Plain helpers of the engine_bridge tests."""

from engine_bridge.engine.synth import SynthSpec

# 3 layers x 8 experts, top-2; each component 557,056 B (2 split blocks + 32 KiB tail), so decode
# reads split across sources too. About 43 MB.
SPEC = SynthSpec(layers=3, experts=8, top_k=2, dim=512, ff=1024, vocab=256, seed=7, quant="q8_0")
