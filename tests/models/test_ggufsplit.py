"""llama.cpp's split GGUF layout as arithmetic (models.ggufsplit): member names, the split keys and
their order and types, headers the gguf library reads back, alignment, and what cannot be split."""

import struct

import gguf
import numpy as np
import pytest

from models import ggufsplit
from models.ggufsplit import (
    DEFAULT_ALIGNMENT,
    KV,
    TensorEntry,
    check_split,
    ggml_n_dims,
    kv_scalar,
    kv_u16,
    member_count,
    pad_to,
    plan_members,
    split_prefix,
)
from tests.helpers import impure_imports

F32, Q8_0 = int(gguf.GGMLQuantizationType.F32), int(gguf.GGMLQuantizationType.Q8_0)


def kv_u32(key, value):
    b = key.encode()
    return KV(key, struct.pack("<Q", len(b)) + b + struct.pack("<iI", 4, value))


def kv_str(key, value):
    b, v = key.encode(), value.encode()
    return KV(key, struct.pack("<Q", len(b)) + b + struct.pack("<iQ", 8, len(v)) + v)


def tensors(n=5):
    """F32 vectors and Q8_0 matrices of odd sizes, so padding shows."""
    out = []
    for i in range(n):
        if i % 2:
            out.append(TensorEntry(f"t{i}", (64, 3), Q8_0, 3 * 2 * 34, "src.gguf", 0))
        else:
            out.append(TensorEntry(f"t{i}", (7 + i,), F32, 4 * (7 + i), "src.gguf", 0))
    return out


def write(member, path, fill):
    """The member as a file: its header, each tensor's bytes from `fill`, its padding."""
    with open(path, "wb") as f:
        f.write(member.header)
        for p in member.tensors:
            assert f.tell() == p.offset
            f.write(fill[p.tensor.name])
            f.write(bytes(p.pad))
        assert f.tell() == member.size


def test_the_module_is_pure():
    assert impure_imports(ggufsplit) == []


def test_names_prefixes_and_counts():
    assert split_prefix("Kimi-K2-Q4.gguf") == "Kimi-K2-Q4" and split_prefix("moe-00002-of-00009.gguf") == "moe"
    assert split_prefix("model") == "model" and member_count(75, 1) == 75 and member_count(75, 4) == 19
    assert [ggml_n_dims(ne) for ne in ((512,), (512, 1), (512, 1, 1), (1,), (64, 1, 8), (1, 4))] == [1, 1, 1, 1, 3, 2]
    assert pad_to(0, 32) == 0 and pad_to(33, 32) == 64 and pad_to(4096, 4096) == 4096


@pytest.mark.parametrize("n, per, words", [
    (0, 1, "no tensors"), (3, 0, "must be a positive integer"), (3, True, "must be a positive integer"),
    (70_000, 1, "70000 files: llama.cpp's split.count is a u16"),
])
def test_what_cannot_be_split_says_why(n, per, words):
    assert words in check_split(n, per)
    if n:
        with pytest.raises(ValueError, match=words.split(":")[0]):
            plan_members("m", [], [TensorEntry("t", (1,), F32, 4, "f", 0)] * n, per)


def test_metadata_goes_to_the_first_member_and_the_split_keys_come_last_in_gguf_splits_order(tmp_path):
    kvs = [kv_str("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 6), kv_u16("split.count", 9),
           kv_str("general.name", "x")]
    ts = tensors(5)
    members = plan_members("moe", kvs, ts, max_tensors=2)
    assert [m.name for m in members] == ["moe-00001-of-00003.gguf", "moe-00002-of-00003.gguf", "moe-00003-of-00003.gguf"]
    assert [[p.tensor.name for p in m.tensors] for m in members] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    fill = {t.name: bytes(range(256)) * (t.nbytes // 256) + bytes(t.nbytes % 256) for t in ts}
    for i, m in enumerate(members):
        path = tmp_path / m.name
        write(m, path, fill)
        r = gguf.GGUFReader(str(path))
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        model_keys = ["general.architecture", "qwen3moe.block_count", "general.name"] if i == 0 else []
        assert keys == model_keys + ["split.no", "split.tensors.count", "split.count"]
        assert (r.fields["split.no"].contents(), r.fields["split.count"].contents()) == (i, 3)
        assert r.fields["split.tensors.count"].contents() == 5
        assert [r.fields[k].types[0] for k in ("split.no", "split.tensors.count", "split.count")] == [
            gguf.GGUFValueType.UINT16, gguf.GGUFValueType.INT32, gguf.GGUFValueType.UINT16]
        assert r.alignment == DEFAULT_ALIGNMENT and len(m.header) % DEFAULT_ALIGNMENT == 0
        for p, t in zip(m.tensors, r.tensors):
            assert (t.name, int(t.data_offset), int(t.n_bytes)) == (p.tensor.name, p.offset, p.tensor.nbytes)
            assert bytes(np.asarray(t.data).tobytes()) == fill[t.name]
            assert tuple(int(x) for x in t.shape) == p.tensor.ne and int(t.tensor_type) == p.tensor.ggml_type


def test_the_first_member_keeps_the_sources_alignment_the_others_take_the_default(tmp_path):
    kvs = [kv_str("general.architecture", "x"), kv_u32("general.alignment", 256)]
    assert kv_scalar(kvs[1]) == 256 and kv_scalar(kvs[0]) is None
    ts = tensors(4)
    members = plan_members("a", kvs, ts, max_tensors=2)
    fill = {t.name: b"\x01" * t.nbytes for t in ts}
    assert len(members[0].header) % 256 == 0 and members[0].tensors[1].offset % 256 == 0
    t0, t2 = members[0].tensors[0], members[1].tensors[0]   # 28 B padded to 256 in the first member, 36 B to 64 here
    assert t0.pad == 256 - 28 and t2.pad == 64 - 36 and len(members[1].header) % 32 == 0
    for m, align in zip(members, (256, 32)):
        write(m, tmp_path / m.name, fill)
        r = gguf.GGUFReader(str(tmp_path / m.name))
        assert r.alignment == align and [int(t.data_offset) for t in r.tensors] == [p.offset for p in m.tensors]
