"""iobench's decode shape reads the rig's model's component (models.geometry, as the planner
does) in the file of each member that holds its experts."""

import os
import shutil

from core.rig import Member, Rig
from iobench.bench import targets_from_rig
from iobench.schedule import shape_for
from models.modelset import discover
from tests.helpers import write_random
from tests.models.geometry_helpers import write_header_only, write_moe_split_gguf


def _rig(tmp_path, primary, copies):
    m = discover(str(primary))
    return Rig(root=str(tmp_path / "rig"), model=Member(m.path, "a", "primary"),
               replicas=tuple(Member(str(c), n, "replica") for c, n in zip(copies, ("b", "c"))),
               layout=m.layout, format=m.format, files=m.files)


def test_a_split_set_is_read_where_its_largest_components_are(tmp_path):
    paths = write_moe_split_gguf(tmp_path / "a", "m", layers=3, per_part=4)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    g_targets = targets_from_rig(_rig(tmp_path, paths[0], [tmp_path / "b" / paths[0].name]))
    a, b = g_targets
    assert a.component_bytes == b.component_bytes == 64 * 32 * 4        # down (F32), larger than gate/up (F16)
    assert a.path in {str(p) for p in paths}                            # a file of the set, the same on both drives
    assert b.path == str(tmp_path / "b" / os.path.basename(a.path)) and a.regions == b.regions and a.regions
    assert all(end - start == 4 * 8192 for start, end in a.regions)     # whole down tensors of 4 experts
    assert "the model's 8,192 B components" in " ".join(a.notes)
    shape = shape_for(a, "decode", 0, None, (1,))
    assert shape.step == 8192 and shape.regions == a.regions


def test_a_single_gguf_reads_its_own_component_and_raw_bytes_keep_the_default(tmp_path):
    (tmp_path / "d").mkdir()
    small = tmp_path / "d" / "small.gguf"
    write_header_only(small, layers=2, experts=4, top_k=2, ne0=1024, ne1=512, qtype="Q8_0")
    (tmp_path / "e").mkdir()
    other = tmp_path / "e" / "other-name.gguf"              # a replica may keep the file under another name
    shutil.copyfile(small, other)
    t, r = targets_from_rig(_rig(tmp_path, small, [other]))
    assert t.component_bytes == r.component_bytes == 557_056 and len(t.regions) == 6 and t.regions == r.regions
    assert (t.path, r.path) == (str(small), str(other))
    raw = tmp_path / "raw.bin"
    write_random(raw, 1 << 20)
    rig = Rig(root=str(tmp_path / "rig2"), model=Member(str(raw), "a", "primary"))
    [t] = targets_from_rig(rig)
    assert t.layout is None and t.component_bytes == 6_635_520
