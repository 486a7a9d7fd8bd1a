"""Fixtures of the engine_bridge tests: the small synthetic MoE model (built once per session)."""

import shutil

import pytest

from engine_bridge.engine.synth import synthesize
from tests.engine_bridge.helpers import SPEC


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine-model")
    synthesize(str(d / "model.gguf"), SPEC)
    for name in ("r1.gguf", "r2.gguf"):
        shutil.copyfile(d / "model.gguf", d / name)
    return d
