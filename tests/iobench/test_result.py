"""The result file: schema 1, keys pinned, round trip, loading and finding the newest."""

import json
import os

import pytest

from core.errors import MissingError, RigError
from core.rig import Rig
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
from replicas.drives import DriveInfo


def sample_result(created="2026-11-29T19:00:00.123Z", bw=1e8) -> BenchResult:
    lat = Latency(p50=1_000_000, p95=2_000_000, p99=3_000_000, mean=1_200_000)
    lanes = tuple(LaneResult(lanes=n, bw_bytes=bw * min(n, 4) / 4, iops=bw / (1 << 20), lat_ns=lat, requests=10 * n,
                             runs_bw=(bw, bw * 1.01), spread_pct=1.0) for n in (1, 2, 4, 8))
    pre = PresetResult(preset="prefill", piece_bytes=16 << 20, bw_bytes=bw, iops=6.0, lat_ns=lat, lanes=lanes,
                       best_lanes=4, knee_lanes=4, spread_pct=1.0, runs_bw=(bw, bw * 1.01), notes=("n",))
    drive = DriveResult(name="fast", path="/mnt/fast/model.gguf", size=10 ** 9, cold="o_direct",
                        drive=DriveInfo("/mnt/fast", "ext4", "/dev/loop0", "loop0", "disk:loop0"),
                        presets={"prefill": pre}, model=DriveModel(1e-4, bw, bw, fit_err_pct=1.2, samples=4),
                        notes=("rates from the device's own counter",))
    other = DriveResult(name="slow", path="/mnt/slow/model.gguf", size=10 ** 9, cold="fadvise",
                        drive=DriveInfo("/mnt/slow", "tmpfs", "", "", "dev:0:50"), presets={}, model=None)
    member = MemberResult(name="fast", lanes=4, piece_bytes=16 << 20, bw_bytes=bw, iops=6.0, lat_ns=lat)
    g = GroupResult(name="hub", preset="prefill", drives=("fast",), bw_bytes=bw, members=(member,), runs_bw=(bw,))
    return BenchResult(created=created, drives=(drive, other), groups=(g,), together=(g,), settings={"seconds": 0.5},
                       host="h", wall_s=12.5)


def test_round_trip_through_json():
    r = sample_result()
    d = json.loads(json.dumps(result_to_dict(r)))
    assert result_from_dict(d) == r


def test_keys_are_pinned():
    d = result_to_dict(sample_result())
    assert set(d) == {"schema", "kind", "created", "host", "settings", "drives", "groups", "together", "wall_s"}
    assert d["schema"] == 1 and d["kind"] == "iobench"
    drive = d["drives"][0]
    assert set(drive) == {"name", "path", "size", "cold", "drive", "presets", "model", "notes"}
    p = drive["presets"]["prefill"]
    assert set(p) == {"preset", "piece_bytes", "bw_bytes", "iops", "lat_ns", "best_lanes", "knee_lanes", "spread_pct",
                      "runs_bw", "suspect_cache", "notes", "lanes"}
    assert set(p["lat_ns"]) == {"p50", "p95", "p99", "mean"}
    assert set(p["lanes"][0]) == {"lanes", "bw_bytes", "iops", "lat_ns", "requests", "runs_bw", "spread_pct", "suspect_cache"}
    assert set(d["groups"][0]) == {"name", "preset", "drives", "bw_bytes", "runs_bw", "spread_pct", "suspect_cache", "members"}
    assert set(d["groups"][0]["members"][0]) == {"name", "lanes", "piece_bytes", "bw_bytes", "iops", "lat_ns"}
    assert {"lat_s", "stream_bw", "bw_max", "iops_max", "io_unit", "fit_err_pct"} <= set(drive["model"])
    assert d["drives"][1]["model"] is None


def test_malformed_results_name_the_problem(tmp_path):
    d = result_to_dict(sample_result())
    with pytest.raises(RigError, match="not an iobench result"):
        result_from_dict({**d, "kind": "plan"})
    with pytest.raises(RigError, match="schema"):
        result_from_dict({**d, "schema": 2})
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
