"""models.parsecheck on real files written by their own libraries (gguf, safetensors), whole and
damaged in the ways a cut download or a rewritten header damages them."""

import struct

import pytest

from models.formats import GGUF, SAFETENSORS
from models.modelset import DIR, FILE, SPLIT
from models.parsecheck import check_parses, file_format
from tests.helpers import write_safetensors_dir, write_split_gguf


def gguf_file(tmp_path):
    return write_split_gguf(tmp_path / "g", "moe", 1, tensors_per_part=3, tensor_bytes=8192, seed=1)[0]


def safetensors_file(tmp_path):
    d = write_safetensors_dir(tmp_path / "s", 1, shard_bytes=8192, tensors_per_shard=2, seed=2)
    return d / "model-00001-of-00001.safetensors"


def test_whole_files_parse(tmp_path):
    assert check_parses(str(gguf_file(tmp_path)), GGUF) == check_parses(str(gguf_file(tmp_path)), GGUF)
    g = check_parses(str(gguf_file(tmp_path)), GGUF)
    assert (g.ok, g.format, g.tensors, g.detail) == (True, GGUF, 3, "")
    s = check_parses(str(safetensors_file(tmp_path)), SAFETENSORS)
    assert (s.ok, s.format, s.tensors) == (True, SAFETENSORS, 2)
    for p in write_split_gguf(tmp_path / "set", "moe", 3, tensors_per_part=2, tensor_bytes=4096):
        assert check_parses(str(p), GGUF).ok


def cut(path, nbytes):
    data = path.read_bytes()
    path.write_bytes(data[:-nbytes])


def patch(path, offset, raw):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(raw)


def test_a_truncated_gguf_does_not_parse(tmp_path):
    p = gguf_file(tmp_path)
    cut(p, 100)                      # the last tensor's data is cut short
    c = check_parses(str(p), GGUF)
    assert not c.ok and c.format == GGUF and str(p) not in c.detail
    assert "truncated" in c.detail


def test_a_garbled_gguf_header_does_not_parse(tmp_path):
    p = gguf_file(tmp_path)
    patch(p, 8, struct.pack("<Q", 1 << 40))         # the tensor count: far more than the file holds
    c = check_parses(str(p), GGUF)
    assert not c.ok and c.detail


def test_a_tensor_off_the_alignment_does_not_parse(tmp_path):
    import gguf

    p = gguf_file(tmp_path)
    r = gguf.GGUFReader(str(p), "r")
    first = r.tensors[0]
    # the offset field of the first tensor's info: its last 8 bytes (its data then still lies in the file)
    info_end = int(first.field.offset) + int(sum(int(x.nbytes) for x in first.field.parts))
    off = struct.unpack("<Q", p.read_bytes()[info_end - 8:info_end])[0]
    assert off + r.data_offset == first.data_offset
    del r
    patch(p, info_end - 8, struct.pack("<Q", off + 1))
    c = check_parses(str(p), GGUF)
    assert not c.ok and "alignment" in c.detail


def test_a_garbled_or_truncated_safetensors_header_does_not_parse(tmp_path):
    p = safetensors_file(tmp_path)
    (n,) = struct.unpack("<Q", p.read_bytes()[:8])
    patch(p, 8 + n // 2, b"\x00")                   # a NUL inside the JSON
    c = check_parses(str(p), SAFETENSORS)
    assert not c.ok and "not JSON" in c.detail
    q = safetensors_file(tmp_path / "again")
    cut(q, 10)                                      # the last tensor's bytes are cut short
    c = check_parses(str(q), SAFETENSORS)
    assert not c.ok and "outside the file" in c.detail


def test_which_files_must_parse():
    assert file_format(GGUF, FILE, "anything.bin") == GGUF           # the model's one file, whatever its name
    assert file_format(GGUF, SPLIT, "moe-00002-of-00003.gguf") == GGUF
    assert file_format(SAFETENSORS, DIR, "model-00001-of-00002.safetensors") == SAFETENSORS
    assert file_format(SAFETENSORS, DIR, "config.json") is None      # config, tokenizer: nothing to parse
    assert file_format(GGUF, DIR, "README.md") is None
    assert file_format("raw", FILE, "model.bin") is None and file_format("", FILE, "m") is None


def test_no_parser_for_raw_bytes(tmp_path):
    with pytest.raises(ValueError):
        check_parses(str(gguf_file(tmp_path)), "raw")
