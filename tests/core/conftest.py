"""Fixtures of the core tests: a tiny synthetic MoE model for the commands that read one."""

import pytest

from engine_bridge.moe.synth import SynthSpec, synthesize


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A 1-layer, 4-expert GGUF (about 1.4 MB): enough geometry for `engine-bridge replay`."""
    path = tmp_path_factory.mktemp("core-model") / "model.gguf"
    synthesize(str(path), SynthSpec(layers=1, experts=4, top_k=2, dim=256, ff=256, vocab=32, seed=1, quant="q8_0"))
    return path
