"""Geometry from the tensor table alone: works on a file the size of the real model."""

import os

import gguf
import numpy as np
import pytest

from core.errors import UsageError
from engine_bridge.engine.model import inspect_model

FIELD_COMPONENT = 6_635_520     # DESIGN §7
NE0, NE1, EXPERTS, LAYERS = 4096, 2880, 384, 40    # Q4_K: 4096 * 2880 / 256 * 144 = 6,635,520 B per slice


def write_header_only(path, layers=LAYERS, experts=EXPERTS, arch="deepseek2", top_k=6, names=None):
    """A GGUF whose tensor table describes the real geometry; the data is a hole (sparse file)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.expert_used_count", top_k)
    qt = gguf.GGMLQuantizationType.Q4_K
    row = NE0 // 256 * 144
    names = names or [f"blk.{l}.ffn_{c}_exps.weight" for l in range(layers) for c in ("gate", "up", "down")]
    total = 0
    for n in names:
        nbytes = experts * NE1 * row
        w.add_tensor_info(n, (experts, NE1, row), np.dtype(np.uint8), nbytes, raw_dtype=qt)
        total += w.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    start = w.ggml_pad(f.tell(), w.data_alignment)
    w.close()
    os.truncate(path, start + total)
    return start + total


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
    assert (g.layers, g.experts, g.top_k) == (40, 384, 6)
    assert g.component_bytes == FIELD_COMPONENT
    assert g.expert_bytes == 19_906_560 and g.layer_bytes == 7_644_119_040      # DESIGN §7
    gate, up, down = g.expert_ranges(7, 5)
    assert gate == (g.tensor(7, "gate").offset + 5 * FIELD_COMPONENT, FIELD_COMPONENT)
    assert len({gate[0], up[0], down[0]}) == 3      # three different regions of the file


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
