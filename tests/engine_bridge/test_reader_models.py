"""The split reader on multi-file models: a real split GGUF set and a real safetensors directory,
copied to two replica folders. A read names one of the model's files and its pieces come from the
same file in every source; sources are matched per file at open; a failing file degrades its whole
source and its pieces fail over; descriptors stay bounded however many files the model has."""

import os
import random
import shutil

import numpy as np
import pytest

from core.errors import MissingError, UsageError
from engine_bridge.reader import files as files_mod
from engine_bridge.reader.files import SourceFiles
from engine_bridge.reader.split_reader import SplitReader
from engine_bridge.reader.settings import ReaderSettings
from engines.ds4_argodrive.constants import BLOCK_BYTES
from engines.split import split_read
from core.coldio import CachedReader
from models.formats import RAW, read_safetensors_header
from models.modelset import Extent, discover
from tests.helpers import FailingReader, write_safetensors_dir, write_split_gguf

TENSOR = 4 * BLOCK_BYTES + 12_345        # bytes: a tensor splits across 3 sources (4 blocks and a tail)


def _replicate(model, tmp_path):
    """The model and its copies in green/ and white/ (same names), as ModelSets, primary first."""
    out = [model]
    for name in ("green", "white"):
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        if model.layout == "dir":
            shutil.copytree(model.path, d / model.name)
        else:
            for rel in model.files:
                shutil.copyfile(model.abs(rel), d / rel)
        out.append(model.in_dir(str(d)))
    return out


def _gguf_extents(model):
    """Every tensor of every part as an Extent (from the file's own tensor table) and its bytes."""
    from gguf import GGUFReader

    out = []
    for rel in model.files:
        for t in GGUFReader(model.abs(rel), "r").tensors:
            out.append((Extent(rel, int(t.data_offset), int(t.n_bytes)), bytes(np.asarray(t.data).tobytes())))
    return out


def _safetensors_extents(model):
    """Every tensor of every shard as an Extent (its header's data_offsets) and its bytes (numpy API)."""
    from safetensors.numpy import load_file

    out = []
    for rel in model.files:
        if not rel.endswith(".safetensors"):
            continue
        h = read_safetensors_header(model.abs(rel))
        arrays = load_file(model.abs(rel))
        for name, t in sorted(h.tensors.items()):
            lo, hi = t["data_offsets"]
            out.append((Extent(rel, h.data_start + lo, hi - lo), arrays[name].tobytes()))
    return out


@pytest.fixture
def split_gguf(tmp_path):
    parts = write_split_gguf(tmp_path / "internal", "moe", 3, tensors_per_part=2, tensor_bytes=TENSOR, seed=3)
    return _replicate(discover(str(parts[1])), tmp_path)          # any member finds the whole set


@pytest.fixture
def st_dir(tmp_path):
    d = write_safetensors_dir(tmp_path / "internal" / "Moe-HF", 3, shard_bytes=2 * TENSOR, seed=4)
    return _replicate(discover(str(d)), tmp_path)


def _by_file(extents):
    return sorted({e.file for e, _ in extents})


@pytest.mark.parametrize("hedge", [False, True])
@pytest.mark.parametrize("kind", ["split_gguf", "st_dir"])
def test_extents_in_every_file_read_back_exactly_from_every_source(kind, hedge, request):
    models = request.getfixturevalue(kind)
    extents = (_gguf_extents if kind == "split_gguf" else _safetensors_extents)(models[0])
    assert len(_by_file(extents)) == 3 and len(models[0].files) >= 3
    with SplitReader(models, [2, 1, 1], [10, 6, 6], cold=not hedge, settings=ReaderSettings(lanes=2, hedge=hedge)) as r:
        tickets = [(r.submit(e.offset, e.length, "decode" if i % 2 else "prefill", file=e.file), want)
                   for i, (e, want) in enumerate(extents)]
        for t, want in tickets:
            assert bytes(t.result()) == want, (t.file, t.offset, t.length)
        # a side file (config.json, or a part's header) reads like any other
        side = "config.json" if kind == "st_dir" else models[0].files[2]
        with open(models[0].abs(side), "rb") as f:
            head = f.read(100)
        assert bytes(r.read(0, 100, file=side)) == head
        s = r.stats()
    assert not s.events and not any(x.degraded for x in s.sources)
    if not hedge:      # exact counters: every source delivered its split of every read
        want = [0, 0, 0]
        for i, (e, _) in enumerate(extents):
            for p in split_read(e.offset, e.length, (10, 6, 6) if i % 2 else (2, 1, 1)):
                want[p.source] += p.length
        want[0] += 100
        assert [x.bytes for x in s.sources] == want
    assert all(x.bytes > 0 for x in s.sources)
    assert [x.path for x in s.sources] == [m.path for m in models]


