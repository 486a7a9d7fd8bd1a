"""The routed-expert geometry from a model's tensor table: GGUF (one file, split set, the real V4.1
layout as a header-only sparse file) and safetensors directories (per-expert tensors)."""

import json
import os
from dataclasses import replace

import numpy as np
import pytest

from core.errors import UsageError
from models import geometry as geometry_module
from models.formats import read_safetensors_header
from models.geometry import Geometry, TensorInfo, TensorTable, geometry_from_table
from models.modelset import Extent
from models.tensortable import inspect_model
from tests.helpers import impure_imports
from tests.models.geometry_helpers import (
    MIXTRAL,
    QWEN3,
    V41_COMPONENT,
    write_header_only,
    write_moe_safetensors,
    write_moe_split_gguf,
)


def test_the_geometry_module_is_pure():
    assert impure_imports(geometry_module) == []


def test_real_v41_layout_from_a_header_only_sparse_file(tmp_path):
    """docs/planner.md: 40 layers, 384 experts, 6 chosen, one shared; components of 6,635,520 B,
    19,906,560 B per expert, 7,644,119,040 B per layer; expert e at tensor offset + e * component."""
    path = tmp_path / "v41.gguf"
    try:
        size = write_header_only(path, shared=1)
    except OSError as e:
        pytest.skip(f"file system cannot hold a sparse 300 GB file: {e}")
    try:
        g = inspect_model(str(path))
        assert os.path.getsize(path) == size > 300e9
        assert os.stat(path).st_blocks * 512 < 1 << 20        # a hole, not 300 GB of data
    finally:
        path.unlink()
    assert (g.layers, g.experts, g.top_k, g.shared_experts) == (40, 384, 6, 1)
    assert g.component_bytes == V41_COMPONENT and g.uniform and g.stacked
    assert g.expert_bytes == 19_906_560 and g.layer_bytes == 7_644_119_040
    assert g.routed_bytes == 40 * 7_644_119_040 and g.file_size == size
    assert g.components == ("gate", "up", "down") and g.format == "gguf" and g.layout == "file"
    gate, up, down = g.expert_ranges(7, 5)
    assert gate == Extent("v41.gguf", g.tensor(7, "gate").offset + 5 * V41_COMPONENT, V41_COMPONENT)
    assert len({gate.offset, up.offset, down.offset}) == 3      # three different regions of the file
    assert g.tensor(7, "gate").qtype == "Q4_K" and g.alignment == 32
    assert g.as_dict()["component_sizes"] == {"gate": [V41_COMPONENT], "up": [V41_COMPONENT], "down": [V41_COMPONENT]}


def test_a_split_gguf_set_keeps_each_tensor_in_its_member_with_offsets_in_that_file(tmp_path):
    import gguf

    paths = write_moe_split_gguf(tmp_path / "m", "qwen", layers=3, experts=4, top_k=2, dim=64, ff=32, per_part=4)
    g = inspect_model(str(paths[1]))            # any member finds the whole set
    assert g.path == str(paths[0]) and g.layout == "gguf-split" and len(paths) == 3
    assert (g.layers, g.experts, g.top_k) == (3, 4, 2)
    gate_b, down_b = 32 * 64 * 2, 64 * 32 * 4    # F16 gate/up, F32 down: components differ in size
    assert g.component_sizes == {"gate": (gate_b,), "up": (gate_b,), "down": (down_b,)}
    assert g.component_bytes == down_b and not g.uniform       # the largest slice is the read size
    assert g.expert_bytes == 2 * gate_b + down_b
    files = {t.file for t in g.tensors}
    assert len(files) == 3, "the experts of three layers are spread over the three members"
    # every extent holds exactly the bytes the library wrote for that expert, in its own file
    for layer in range(3):
        for e in (0, 3):
            for comp, ext in zip(g.components, g.expert_ranges(layer, e)):
                r = gguf.GGUFReader(str(tmp_path / "m" / ext.file))
                t = next(t for t in r.tensors if t.name == f"blk.{layer}.ffn_{comp}_exps.weight")
                with open(tmp_path / "m" / ext.file, "rb") as f:
                    f.seek(ext.offset)
                    got = f.read(ext.length)
                assert got == np.asarray(t.data)[e].tobytes()


@pytest.mark.parametrize("naming", [QWEN3, MIXTRAL], ids=["qwen3", "mixtral"])
def test_a_safetensors_directory_with_one_tensor_per_expert(tmp_path, naming):
    d = write_moe_safetensors(tmp_path / "hf", naming, layers=2, experts=4, top_k=2, dim=32, ff=16, shards=2)
    g = inspect_model(str(d))
    assert (g.layers, g.experts, g.top_k, g.stacked) == (2, 4, 2, False)
    assert g.format == "safetensors" and g.layout == "dir" and g.alignment == 1
    assert g.component_sizes == {"gate": (16 * 32 * 2,), "up": (16 * 32 * 2,), "down": (32 * 16 * 4,)}
    assert g.shared_experts is None
    pattern, comp = naming
    for layer in range(2):
        for e in range(4):
            for c, ext in zip(("gate", "up", "down"), g.expert_ranges(layer, e)):
                name = pattern.format(l=layer, e=e, c=comp[c])
                h = read_safetensors_header(str(d / ext.file))
                b, end = h.tensors[name]["data_offsets"]
                assert ext == Extent(ext.file, 8 + h.length + b, end - b)
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    assert {t.file for t in g.tensors} == set(index.values())


