"""The engine's geometry is models.geometry's, read from the tensor table alone (works on a file
the size of the real model), and refuses what `run` cannot compute."""

import os

import pytest

from core.errors import UsageError
from engine_bridge.moe.resident import inspect_model
from engine_bridge.moe.synth import SynthSpec, synthesize
from models.geometry import Geometry
from models.modelset import Extent
from models.tensortable import inspect_model as inspect_any
from tests.models.geometry_helpers import V41_COMPONENT, write_header_only, write_moe_split_gguf


def test_real_model_geometry_from_a_300_gb_sparse_file(tmp_path):
    path = tmp_path / "v41.gguf"
    try:
        size = write_header_only(path)
    except OSError as e:
        pytest.skip(f"file system cannot hold a sparse 300 GB file: {e}")
    try:
        g = inspect_model(str(path))
        assert os.path.getsize(path) == size > 300e9
    finally:
        path.unlink()      # a hole, but don't leave a 300 GB file around for other tools to trip on
    assert isinstance(g, Geometry)
    assert (g.layers, g.experts, g.top_k) == (40, 384, 6)
    assert g.component_bytes == V41_COMPONENT
    assert g.expert_bytes == 19_906_560 and g.experts * g.expert_bytes == 7_644_119_040      # docs/planner.md
    gate, up, down = g.expert_ranges(7, 5)
    assert gate == Extent("v41.gguf", g.tensor(7, "gate").offset + 5 * V41_COMPONENT, V41_COMPONENT)
    assert len({gate.offset, up.offset, down.offset}) == 3      # three different regions of the file


def test_a_synthesised_model_has_the_geometry_synth_wrote(tmp_path):
    spec = SynthSpec(layers=3, experts=8, top_k=2)
    path = str(tmp_path / "m.gguf")
    synthesize(path, spec)
    g = inspect_model(path)
    assert g == inspect_any(path)
    assert (g.layers, g.experts, g.top_k, g.component_bytes) == (3, 8, 2, spec.component_bytes)
    assert g.shared_experts == 1                 # synth writes a shared expert's tensors (ffn_*_shexp)
    assert g.tensor(2, "down").qtype == "Q8_0" and g.alignment == 4096
    with open(path, "rb") as f:                  # an extent addresses the tensor's slice: expert 5 of layer 2
        ext = g.expert_ranges(2, 5)[2]
        f.seek(g.tensor(2, "down").offset + 5 * spec.component_bytes)
        want = f.read(spec.component_bytes)
        f.seek(ext.offset)
        assert f.read(ext.length) == want and ext.file == "m.gguf"


def test_a_model_without_routed_experts_or_with_a_missing_one_is_refused(tmp_path):
    p = tmp_path / "dense.gguf"
    write_header_only(p, names=["blk.0.ffn_gate.weight"], experts=2)
    with pytest.raises(UsageError, match="no routed expert tensors"):
        inspect_model(str(p))
    p = tmp_path / "gap.gguf"
    write_header_only(p, experts=2, names=["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"])
    with pytest.raises(UsageError, match="missing blk.0.ffn_down_exps.weight"):
        inspect_model(str(p))
    p = tmp_path / "k.gguf"
    write_header_only(p, layers=1, experts=2, top_k=0)
    with pytest.raises(UsageError, match="expert_used_count"):
        inspect_model(str(p))


def test_run_refuses_what_it_cannot_compute(tmp_path):
    """`run` computes a model shaped as synth writes it, in one file or a split set (a re-split one
    computes: tests/engine_bridge/test_synth_qwen3moe.py): a split set with unequal components is
    read by the general geometry (replay, the planner) but refused here, in one line."""
    paths = write_moe_split_gguf(tmp_path / "s", "m")
    assert inspect_any(str(paths[0])).layout == "gguf-split"
    with pytest.raises(UsageError, match=r"expert tensors differ in slice size \[4096, 8192\]"):
        inspect_model(str(paths[0]))
