"""Fixtures of the engine_bridge tests: the small synthetic MoE model (built once per session)."""

import shutil

import pytest

from engine_bridge.moe.synth import synthesize
from engine_bridge.moe.synth_colibri import synthesize_colibri
from tests.engine_bridge.helpers import COLIBRI_SPEC, SPEC


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine-model")
    synthesize(str(d / "model.gguf"), SPEC)
    for name in ("r1.gguf", "r2.gguf"):
        shutil.copyfile(d / "model.gguf", d / name)
    return d


@pytest.fixture(scope="session")
def colibri_dir(tmp_path_factory):
    """A colibri-format model directory ("model") and two copies ("r1", "r2")."""
    d = tmp_path_factory.mktemp("colibri-model")
    synthesize_colibri(str(d / "model"), COLIBRI_SPEC)
    for name in ("r1", "r2"):
        shutil.copytree(d / "model", d / name)
    return d