def test_deepseek_v3_names_dense_first_layers_and_shared_experts(tmp_path):
    d = write_moe_safetensors(tmp_path / "ds", QWEN3, layers=4, experts=3, top_k=2, first_dense=1,
                              config={"model_type": "deepseek_v3", "n_routed_experts": 3, "n_shared_experts": 1})
    cfg = json.loads((d / "config.json").read_text())
    del cfg["num_experts"]
    (d / "config.json").write_text(json.dumps(cfg))
    g = inspect_model(str(d))
    assert (g.layers, g.layer_ids, g.experts, g.shared_experts, g.arch) == (3, (1, 2, 3), 3, 1, "deepseek_v3")


def test_a_model_without_routed_experts_is_one_clear_line(tmp_path):
    p = tmp_path / "dense.gguf"
    write_header_only(p, names=["blk.0.ffn_gate.weight"], experts=2)
    with pytest.raises(UsageError, match="no routed expert tensors.*not a MoE model"):
        inspect_model(str(p))
    from tests.helpers import write_safetensors_dir
    d = write_safetensors_dir(tmp_path / "llama", 2)
    with pytest.raises(UsageError, match="no routed expert tensors"):
        inspect_model(str(d))


def test_incomplete_or_unlabelled_experts_are_refused(tmp_path):
    p = tmp_path / "gap.gguf"
    write_header_only(p, experts=2, names=["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"])
    with pytest.raises(UsageError, match="missing blk.0.ffn_down_exps.weight"):
        inspect_model(str(p))
    p = tmp_path / "k.gguf"
    write_header_only(p, layers=1, experts=2, top_k=None)
    with pytest.raises(UsageError, match="expert_used_count is None"):
        inspect_model(str(p))
    d = write_moe_safetensors(tmp_path / "hf", QWEN3, layers=1, experts=3)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_experts": 8}))
    with pytest.raises(UsageError, match="says 8 experts per layer but its tensors hold 3"):
        inspect_model(str(d))


def _table(names, fmt="gguf", meta=None, shape=(8, 4, 4), nbytes=256):
    tensors = tuple(TensorInfo(n, "m.gguf", 4096 + i * nbytes, nbytes, "F16", shape) for i, n in enumerate(names))
    return TensorTable("/m.gguf", fmt, "file", 1 << 20, "a", 32, tensors, meta or {"a.expert_used_count": 2})


def test_the_pure_parse_on_a_table_alone():
    names = [f"blk.{layer}.ffn_{c}_exps.weight" for layer in (0, 1) for c in ("gate", "up", "down")]
    g = geometry_from_table(_table(names))
    assert isinstance(g, Geometry) and (g.layers, g.experts, g.top_k, g.component_bytes) == (2, 4, 2, 64)
    # expert 3 of layer 1's down tensor: that tensor's offset + 3 slices
    assert g.expert_ranges(1, 3)[2] == Extent("m.gguf", 4096 + 5 * 256 + 3 * 64, 64)
    with pytest.raises(IndexError):
        g.expert_ranges(2, 0)
    # a fused gate_up tensor is one component, read before down
    fused = [f"blk.0.ffn_{c}_exps.weight" for c in ("down", "gate_up")]
    assert geometry_from_table(_table(fused)).components == ("gate_up", "down")
    odd = _table(names[:3])
    odd = replace(odd, tensors=odd.tensors[:2] + (TensorInfo(names[2], "m.gguf", 0, 192, "F16", (4, 4, 3)),))
    with pytest.raises(UsageError, match="different numbers of experts"):
        geometry_from_table(odd)
    with pytest.raises(UsageError, match="need the number of experts chosen per token"):
        geometry_from_table(_table(names, meta={"a.expert_used_count": 9}))


def test_the_geometry_record_keys_are_pinned():
    """Plans record Geometry.as_dict (planner plan schema 2): its keys are a contract."""
    names = [f"blk.{layer}.ffn_{c}_exps.weight" for layer in (0, 1) for c in ("gate", "up", "down")]
    d = geometry_from_table(_table(names)).as_dict()
    assert list(d) == ["path", "file_size", "arch", "layers", "experts", "top_k", "component_bytes", "expert_bytes",
                       "alignment", "format", "layout", "stacked", "components", "component_sizes", "shared_experts"]
    assert d["component_sizes"] == {"gate": [64], "up": [64], "down": [64]} and d["expert_bytes"] == 192
    assert json.loads(json.dumps(d)) == d
