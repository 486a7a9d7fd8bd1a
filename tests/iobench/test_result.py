"""The result file: schema 2, keys pinned, round trip, schema 1 still loading, finding the newest."""

import json
import os

import pytest

from core.errors import MissingError, RigError
from core.rig import Rig
from core.topology import DISK, DriveTopology, Link, Topology, group_drives
from iobench.iounit import QueueLimits
from iobench.model import DriveModel
from iobench.result import (
    BenchResult,
    DriveResult,
    GroupResult,
    LaneResult,
    Latency,
    MemberResult,
    PresetResult,
    latest_result,
    load_result,
    result_from_dict,
    result_name,
    result_to_dict,
    save_result,
)
from core.drives import DriveInfo


def sample_result(created="2026-11-29T19:00:00.123Z", bw=1e8) -> BenchResult:
    lat = Latency(p50=1_000_000, p95=2_000_000, p99=3_000_000, mean=1_200_000)
    lanes = tuple(LaneResult(lanes=n, bw_bytes=bw * min(n, 4) / 4, iops=bw / (1 << 20), lat_ns=lat, requests=10 * n,
                             runs_bw=(bw, bw * 1.01), spread_pct=1.0, trials_bw=(bw, bw * 0.98, bw * 1.02),
                             trials_spread_pct=4.0) for n in (1, 2, 4, 8))
    pre = PresetResult(preset="prefill", piece_bytes=16 << 20, bw_bytes=bw, iops=6.0, lat_ns=lat, lanes=lanes,
                       best_lanes=4, knee_lanes=4, spread_pct=1.0, runs_bw=(bw, bw * 1.01), notes=("n",),
                       trials_bw=(bw, bw * 0.98, bw * 1.02), trials_spread_pct=4.0)
    queue = QueueLimits(source="sysfs", device="loop0", max_sectors_kb=1280, max_hw_sectors_kb=1280, max_segments=128,
                        max_segment_size=65536, logical_block_size=512, physical_block_size=512, optimal_io_size=0,
                        minimum_io_size=512, rotational=False, nr_requests=128)
    drive = DriveResult(name="fast", path="/mnt/fast/model.gguf", size=10 ** 9, cold="o_direct",
                        drive=DriveInfo("/mnt/fast", "ext4", "/dev/loop0", "loop0", "uuid:6e8d422a", devno="7:0",
                                        fs_uuid="6e8d422a", serial="S4EW", wwn="eui.0025"),
                        presets={"prefill": pre}, model=DriveModel(1e-4, bw, bw, fit_err_pct=1.2, samples=4),
                        notes=("rates from the device's own counter",), queue=queue)
    other = DriveResult(name="slow", path="/mnt/slow/model.gguf", size=10 ** 9, cold="fadvise",
                        drive=DriveInfo("/mnt/slow", "tmpfs", "", "", "dev:0:50"), presets={}, model=None,
                        queue=QueueLimits(source="unknown"))
    member = MemberResult(name="fast", lanes=4, piece_bytes=16 << 20, bw_bytes=bw, iops=6.0, lat_ns=lat)
    g = GroupResult(name="hub", preset="prefill", drives=("fast",), bw_bytes=bw, members=(member,), runs_bw=(bw,),
                    trials_bw=(bw, bw), trials_spread_pct=0.0)
    links = (Link(DISK, "virtual/block/loop0", "loop0"), Link(DISK, "pci0000:00/0000:00:02.0/virtio1/block/vda", "vda"))
    drives = (DriveTopology("fast", "loop0", links), DriveTopology("slow", "", (), "no block device"),
              DriveTopology("third", "loop1", links[1:]))
    return BenchResult(created=created, drives=(drive, other), groups=(g,), together=(g,), settings={"seconds": 0.5},
                       host="h", wall_s=12.5, topology=Topology("sysfs", drives, group_drives(drives)))


def test_round_trip_through_json():
    r = sample_result()
    d = json.loads(json.dumps(result_to_dict(r)))
    assert result_from_dict(d) == r


