"""A small synthetic MoE model shared by the engine tests (built once per test session)."""

import shutil

import pytest

from engine_bridge.synth import SynthSpec, synthesize

# 3 layers x 8 experts, top-2; each component 557,056 B (2 split blocks + 32 KiB tail), so decode
# reads split across sources too. About 43 MB.
SPEC = SynthSpec(layers=3, experts=8, top_k=2, dim=512, ff=1024, vocab=256, seed=7, quant="q8_0")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine-model")
    synthesize(str(d / "model.gguf"), SPEC)
    for name in ("r1.gguf", "r2.gguf"):
        shutil.copyfile(d / "model.gguf", d / name)
    return d
