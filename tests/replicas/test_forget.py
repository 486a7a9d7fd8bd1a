"""Members come and go: `replicas forget` and the warning when the rig holds more copies than the
engine reads."""

import json
import os
import shutil

import xattr

from core import rig as rigmod
from core.events import Notice
from engines.registry import DEFAULT_ENGINE, get_engine
from core import platform
from replicas.records import load_scrub, load_verdicts, record_scrub
from replicas.stamps import sidecar_path
from replicas.sync import sync
from replicas.verdict import ScrubMark
from tests.helpers import write_random
from tests.replicas.helpers import PIECE, MiB, invoke


def read(p):
    with open(p, "rb") as f:
        return f.read()


def test_forget_a_replica_by_path_keeps_its_file(synced):
    rig, data, paths = synced
    r = rigmod.load_rig(rig)
    record_scrub(r, {paths[2]: ScrubMark("x" * 32, (1, 2, 3, 4), 1)})
    st = os.stat(paths[2])
    tag = xattr.getxattr(paths[2], platform.stamp_xattr_name())
    res = invoke("forget", "--rig", rig, paths[2])
    assert res.exit_code == 0, res.output
    assert "forgot replica" in res.output
    after = rigmod.load_rig(rig)
    assert [m.path for m in after.members] == paths[:2]
    assert paths[2] not in load_verdicts(after) and paths[2] not in load_scrub(after)
    assert paths[0] in load_verdicts(after)                        # the others' records stay
    # The file, its times and its stamp attribute are exactly as they were.
    assert read(paths[2]) == data and os.stat(paths[2]).st_mtime_ns == st.st_mtime_ns
    assert xattr.getxattr(paths[2], platform.stamp_xattr_name()) == tag
    doc = json.loads(invoke("status", "--rig", rig, "--json").stdout)
    assert [m["path"] for m in doc["members"]] == paths[:2]


def test_forget_a_member_whose_drive_is_gone_by_its_name(synced, tmp_path):
    rig, data, paths = synced
    drive = os.path.dirname(paths[1])
    name = rigmod.load_rig(rig).member(paths[1]).name
    shutil.move(drive, tmp_path / "unplugged")                     # the drive is not there any more
    assert invoke("status", "--rig", rig, "--json").exit_code == 3         # a member missing, as verify says
    res = invoke("forget", "--rig", rig, name)
    assert res.exit_code == 0, res.output
    assert [m.path for m in rigmod.load_rig(rig).members] == [paths[0], paths[2]]
    assert not os.path.exists(drive)                               # nothing was created in its place
    assert invoke("verify", "--rig", rig).exit_code == 0           # the rig is whole without it


def test_forget_the_primary_only_when_alone_and_its_sidecar_goes(synced):
    rig, data, paths = synced
    r = rigmod.load_rig(rig)
    assert os.path.exists(sidecar_path(r, paths[0]))               # the primary's stamp lives in the rig
    res = invoke("forget", "--rig", rig, paths[0])
    assert res.exit_code == 2 and "forget its replicas first" in res.output
    assert len(res.output.strip().splitlines()) == 1
    for p in paths[1:]:
        assert invoke("forget", "--rig", rig, p).exit_code == 0
    assert invoke("forget", "--rig", rig, paths[0]).exit_code == 0
    r = rigmod.load_rig(rig)
    assert r.members == () and not os.path.exists(sidecar_path(r, paths[0]))
    assert read(paths[0]) == data


def test_forget_what_is_not_a_member(synced, tmp_path):
    rig, data, paths = synced
    res = invoke("forget", "--rig", rig, str(tmp_path / "elsewhere.gguf"))
    assert res.exit_code == 2 and "is not a member" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert invoke("forget", "--rig", str(tmp_path / "norig"), paths[0]).exit_code == 3     # no rig.toml: a rig file missing


def test_sync_warns_once_when_the_rig_holds_more_copies_than_the_engine_reads(tmp_path):
    engine = get_engine(DEFAULT_ENGINE)
    assert engine.max_sources == 3
    src = tmp_path / "internal" / "model.gguf"
    src.parent.mkdir()
    write_random(src, 2 * MiB + 3, seed=9)
    dests = []
    for name in ("green", "white", "blue"):
        (tmp_path / name).mkdir()
        dests.append(str(tmp_path / name))
    rig = str(tmp_path / "rig")
    events = []
    assert sync(str(src), dests[:2], rig, piece_size=PIECE, allow_same_device=True, report=events.append).exit_code == 0
    assert not [e for e in events if isinstance(e, Notice) and "reads at most" in e.message]
    # A third replica: four copies, ds4 reads three. Allowed, said once.
    res = invoke("sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device", src, *dests)
    assert res.exit_code == 0, res.output
    line = "the rig will hold 4 copies of the model; ds4-argodrive reads at most 3 (the primary and 2 replicas)"
    assert res.stderr.count(line) == 1, res.stderr
    assert len(rigmod.load_rig(rig).members) == 4
    # --quiet: no notices, only the result.
    res = invoke("sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device", "--quiet", src, *dests)
    assert res.exit_code == 0 and "reads at most" not in res.stderr
    assert "identical" in res.stdout


def test_the_copies_warning_asks_the_engine_that_reads_the_rigs_model(tmp_path):
    """A colibri model: colibri's limit (the primary and its mirrors) decides, not the default
    engine's; the warning names colibri."""
    from engine_bridge.moe.synth_colibri import ColibriSpec, synthesize_colibri
    from engines.registry import engine_for_model
    from models.modelset import discover

    primary = str(tmp_path / "internal" / "moe")
    os.makedirs(os.path.dirname(primary))
    synthesize_colibri(primary, ColibriSpec(layers=2, experts=4, top_k=2, dim=64, ff=64, vocab=300, shards=1, q_lora=64,
                                            kv_lora=64, seed=5))
    found = discover(primary)
    colibri = get_engine(engine_for_model(found.format, found.layout, found.files))
    assert colibri.name != DEFAULT_ENGINE and colibri.max_sources > get_engine(DEFAULT_ENGINE).max_sources
    dests = []
    for i in range(colibri.max_sources):
        (tmp_path / f"d{i}").mkdir()
        dests.append(str(tmp_path / f"d{i}"))
    rig = str(tmp_path / "rig")
    events = []
    # The primary and max_sources - 1 replicas: more than the default engine reads, within colibri's limit.
    assert sync(primary, dests[:-1], rig, piece_size=PIECE, allow_same_device=True, report=events.append).exit_code == 0
    assert not [e for e in events if isinstance(e, Notice) and "reads at most" in e.message], events
    events.clear()
    assert sync(primary, dests, rig, piece_size=PIECE, allow_same_device=True, report=events.append).exit_code == 0
    said = [e.message for e in events if isinstance(e, Notice) and "reads at most" in e.message]
    assert said == [f"the rig will hold {colibri.max_sources + 1} copies of the model; {colibri.name} reads at most "
                    f"{colibri.max_sources} (the primary and {colibri.max_sources - 1} replicas): allowed, and plans choose "
                    f"which to use"], events
