"""An iobench result: per-drive ceilings by preset, grouped and together runs, drive models.

JSON shape (schema 2), written to rig/bench/<timestamp>.json by `iobench run`:

    {"schema": 2, "kind": "iobench", "created": "2026-11-29T19:00:00Z", "host": "...",
     "settings": {"seconds": 1.0, "repeat": 3, "presets": [...], "lanes": {...}, "weights": [...],
                  "decode_weights": [...], "component_bytes": 6635520, ...},
     "drives": [{"name": "internal", "path": "/abs/internal/model.gguf", "size": N, "cold": "o_direct",
                 "drive": {"mount_point": ..., "fs_type": ..., "device": ..., "disk": ..., "key": ...},
                 "queue": QUEUE | null,
                 "presets": {"seq": PRESET, "prefill": PRESET, "decode": PRESET},
                 "model": {"lat_s": ..., "stream_bw": ..., "bw_max": ..., "iops_max": ..., ...},
                 "notes": [...]}],
     "groups":   [GROUP, ...],      # one per --group and preset
     "together": [GROUP, ...],      # all drives at once, one per preset
     "topology": TOPOLOGY | null,   # what the drives share, read from the OS before measuring
     "wall_s": 42.0}

    PRESET = {"preset": "prefill", "piece_bytes": N, "bw_bytes": B/s, "iops": N/s,
              "lat_ns": {"p50", "p95", "p99", "mean"}, "best_lanes": L, "knee_lanes": L,
              "spread_pct": %, "runs_bw": [...], "trials_bw": [...], "trials_spread_pct": %,
              "suspect_cache": bool, "notes": [...], "lanes": [LANE, ...]}
    LANE   = {"lanes": L, "bw_bytes", "iops", "lat_ns", "requests", "runs_bw", "spread_pct",
              "trials_bw", "trials_spread_pct", "suspect_cache"}
    GROUP  = {"name", "preset", "drives": [...], "bw_bytes" (sum over members in the shared windows),
              "runs_bw", "spread_pct", "trials_bw", "trials_spread_pct", "suspect_cache",
              "members": [{"name", "lanes", "piece_bytes", "bw_bytes", "iops", "lat_ns"}]}
    QUEUE  = {"source": "sysfs" | "ioreg" | "unknown", "device", "max_sectors_kb", "max_hw_sectors_kb",
              "max_segments", "max_segment_size", "logical_block_size", "physical_block_size",
              "optimal_io_size", "minimum_io_size", "rotational", "nr_requests", "request_bytes",
              "buffers_contiguous", "unit"}
              (request_bytes: the cut over scattered 4 KiB pages; buffers_contiguous: iobench's
              buffers lay in huge pages; unit: the cut its reads got, `iounit.QueueLimits.unit`)
    TOPOLOGY = {"source": "sysfs" | "diskutil" | "none",
                "drives": [{"name", "device", "note", "links": [{"kind", "id", "name"}, ...]}],
                "groups": [{"name", "drives", "reason", "shares": [{"link", "drives"}]}]}
              (`core.topology.topology_to_dict`; the groups measured for it are named in
              settings.topology_groups)

Rates are bytes/s (shown as decimal GB/s), latencies ns. A preset's headline numbers are those of
its best lane count; `knee_lanes` is the lowest lane count within 5 % of that best. A lane count
measured in several restarted trials has the median trial's rate; `trials_bw` holds each trial's
rate (the median of its windows), `runs_bw` every window of every trial.

Schema 1 (before queue limits and restarted trials) still loads: no queue, one trial per lane
count (`trials_bw` empty), and a drive model that prices reads smoothly (`drivemodel.py`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from core.constants import BENCH_DIR
from core.errors import MissingError, RigError
from core.jsonfile import read_json, write_json
from core.rig import Rig
from core.drives import DriveInfo
from core.topology import Topology, topology_from_dict, topology_to_dict

from .constants import READ_RESULT_SCHEMAS, RESULT_KIND, RESULT_SCHEMA
from .iounit import QueueLimits, limits_from_dict, limits_to_dict
from .drivemodel import DriveModel, model_from_dict, model_to_dict


@dataclass(frozen=True)
class Latency:
    p50: int = 0       # ns
    p95: int = 0
    p99: int = 0
    mean: int = 0


@dataclass(frozen=True)
class LaneResult:
    lanes: int                   # requests kept in flight on the drive
    bw_bytes: float              # bytes/s, median over the windows
    iops: float                  # requests/s
    lat_ns: Latency
    requests: int                # requests completed over all repeats
    runs_bw: tuple[float, ...] = ()   # bytes/s of each window of each trial
    spread_pct: float = 0.0      # (max - min) / median of runs_bw, %
    suspect_cache: bool = False
    trials_bw: tuple[float, ...] = ()  # bytes/s of each restarted trial (its median window)
    trials_spread_pct: float = 0.0     # (max - min) / median of trials_bw, %


@dataclass(frozen=True)
class PresetResult:
    preset: str                  # 'seq', 'prefill' or 'decode'
    piece_bytes: int             # bytes per request on this drive
    bw_bytes: float              # bytes/s at best_lanes (the ceiling)
    iops: float                  # requests/s at best_lanes
    lat_ns: Latency              # at best_lanes
    lanes: tuple[LaneResult, ...]
    best_lanes: int
    knee_lanes: int              # lowest lane count within 5 % of the best
    spread_pct: float            # over repeats at best_lanes, %
    runs_bw: tuple[float, ...] = ()
    suspect_cache: bool = False  # the page cache may have answered: not a ceiling
    notes: tuple[str, ...] = ()
    trials_bw: tuple[float, ...] = ()   # at best_lanes: bytes/s of each restarted trial
    trials_spread_pct: float = 0.0      # at best_lanes, %

    def lane(self, n: int) -> LaneResult:
        for x in self.lanes:
            if x.lanes == n:
                return x
        raise KeyError(n)


@dataclass(frozen=True)
class DriveResult:
    name: str
    path: str
    size: int                    # bytes of the file read
    cold: str                    # 'o_direct', 'f_nocache' or 'fadvise' (not cold: flagged)
    drive: DriveInfo
    presets: dict = field(default_factory=dict)      # preset name -> PresetResult
    model: DriveModel | None = None
    notes: tuple[str, ...] = ()  # how it was measured (meter, component source) and warnings
    queue: QueueLimits | None = None   # the device's queue limits (None: a schema-1 result)


@dataclass(frozen=True)
class MemberResult:
    name: str
    lanes: int
    piece_bytes: int
    bw_bytes: float              # bytes/s, median over the windows
    iops: float
    lat_ns: Latency


@dataclass(frozen=True)
class GroupResult:
    name: str                    # the --group name, or 'together'
    preset: str
    drives: tuple[str, ...]
    bw_bytes: float              # bytes/s of all members in each shared window, median over windows
    members: tuple[MemberResult, ...]
    runs_bw: tuple[float, ...] = ()
    spread_pct: float = 0.0
    suspect_cache: bool = False
    trials_bw: tuple[float, ...] = ()   # group bytes/s of each restarted trial
    trials_spread_pct: float = 0.0


@dataclass(frozen=True)
class BenchResult:
    created: str                 # ISO 8601 UTC
    drives: tuple[DriveResult, ...]
    groups: tuple[GroupResult, ...] = ()
    together: tuple[GroupResult, ...] = ()
    settings: dict = field(default_factory=dict)
    host: str = ""
    wall_s: float = 0.0
    schema: int = RESULT_SCHEMA
    topology: Topology | None = None   # what the drives share, from the OS (None: not read)

    KIND: ClassVar[str] = RESULT_KIND     # a result (core.results): --json prints the file's shape
    SCHEMA: ClassVar[int] = RESULT_SCHEMA

    def to_dict(self) -> dict:
        return result_to_dict(self)

    def drive(self, name: str) -> DriveResult:
        for d in self.drives:
            if d.name == name:
                return d
        raise KeyError(name)

    def models(self) -> dict:
        """Drive name -> fitted DriveModel (drives without a model are left out)."""
        return {d.name: d.model for d in self.drives if d.model is not None}


# ---- dict <-> dataclass ----------------------------------------------------------------------

def _lat_to(x: Latency) -> dict:
    return {"p50": x.p50, "p95": x.p95, "p99": x.p99, "mean": x.mean}


def _lane_to(x: LaneResult) -> dict:
    return {"lanes": x.lanes, "bw_bytes": x.bw_bytes, "iops": x.iops, "lat_ns": _lat_to(x.lat_ns),
            "requests": x.requests, "runs_bw": list(x.runs_bw), "spread_pct": x.spread_pct,
            "trials_bw": list(x.trials_bw), "trials_spread_pct": x.trials_spread_pct, "suspect_cache": x.suspect_cache}


def _preset_to(p: PresetResult) -> dict:
    return {"preset": p.preset, "piece_bytes": p.piece_bytes, "bw_bytes": p.bw_bytes, "iops": p.iops,
            "lat_ns": _lat_to(p.lat_ns), "best_lanes": p.best_lanes, "knee_lanes": p.knee_lanes,
            "spread_pct": p.spread_pct, "runs_bw": list(p.runs_bw), "trials_bw": list(p.trials_bw),
            "trials_spread_pct": p.trials_spread_pct, "suspect_cache": p.suspect_cache,
            "notes": list(p.notes), "lanes": [_lane_to(x) for x in p.lanes]}


def _group_to(g: GroupResult) -> dict:
    return {"name": g.name, "preset": g.preset, "drives": list(g.drives), "bw_bytes": g.bw_bytes,
            "runs_bw": list(g.runs_bw), "spread_pct": g.spread_pct, "trials_bw": list(g.trials_bw),
            "trials_spread_pct": g.trials_spread_pct, "suspect_cache": g.suspect_cache,
            "members": [{"name": m.name, "lanes": m.lanes, "piece_bytes": m.piece_bytes, "bw_bytes": m.bw_bytes,
                         "iops": m.iops, "lat_ns": _lat_to(m.lat_ns)} for m in g.members]}


def result_to_dict(r: BenchResult) -> dict:
    return {
        "schema": r.schema,
        "kind": RESULT_KIND,
        "created": r.created,
        "host": r.host,
        "settings": r.settings,
        "drives": [{"name": d.name, "path": d.path, "size": d.size, "cold": d.cold,
                    "drive": asdict(d.drive),
                    "queue": limits_to_dict(d.queue) if d.queue is not None else None,
                    "presets": {k: _preset_to(p) for k, p in d.presets.items()},
                    "model": model_to_dict(d.model) if d.model is not None else None,
                    "notes": list(d.notes)}
                   for d in r.drives],
        "groups": [_group_to(g) for g in r.groups],
        "together": [_group_to(g) for g in r.together],
        "topology": topology_to_dict(r.topology) if r.topology is not None else None,
        "wall_s": r.wall_s,
    }


def _lat_from(d: dict) -> Latency:
    return Latency(int(d["p50"]), int(d["p95"]), int(d["p99"]), int(d.get("mean", 0)))


def _lane_from(d: dict) -> LaneResult:
    return LaneResult(lanes=int(d["lanes"]), bw_bytes=float(d["bw_bytes"]), iops=float(d["iops"]),
                      lat_ns=_lat_from(d["lat_ns"]), requests=int(d["requests"]),
                      runs_bw=tuple(float(v) for v in d.get("runs_bw", ())),
                      spread_pct=float(d.get("spread_pct", 0.0)), suspect_cache=bool(d.get("suspect_cache", False)),
                      **_trials_from(d))


def _trials_from(d: dict) -> dict:
    return {"trials_bw": tuple(float(v) for v in d.get("trials_bw", ())),
            "trials_spread_pct": float(d.get("trials_spread_pct", 0.0))}


def _preset_from(d: dict) -> PresetResult:
    return PresetResult(preset=str(d["preset"]), piece_bytes=int(d["piece_bytes"]), bw_bytes=float(d["bw_bytes"]),
                        iops=float(d["iops"]), lat_ns=_lat_from(d["lat_ns"]),
                        lanes=tuple(_lane_from(x) for x in d["lanes"]), best_lanes=int(d["best_lanes"]),
                        knee_lanes=int(d["knee_lanes"]), spread_pct=float(d["spread_pct"]),
                        runs_bw=tuple(float(v) for v in d.get("runs_bw", ())),
                        suspect_cache=bool(d.get("suspect_cache", False)), notes=tuple(d.get("notes", ())),
                        **_trials_from(d))


def _group_from(d: dict) -> GroupResult:
    return GroupResult(name=str(d["name"]), preset=str(d["preset"]), drives=tuple(d["drives"]),
                       bw_bytes=float(d["bw_bytes"]),
                       members=tuple(MemberResult(name=m["name"], lanes=int(m["lanes"]), piece_bytes=int(m["piece_bytes"]),
                                                  bw_bytes=float(m["bw_bytes"]), iops=float(m["iops"]),
                                                  lat_ns=_lat_from(m["lat_ns"])) for m in d["members"]),
                       runs_bw=tuple(float(v) for v in d.get("runs_bw", ())),
                       spread_pct=float(d.get("spread_pct", 0.0)), suspect_cache=bool(d.get("suspect_cache", False)),
                       **_trials_from(d))


def result_from_dict(d: dict, where: str = "result") -> BenchResult:
    """Load a result dict; anything malformed is a RigError naming `where` and the key."""
    if not isinstance(d, dict) or d.get("kind") != RESULT_KIND:
        raise RigError(f"{where}: not an iobench result (no \"kind\": \"{RESULT_KIND}\"); give a file written by `iobench run`")
    if isinstance(d.get("schema"), bool) or d.get("schema") not in READ_RESULT_SCHEMAS:
        raise RigError(f"{where}: key 'schema' is {d.get('schema')!r}, this version reads "
                       f"{' or '.join(map(str, READ_RESULT_SCHEMAS))}; re-run `iobench run`")
    key = "drives"
    try:
        drives = []
        for i, x in enumerate(d["drives"]):
            key = f"drives[{i}]"
            drives.append(DriveResult(name=str(x["name"]), path=str(x["path"]), size=int(x["size"]),
                                      cold=str(x["cold"]), drive=DriveInfo(**x["drive"]),
                                      presets={k: _preset_from(p) for k, p in x["presets"].items()},
                                      model=model_from_dict(x["model"]) if x.get("model") else None,
                                      notes=tuple(x.get("notes", ())),
                                      queue=limits_from_dict(x["queue"]) if x.get("queue") else None))
        key = "groups"
        groups = tuple(_group_from(g) for g in d.get("groups", ()))
        key = "together"
        together = tuple(_group_from(g) for g in d.get("together", ()))
        key = "topology"
        topology = topology_from_dict(d["topology"]) if d.get("topology") else None
        key = "settings"
        return BenchResult(created=str(d.get("created", "")), drives=tuple(drives), groups=groups, together=together,
                           settings=dict(d.get("settings") or {}), host=str(d.get("host", "")),
                           wall_s=float(d.get("wall_s", 0.0)), topology=topology)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RigError(f"{where}: key '{key}' is malformed ({type(e).__name__}: {e}); re-run `iobench run`") from None


# What to do about a bad or missing result file, said the same way by every message.
_REMEDY = f"run `iobench run` or give a result file from rig/{BENCH_DIR}/"


def load_result(path: str) -> BenchResult:
    """A result file: missing is MissingError (exit 3); anything else wrong is RigError (exit 2)."""
    doc = read_json(path, RESULT_KIND, _REMEDY, schema=READ_RESULT_SCHEMAS, what="iobench result")
    return result_from_dict(doc, path)


def result_files(rig: Rig) -> list[str]:
    """Result files in rig/bench, oldest first."""
    return rig.timestamped_files(BENCH_DIR)


def result_name(created: str) -> str:
    """'2026-11-29T19:00:00.123Z' -> '20261129T190000.123Z.json': fixed width, so sorts by time."""
    return created.replace("-", "").replace(":", "") + ".json"


def save_result(rig: Rig, r: BenchResult, folder: str = "") -> str:
    """Write rig/bench/<timestamp>.json atomically (rig/bench/FOLDER/... with `folder`: a
    measurement that is not of the rig's members, such as a scratch file's); returns its path."""
    d = rig.subdir(os.path.join(BENCH_DIR, folder) if folder else BENCH_DIR)
    return write_json(os.path.join(d, result_name(r.created)), result_to_dict(r))


def resolve_result_path(ref: str, rig: Rig) -> str:
    """A result as users name it, the same as a plan: a file, 'latest', or its name in rig/bench."""
    return rig.resolve(ref, BENCH_DIR, "iobench result", f"run `iobench run --rig {rig.root}` first")


def latest_result(rig: Rig) -> BenchResult:
    """The newest result in rig/bench; MissingError (exit 3, like a missing plan) when there is none."""
    files = result_files(rig)
    if not files:
        raise MissingError(f"no iobench results in {rig.bench_dir}: run `iobench run --rig {rig.root}` first")
    return load_result(files[-1])
