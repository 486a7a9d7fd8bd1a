"""The engine's read shapes per drive, and where a GGUF keeps its experts."""

import numpy as np

from engines.ds4_argodrive.constants import COMPONENT_BYTES, PREFILL_CHUNK
from iobench.bench import model_layout
from iobench.shapes import SlotTable, decode_shape, min_slots, prefill_shape, seq_shape
from models.formats import GGUF, RAW
from models.modelset import one_file
from tests.iobench.helpers import write_moe_gguf

MiB = 1 << 20
GiB = 1 << 30


def test_prefill_pieces_are_the_engines_split_of_a_32_mib_chunk():
    sizes = [prefill_shape(GiB, (10, 5, 5), i).piece_bytes for i in range(3)]
    assert sizes == [16 * MiB, 8 * MiB, 8 * MiB]
    firsts = [prefill_shape(GiB, (10, 5, 5), i).first for i in range(3)]
    assert firsts == [0, 16 * MiB, 24 * MiB]
    assert prefill_shape(GiB, (1,), 0).piece_bytes == PREFILL_CHUNK


def test_decode_pieces_match_design_table():
    # docs/engine-profiles.md: 10:5:5 of a 6,635,520 B component -> 3,489,792 / 1,572,864 / 1,572,864
    assert [decode_shape(GiB, (10, 5, 5), i).piece_bytes for i in range(3)] == [3_489_792, 1_572_864, 1_572_864]
    assert [decode_shape(GiB, (10, 6, 6), i).piece_bytes for i in range(3)] == [2_965_504, 1_835_008, 1_835_008]
    assert decode_shape(GiB, (1,), 0).piece_bytes == COMPONENT_BYTES


def test_a_drive_with_no_bytes_has_no_shape():
    # 100:1 over 128 blocks: the second source gets one block; over 25 blocks it gets none
    assert prefill_shape(GiB, (100, 1), 1).piece_bytes == 262_144
    assert decode_shape(GiB, (100, 1), 1) is None


def test_sequential_slots_walk_the_file_and_wrap():
    size = 10 * MiB + 123
    s = seq_shape(size)
    t = SlotTable(s)
    assert t.n == 10
    assert [t.offset(k) for k in range(12)] == [k % 10 * MiB for k in range(12)]


def test_prefill_slots_stay_inside_the_file_and_aligned():
    size = 5 * PREFILL_CHUNK - 1
    s = prefill_shape(size, (10, 5, 5), 2)
    t = SlotTable(s)
    assert t.n == 4                      # the 5th chunk's last piece would cross the end
    for k in range(t.n):
        off = t.offset(k)
        assert off == k * PREFILL_CHUNK + 24 * MiB
        assert off % 4096 == 0 and off + s.piece_bytes <= size


def test_decode_slots_are_components_of_the_regions():
    regions = ((1000, 1000 + 4 * COMPONENT_BYTES), (10 ** 9, 10 ** 9 + 2 * COMPONENT_BYTES))
    s = decode_shape(2 * 10 ** 9, (10, 5, 5), 1, COMPONENT_BYTES, regions)
    t = SlotTable(s)
    assert t.n == 6
    for k in range(t.n):
        off = t.offset(k)
        assert off % 4096 == 0
        inside = [r for r in regions if r[0] - 4096 < off and off + s.piece_bytes <= r[1]]
        assert inside, (k, off)
    assert t.offset(4) == (10 ** 9 + 3_489_792) // 4096 * 4096


def test_min_slots_is_one_more_than_the_most_lanes():
    assert min_slots((1, 2, 16)) == 17


def test_gguf_expert_layout(tmp_path):
    p = tmp_path / "m.gguf"
    comp = write_moe_gguf(p, layers=2, experts=4)
    path, lay, notes = model_layout(one_file(str(p), GGUF))
    assert path == str(p) and lay is not None and notes == [f"decode: the model's {comp:,} B components from 6 expert tensors"]
    assert lay.component_bytes == comp
    assert lay.experts == 4
    assert len(lay.regions) == 6
    size = p.stat().st_size
    for a, b in lay.regions:
        assert b - a == 4 * comp and 0 < a < b <= size
        with open(p, "rb") as f:        # the region is the tensor's data: F32 ones
            f.seek(a)
            assert np.frombuffer(f.read(16), dtype=np.float32).tolist() == [1.0] * 4


def test_layout_of_non_gguf_and_broken_gguf(tmp_path):
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"\0" * 8192)
    assert model_layout(one_file(str(plain), RAW)) == (str(plain), None, [])        # raw bytes: read whole, quietly
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\xff" * 100)
    path, lay, notes = model_layout(one_file(str(broken), GGUF))    # a model file that cannot be read: said
    assert (path, lay) == (str(broken), None) and len(notes) == 1 and "decode uses 6,635,520 B components" in notes[0]


def test_the_presets_read_sizes_are_asked_of_the_engine_for_the_models_component():
    from engines.pattern import ReadShapes
    from iobench.shapes import engine_shapes

    assert engine_shapes() == ReadShapes(PREFILL_CHUNK, COMPONENT_BYTES)        # no header at hand: the engine's model
    assert engine_shapes(557_056) == ReadShapes(PREFILL_CHUNK, 557_056)
    assert engine_shapes(48 * MiB) == ReadShapes(48 * MiB, 48 * MiB)            # a chunk stages at least one component
