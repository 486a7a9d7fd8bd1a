"""Re-splitting a GGUF one tensor per file with llama.cpp's split metadata (replicas.resplit): every
tensor's bytes where the set's headers say, our model readers take the 75-file set as the same
model, a coarser set re-splits to the same bytes as the file, nothing existing is replaced, a
cancel leaves nothing; and, when LLAMA_CPP_BIN_DIR names llama.cpp's binaries, the set is
byte-identical to `llama-gguf-split --split --split-max-tensors 1` and runs as the file does."""

import hashlib
import os
import subprocess
import threading

import gguf
import numpy as np
import pytest

from core.errors import Interrupted, UsageError
from core.events import Progress
from engine_bridge.moe.synth_qwen3moe import Qwen3MoeSpec, synthesize_qwen3moe
from models.modelset import SPLIT, discover
from models.tensortable import inspect_model
from replicas.resplit import resplit
from tests.helpers import llama_cpp_bin, llama_simple, needs_llama_cpp
from tests.models.geometry_helpers import write_moe_split_gguf

SPEC = Qwen3MoeSpec(layers=6, experts=8, top_k=2, dim=64, ff=64, heads=2, kv_heads=1, head_dim=32, seed=5)


def digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("resplit")
    synthesize_qwen3moe(str(d / "tiny.gguf"), SPEC)
    return d / "tiny.gguf"


def test_one_tensor_per_file_holds_every_tensors_bytes_and_reads_as_the_same_model(model, tmp_path):
    events = []
    doc = resplit(str(model), str(tmp_path), report=events.append)
    names = [f"tiny-{i:05d}-of-00075.gguf" for i in range(1, 76)]
    assert doc["files"] == names and sorted(os.listdir(tmp_path)) == names
    assert (doc["kind"], doc["tensors"], doc["path"]) == ("resplit", 75, str(tmp_path / names[0]))
    assert doc["bytes"] == sum(os.path.getsize(tmp_path / n) for n in names)
    assert all(isinstance(e, Progress) for e in events) and events[-1].done == events[-1].total == doc["bytes"]
    assert [e.done for e in events] == sorted(e.done for e in events)
    src = gguf.GGUFReader(str(model))
    source = {t.name: np.asarray(t.data).tobytes() for t in src.tensors}
    first = gguf.GGUFReader(str(tmp_path / names[0]))
    fields = lambda r: {k: f.contents() for k, f in r.fields.items() if not k.startswith(("GGUF.", "split."))}  # noqa: E731
    assert fields(first) == fields(src)                               # the model's metadata, in the first file only
    seen = []
    for i, n in enumerate(names):
        r = gguf.GGUFReader(str(tmp_path / n))
        assert (r.fields["split.no"].contents(), r.fields["split.count"].contents()) == (i, 75)
        assert r.fields["split.tensors.count"].contents() == 75 and len(r.tensors) == 1
        if i:
            assert [k for k in r.fields if not k.startswith("GGUF.")] == ["split.no", "split.tensors.count", "split.count"]
        t = r.tensors[0]
        assert np.asarray(t.data).tobytes() == source[t.name]
        seen.append(t.name)
    assert seen == [t.name for t in src.tensors]
    # our readers: a split set of 75 members, the same experts at other places with the same bytes
    m = discover(str(tmp_path / names[40]))
    assert (m.layout, m.path, len(m.files)) == (SPLIT, str(tmp_path / names[0]), 75)
    g, g1 = inspect_model(m), inspect_model(str(model))
    assert (g.layers, g.experts, g.top_k, g.component_bytes, g.layout) == (g1.layers, g1.experts, g1.top_k,
                                                                          g1.component_bytes, "gguf-split")
    for layer, e in ((0, 0), (5, 7)):
        for a, b in zip(g.expert_ranges(layer, e), g1.expert_ranges(layer, e)):
            assert a.file != b.file and a.length == b.length
            with open(tmp_path / a.file, "rb") as fa, open(model, "rb") as fb:
                fa.seek(a.offset)
                fb.seek(b.offset)
                assert fa.read(a.length) == fb.read(b.length)