def test_a_read_names_a_file_of_the_model(split_gguf):
    with SplitReader(split_gguf, [1, 1, 1], cold=False, settings=ReaderSettings(lanes=1)) as r:
        assert r.files == split_gguf[0].files
        assert r.size == sum(os.path.getsize(p) for p in split_gguf[0].paths)
        with pytest.raises(UsageError, match="the model has 3 files; name the file"):
            r.read(0, 10)
        with pytest.raises(UsageError, match="'nope.gguf' is not one of the model's files"):
            r.read(0, 10, file="nope.gguf")
        last = split_gguf[0].files[2]
        size = r.sizes[last]
        with pytest.raises(UsageError, match=f"outside the file {last} \\(size {size}\\)"):
            r.read(size - 1, 2, file=last)


def test_a_missing_shard_in_one_replica_is_refused_at_open_naming_member_and_file(st_dir):
    white = st_dir[2]
    gone = white.abs("model-00002-of-00003.safetensors")
    os.unlink(gone)
    with pytest.raises(MissingError) as e:
        SplitReader(st_dir, [1, 1, 1])
    assert str(e.value).startswith(f"source 2 ({white.path}): file {gone}: no such file")
    assert e.value.exit_code == 3


def test_a_short_part_in_one_replica_is_refused_at_open_naming_member_and_file(split_gguf):
    green = split_gguf[1]
    part = green.abs(green.files[1])
    full = os.path.getsize(part)
    os.truncate(part, full - 1)
    with pytest.raises(UsageError) as e:
        SplitReader(split_gguf, [1, 1, 1])
    assert str(e.value).startswith(f"source 1 ({green.path}): file {part}: size {full - 1} differs from the "
                                   f"primary's {full}")
    assert e.value.exit_code == 2


def test_a_replica_holding_another_model_is_refused(split_gguf, st_dir):
    with pytest.raises(UsageError, match="source 1 .*: lists files .* but the primary has .*; every source must be the same "
                                         "model"):
        SplitReader([split_gguf[0], st_dir[1]], [1, 1])


def test_a_failing_file_fails_over_and_degrades_its_whole_source(st_dir):
    extents = _safetensors_extents(st_dir[0])
    bad = "model-00002-of-00003.safetensors"
    FailingReader.broken = {st_dir[1].abs(bad): 0}
    events = []
    with SplitReader(st_dir, [2, 1, 1], opener=FailingReader, report=events.append, settings=ReaderSettings(lanes=2)) as r:
        first = [(e, w) for e, w in extents if e.file != bad][:2]
        for e, want in first:                    # green serves shard 1 normally
            assert bytes(r.read(e.offset, e.length, file=e.file)) == want
        green_before = r.stats().sources[1].bytes
        assert green_before > 0
        for e, want in sorted(extents, key=lambda x: x[0].file != bad):   # shard 2 first: it fails on green
            assert bytes(r.read(e.offset, e.length, file=e.file)) == want
        s = r.stats()
    assert r.degraded == (False, True, False)
    failed = [e for e in s.events if e.kind == "read_failed"]
    assert failed and all(e.source == 1 and e.file == bad and bad in e.message for e in failed)
    assert any(e.kind == "failover" and e.file == bad for e in s.events)
    # degraded as a whole: after the failure green got no piece of any file
    assert s.sources[1].bytes == green_before
    assert s.sources[0].failover_bytes + s.sources[2].failover_bytes > 0
    assert [e.kind for e in events] == [e.kind for e in s.events]
    assert s.to_dict()["events"][0]["file"] == bad


