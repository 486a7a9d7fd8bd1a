"""Shared helpers for the planner tests: drive curves and an iobench result written to a rig."""

import os

from iobench.model import DriveModel
from iobench.result import BenchResult, DriveResult, save_result
from replicas.drives import DriveInfo
from replicas.rig import Member, Rig, save_rig

from planner.model import Drive

FAST = DriveModel(lat_s=100e-6, stream_bw=150e6, bw_max=200e6)
SLOW = DriveModel(lat_s=100e-6, stream_bw=80e6, bw_max=100e6)
# Same ceiling as SLOW, but one request streams slowly: bulk reads with 8 lanes reach the ceiling,
# three decode pieces in flight do not (a latency- or IOPS-bound enclosure).
LAGGY = DriveModel(lat_s=10e-3, stream_bw=30e6, bw_max=100e6)


def drives3():
    return (Drive("fast", FAST), Drive("slow", SLOW), Drive("laggy", LAGGY))


def make_rig(root, names=("fast", "slow", "laggy"), models=(FAST, SLOW, LAGGY), bench_names=None):
    """A rig.toml naming three files and an iobench result with a fitted model per drive."""
    os.makedirs(root, exist_ok=True)
    paths = [os.path.join(str(root), f"{n}.gguf") for n in names]
    rig = Rig(root=str(root), model=Member(paths[0], names[0], "primary"),
              replicas=tuple(Member(p, n, "replica") for p, n in zip(paths[1:], names[1:])))
    save_rig(rig)
    info = DriveInfo(mount_point="/", fs_type="ext4", device="/dev/x", disk="x", key="disk:x")
    result = BenchResult(created="2026-11-29T19:00:00.000Z",
                         drives=tuple(DriveResult(name=n, path=p, size=1 << 30, cold="o_direct", drive=info, model=m)
                                      for n, p, m in zip(bench_names or names, paths, models)))
    return rig, save_result(rig, result)