def test_a_coarser_set_resplits_to_the_same_bytes_as_the_file(model, tmp_path):
    for d in ("coarse", "fine", "again"):
        (tmp_path / d).mkdir()
    coarse = resplit(str(model), str(tmp_path / "coarse"), max_tensors=8)
    assert len(coarse["files"]) == 10 and coarse["files"][-1] == "tiny-00010-of-00010.gguf"
    resplit(str(model), str(tmp_path / "fine"))
    again = resplit(str(tmp_path / "coarse" / coarse["files"][3]), str(tmp_path / "again"))   # any member names the set
    assert again["source_files"] == coarse["files"] and digest(tmp_path / "again") == digest(tmp_path / "fine")


def test_a_set_the_gguf_library_split_is_resplit_tensor_by_tensor(tmp_path):
    paths = write_moe_split_gguf(tmp_path / "src", "moe", per_part=4)
    (tmp_path / "out").mkdir()
    doc = resplit(str(paths[0]), str(tmp_path / "out"))
    want = {}
    for p in paths:
        want.update({t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(str(p)).tensors})
    got = {}
    for n in doc["files"]:
        got.update({t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(str(tmp_path / "out" / n)).tensors})
    assert got == want and len(doc["files"]) == len(want) == 12


def test_a_source_with_its_own_alignment_keeps_it_in_the_first_member(tmp_path):
    """synth's models declare general.alignment 4096: the first member keeps it (its data section
    and tensor offsets on it), the others are 32-aligned, and every tensor reads back the same.
    (llama-gguf-split pads that first member to 32, so it is read at the wrong offset.)"""
    from engine_bridge.moe.synth import SynthSpec, synthesize

    synthesize(str(tmp_path / "a.gguf"), SynthSpec(layers=1, experts=2, top_k=1, dim=256, ff=256, vocab=64))
    (tmp_path / "out").mkdir()
    doc = resplit(str(tmp_path / "a.gguf"), str(tmp_path / "out"))
    src = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(str(tmp_path / "a.gguf")).tensors}
    for i, n in enumerate(doc["files"]):
        r = gguf.GGUFReader(str(tmp_path / "out" / n))
        assert r.alignment == (4096 if i == 0 else 32) and r.data_offset % r.alignment == 0
        assert np.asarray(r.tensors[0].data).tobytes() == src[r.tensors[0].name]


def test_nothing_existing_is_replaced_and_a_cancel_leaves_nothing(model, tmp_path):
    mine = tmp_path / "tiny-00007-of-00075.gguf"
    mine.write_bytes(b"mine")
    with pytest.raises(UsageError, match="tiny-00007-of-00075.gguf: already exists .* never replaces a file"):
        resplit(str(model), str(tmp_path))
    assert os.listdir(tmp_path) == [mine.name] and mine.read_bytes() == b"mine"
    mine.unlink()
    stop = threading.Event()

    def report(e):
        if e.done > 100_000:
            stop.set()

    with pytest.raises(Interrupted):
        resplit(str(model), str(tmp_path), report=report, cancel=stop)
    assert os.listdir(tmp_path) == []                                 # no temporary, no member
    with pytest.raises(UsageError, match="not a directory"):
        resplit(str(model), str(tmp_path / "nowhere"))
    with pytest.raises(UsageError, match="tensors per file 0"):
        resplit(str(model), str(tmp_path), max_tensors=0)


@needs_llama_cpp("llama-gguf-split", "llama-simple")
def test_the_set_is_llama_gguf_splits_byte_for_byte_and_runs_as_the_file(model, tmp_path):
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    theirs.mkdir()
    ours.mkdir()
    p = subprocess.run([llama_cpp_bin("llama-gguf-split"), "--split", "--split-max-tensors", "1", str(model),
                        str(theirs / "tiny")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    resplit(str(model), str(ours))
    assert len(digest(theirs)) == 75 and digest(ours) == digest(theirs)
    alone = llama_simple(model, "hello world", 16, cwd=tmp_path)
    assert llama_simple(ours / "tiny-00001-of-00075.gguf", "hello world", 16, cwd=tmp_path) == alone