def test_a_part_replaced_before_its_first_read_degrades_its_source(split_gguf):
    extents = _gguf_extents(split_gguf[0])
    white = split_gguf[2]
    last = white.files[2]
    with SplitReader(split_gguf, [1, 1, 1], cold=False, health_interval=None, settings=ReaderSettings(lanes=1)) as r:
        # same bytes, new inode: not the file the reader checked at open
        tmp = white.abs(last) + ".new"
        shutil.copyfile(white.abs(last), tmp)
        os.replace(tmp, white.abs(last))
        for e, want in extents:
            assert bytes(r.read(e.offset, e.length, file=e.file)) == want
        s = r.stats()
    assert r.degraded == (False, False, True)
    assert any(e.kind == "read_failed" and e.file == last and "replaced" in e.message for e in s.events)


def test_a_vanished_part_is_found_by_the_health_check(split_gguf):
    with SplitReader(split_gguf, [1, 1, 1], cold=False, health_interval=0, settings=ReaderSettings(lanes=1)) as r:
        os.unlink(split_gguf[1].abs(split_gguf[1].files[2]))
        e, want = _gguf_extents(split_gguf[0])[0]
        assert bytes(r.read(e.offset, e.length, file=e.file)) == want
        s = r.stats()
    assert r.degraded == (False, True, False)
    (ev,) = [x for x in s.events if x.kind == "vanished"]
    assert ev.file == split_gguf[1].files[2] and "gone" in ev.message


def test_many_files_keep_few_descriptors_open(tmp_path):
    n = files_mod.OPEN_FILES_PER_SOURCE + 8
    rng = random.Random(1)
    root = tmp_path / "internal" / "raw-model"
    root.mkdir(parents=True)
    content = {}
    for i in range(n):
        rel = f"shard-{i:03d}.bin"
        content[rel] = rng.randbytes(BLOCK_BYTES + 1000 * i + 1)
        (root / rel).write_bytes(content[rel])
    models = _replicate(discover(str(root), RAW), tmp_path)
    assert len(models[0].files) == n
    with SplitReader(models, [1, 1, 1], cold=False, settings=ReaderSettings(lanes=2)) as r:
        for _ in range(2):                        # the second pass reopens what was closed
            for rel in sorted(content, key=lambda _: rng.random()):
                ln = len(content[rel]) - 7
                assert bytes(r.read(7, ln, file=rel)) == content[rel][7:]
                assert all(f.open_count() <= files_mod.OPEN_FILES_PER_SOURCE for f in r._sources)
        assert not r.stats().events


def test_source_files_never_close_a_file_a_lane_is_reading(tmp_path):
    paths = []
    for i in range(4):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * 4096)
        paths.append(str(p))
    ident = [(os.stat(p).st_dev, os.stat(p).st_ino, 4096) for p in paths]
    sf = SourceFiles(paths, ident, CachedReader, limit=2)
    held = [sf.acquire(i) for i in range(4)]            # all busy: all stay open beyond the limit
    assert sf.open_count() == 4 and all(r.fd >= 0 for r in held)
    sf.release(0)
    sf.release(1)                                       # the two least recently used idle ones go
    assert sf.open_count() == 2 and held[0].fd == -1 and held[1].fd == -1
    assert held[2].fd >= 0 and held[3].fd >= 0
    again = sf.acquire(0)                               # reopened on demand
    assert again is not held[0] and again.fd >= 0
    sf.close()
    assert all(r.fd == -1 for r in held[2:] + [again])
