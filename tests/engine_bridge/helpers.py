"""Plain helpers of the engine_bridge tests."""

from engine_bridge.moe.synth import SynthSpec
from engine_bridge.moe.synth_colibri import ColibriSpec
from tests.helpers import write_random

# 3 layers x 8 experts, top-2; each component 557,056 B (2 split blocks + 32 KiB tail), so decode
# reads split across sources too. About 43 MB.
SPEC = SynthSpec(layers=3, experts=8, top_k=2, dim=512, ff=1024, vocab=256, seed=7, quant="q8_0")


def primary_and_copies(folder, size, seed):
    """A random 'model' primary.gguf in `folder` and two byte-identical copies (green, white):
    returns ([paths], bytes)."""
    data = write_random(folder / "primary.gguf", size, seed=seed)
    paths = [str(folder / "primary.gguf")]
    for name in ("green.gguf", "white.gguf"):
        (folder / name).write_bytes(data)
        paths.append(str(folder / name))
    return paths, data


# The colibri-format model the tests run (a GLM-shaped safetensors directory, `conftest.colibri_dir`).
COLIBRI_SPEC = ColibriSpec(layers=2, experts=8, top_k=2, dim=512, ff=1536, vocab=300, shards=2, seed=7)