def test_keys_are_pinned():
    d = result_to_dict(sample_result())
    assert set(d) == {"schema", "kind", "created", "host", "settings", "drives", "groups", "together", "topology", "wall_s"}
    assert d["schema"] == 2 and d["kind"] == "iobench"
    drive = d["drives"][0]
    assert set(drive) == {"name", "path", "size", "cold", "drive", "queue", "presets", "model", "notes"}
    assert set(drive["drive"]) == {"mount_point", "fs_type", "device", "disk", "key", "xattrs",
                                   "devno", "fs_uuid", "serial", "wwn"}
    assert set(d["topology"]) == {"source", "drives", "groups"}
    assert d["topology"]["groups"][0]["drives"] == ["fast", "third"] and d["topology"]["groups"][0]["reason"] == "disk vda"
    assert set(drive["queue"]) == {"source", "device", "max_sectors_kb", "max_hw_sectors_kb", "max_segments",
                                   "max_segment_size", "logical_block_size", "physical_block_size", "optimal_io_size",
                                   "minimum_io_size", "rotational", "nr_requests", "request_bytes",
                                   "buffers_contiguous", "unit"}
    assert drive["queue"]["request_bytes"] == 128 * 4096         # 128 scattered pages, under 1280 KiB
    assert d["drives"][1]["queue"]["source"] == "unknown" and d["drives"][1]["queue"]["request_bytes"] is None
    p = drive["presets"]["prefill"]
    assert set(p) == {"preset", "piece_bytes", "bw_bytes", "iops", "lat_ns", "best_lanes", "knee_lanes", "spread_pct",
                      "runs_bw", "trials_bw", "trials_spread_pct", "suspect_cache", "notes", "lanes"}
    assert set(p["lat_ns"]) == {"p50", "p95", "p99", "mean"}
    assert set(p["lanes"][0]) == {"lanes", "bw_bytes", "iops", "lat_ns", "requests", "runs_bw", "spread_pct", "trials_bw",
                                  "trials_spread_pct", "suspect_cache"}
    assert set(d["groups"][0]) == {"name", "preset", "drives", "bw_bytes", "runs_bw", "spread_pct", "trials_bw",
                                   "trials_spread_pct", "suspect_cache", "members"}
    assert set(d["groups"][0]["members"][0]) == {"name", "lanes", "piece_bytes", "bw_bytes", "iops", "lat_ns"}
    assert {"lat_s", "stream_bw", "bw_max", "iops_max", "io_unit", "fit_err_pct", "staircase"} <= set(drive["model"])
    assert drive["model"]["schema"] == 2
    assert d["drives"][1]["model"] is None


def test_malformed_results_name_the_problem(tmp_path):
    d = result_to_dict(sample_result())
    with pytest.raises(RigError, match="not an iobench result"):
        result_from_dict({**d, "kind": "plan"})
    with pytest.raises(RigError, match="schema"):
        result_from_dict({**d, "schema": 3})
    bad_queue = json.loads(json.dumps(d))
    bad_queue["drives"][0]["queue"]["max_segments"] = "many"
    with pytest.raises(RigError, match=r"drives\[0\]"):
        result_from_dict(bad_queue)
    broken = json.loads(json.dumps(d))
    del broken["drives"][0]["presets"]["prefill"]["bw_bytes"]
    with pytest.raises(RigError, match=r"drives\[0\]"):
        result_from_dict(broken)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RigError, match="not valid JSON"):
        load_result(str(bad))
    with pytest.raises(MissingError, match="no such iobench result file"):
        load_result(str(tmp_path / "missing.json"))


def test_save_and_latest(tmp_path):
    rig = Rig(root=str(tmp_path / "rig"))
    with pytest.raises(MissingError, match="no iobench results"):
        latest_result(rig)
    older = save_result(rig, sample_result("2026-11-29T19:00:00.123Z", bw=1e8))
    newer = save_result(rig, sample_result("2026-11-29T19:00:01.001Z", bw=2e8))
    assert os.path.basename(older) == "20261129T190000.123Z.json"
    assert os.path.dirname(newer) == str(tmp_path / "rig" / "bench")
    assert latest_result(rig).drives[0].presets["prefill"].bw_bytes == 2e8
    assert load_result(older).drives[0].presets["prefill"].bw_bytes == 1e8


def test_result_names_sort_by_time():
    names = [result_name(c) for c in ("2026-11-29T09:59:59.999Z", "2026-11-29T10:00:00.000Z", "2027-01-01T00:00:00.000Z")]
    assert names == sorted(names)


def schema_1(d: dict) -> dict:
    """What `iobench run` wrote before queue limits and restarted trials (schema 1)."""
    old = json.loads(json.dumps(d))
    old["schema"] = 1
    for drive in old["drives"]:
        del drive["queue"]
        if drive["model"]:
            drive["model"]["schema"] = 1
            del drive["model"]["staircase"]
        for p in drive["presets"].values():
            for x in [p] + p["lanes"]:
                del x["trials_bw"], x["trials_spread_pct"]
    for g in old["groups"] + old["together"]:
        del g["trials_bw"], g["trials_spread_pct"]
    return old


def test_a_schema_1_result_still_loads(tmp_path):
    old = schema_1(result_to_dict(sample_result()))
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    r = load_result(str(path))
    fast = r.drive("fast")
    assert fast.queue is None and fast.presets["prefill"].bw_bytes == 1e8
    assert fast.presets["prefill"].trials_bw == () and fast.presets["prefill"].lane(4).trials_spread_pct == 0.0
    assert r.groups[0].trials_bw == ()
    # its model was fitted with a smooth operation count and keeps pricing reads that way
    assert fast.model.staircase is False and r.models()["fast"].lat_s == 1e-4
    assert result_to_dict(r)["schema"] == 2                 # written back, it is a schema-2 document
