"""Plan files and the planner's inputs (I/O): rig/plans/<timestamp>.json, drive models from a bench result.

`save_plan`, `load_plan`, `latest_plan` are what engine_bridge (export, run) and the tuner use;
`drives_for` turns a rig and an iobench result into the model's `Drive`s, primary first.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import ClassVar, Sequence

from core.constants import PLANS_DIR
from core.errors import MissingError, UsageError
from core.jsonfile import read_json, write_json
from core.rig import Rig, load_rig
from replicas.manifests import load_manifest

from .barrier import SharedLink, links_from, shape_from_latency
from .constants import PLAN_SCHEMAS, TAIL_LANES
from .drivecurves import Background, CorrectedCurve, Drive
from .plan import PLAN_KIND, PLAN_REMEDY, Plan, Source, plan_from_dict, plan_to_dict


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def plan_name(created: str) -> str:
    """'2026-11-29T19:00:00.123Z' -> '20261129T190000.123Z.json' (fixed width: sorts by time)."""
    return created.replace("-", "").replace(":", "") + ".json"


@dataclass(frozen=True)
class SavedPlan:
    """A plan a command wrote (`planner solve`, `engine-bridge autotune`): --json prints the plan
    file's document plus where it was written (`path`); `notices` are said on stderr."""

    plan: Plan
    path: str
    notices: tuple[str, ...] = ()

    KIND: ClassVar[str] = PLAN_KIND
    SCHEMA: ClassVar[int] = Plan.SCHEMA

    def to_dict(self) -> dict:
        return {**plan_to_dict(self.plan), "path": self.path}


def write_plan(path: str, plan: Plan) -> str:
    """Write a plan file at `path` atomically (stamping `created` if empty): the one way a plan is
    written (`save_plan` into the rig; a harness run's arm plans into its run folder). Returns the path."""
    if not plan.created:
        plan = replace(plan, created=utc_now())
    return write_json(path, plan_to_dict(plan))


def save_plan(rig: Rig, plan: Plan) -> str:
    """Write rig/plans/<timestamp>.json atomically (stamping `created` if empty); returns the path."""
    if not plan.created:
        plan = replace(plan, created=utc_now())
    return write_plan(os.path.join(rig.subdir(PLANS_DIR), plan_name(plan.created)), plan)


def load_plan(path: str) -> Plan:
    """Read a plan file: missing is MissingError (exit 3); anything else wrong is one RigError
    line (exit 2) naming the file."""
    return plan_from_dict(read_json(path, PLAN_KIND, PLAN_REMEDY, schema=PLAN_SCHEMAS), path)


def plan_files(rig: Rig) -> list[str]:
    """Plan files in rig/plans, oldest first."""
    return rig.timestamped_files(PLANS_DIR)


def latest_plan_path(rig: Rig) -> str:
    """The newest plan file in rig/plans; MissingError (exit 3) when there is none."""
    files = plan_files(rig)
    if not files:
        raise MissingError(f"no plans in {rig.plans_dir}: run `planner solve --rig {rig.root}` first")
    return files[-1]


def resolve_plan_path(ref: str, rig: Rig | None) -> str:
    """What users type after --plan or as `planner show PLAN`: a plan file, 'latest' (the newest
    in <rig>/plans), or a plan's name in <rig>/plans (with or without .json) (`Rig.resolve`).
    MissingError when nothing matches."""
    if os.path.lexists(ref) and ref != "latest":
        return os.path.abspath(ref)        # a file, or a path of another kind load_plan names
    if rig is None:
        raise MissingError(f"{ref}: no such plan file; give a plan file written by `planner solve`, or 'latest'")
    if ref == "latest":
        return latest_plan_path(rig)
    return rig.resolve(ref, PLANS_DIR, "plan", f"run `planner solve --rig {rig.root}` first")


def latest_plan(rig: Rig) -> Plan:
    """The newest plan in rig/plans; MissingError when there is none."""
    return load_plan(latest_plan_path(rig))


# ---- inputs: drive models for the rig's sources ----------------------------------------------

@dataclass(frozen=True)
class Inputs:
    sources: tuple[Source, ...]        # primary first
    drives: tuple[Drive, ...]          # the same order
    provenance: dict
    links: tuple[SharedLink, ...] = ()       # drives sharing an uplink (source indices), from grouped runs


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def measured_points(drive_result) -> tuple[tuple[int, int, float], ...]:
    """(piece bytes, lanes, bytes/s) of every lane count of every preset iobench trusted."""
    pts = []
    for p in drive_result.presets.values():
        if p.suspect_cache:
            continue
        pts.extend((int(p.piece_bytes), int(x.lanes), float(x.bw_bytes))
                   for x in p.lanes if x.bw_bytes > 0 and not x.suspect_cache)
    return tuple(pts)


def latency_shape(drive_result, lanes: int = TAIL_LANES):
    """The shape of a drive's decode request times (iobench's decode preset, at the lane count
    nearest `lanes`); None when the drive has no trusted decode latencies."""
    p = drive_result.presets.get("decode")
    if p is None or p.suspect_cache:
        return None
    usable = [x for x in p.lanes if not x.suspect_cache and x.lat_ns.p50 > 0 and x.lat_ns.mean > 0]
    if not usable:
        return None
    x = min(usable, key=lambda x: (abs(x.lanes - lanes), x.lanes))
    shape = shape_from_latency(x.lat_ns.p50, x.lat_ns.p95, x.lat_ns.p99, x.lat_ns.mean)
    return shape if shape.spread else None


def shared_links(result, names: list[str]) -> tuple[SharedLink, ...]:
    """The result's groups (and its all-together runs) that behave as one shared link, as
    `barrier.links_from` judges them; members are indices into `names` (result drive names, in
    the model's source order). A group naming a drive outside `names` is left out."""
    rows = []
    for g in tuple(result.groups) + tuple(result.together):
        if g.suspect_cache or not all(m in names for m in g.drives):
            continue
        try:
            alone = sum(result.drive(m).presets[g.preset].bw_bytes for m in g.drives)
        except KeyError:
            continue
        rows.append((g.name, [names.index(m) for m in g.drives], g.bw_bytes, alone))
    return links_from(rows)


def load_inputs(rig_root: str, bench: str | None = None, calibrate: bool = True, tails: bool = False,
                rig: Rig | None = None) -> Inputs:
    """The rig's members (primary first) with the fitted drive models of an iobench result
    (`bench`, else the newest in rig/bench). Without a rig.toml the bench result's drive order
    is used, first = primary. A replica the result does not cover is left out (provenance
    `left_out`, said by the commands), the primary is a UsageError. With
    `calibrate`, each fitted curve is corrected by the drive's own measurements near the asked
    shape (`CorrectedCurve`); without it the fitted model speaks alone. With `tails`, each drive
    carries its measured decode latency shape and the decode barrier is priced as the expected
    maximum of independent draws (planner.barrier); off by default, because on throttled drives
    (blk-throttle's time slices make every drive's delays bursty, not independent per request)
    it under-predicted decode by up to 50 % and chose a split 50 % slower (docs/planner.md).
    `rig`: the rig already loaded from `rig_root` (rig.toml is then not read again)."""
    from iobench.result import latest_result, load_result, resolve_result_path, result_files

    rig = rig if rig is not None else load_rig(rig_root, must_exist=False)
    if bench:
        bench_path = resolve_result_path(bench, rig)
        result = load_result(bench_path)
    else:
        result = latest_result(rig)
        bench_path = result_files(rig)[-1]
    by_name = {d.name: d for d in result.drives}
    by_path = {os.path.realpath(d.path): d for d in result.drives}
    members = rig.members
    left_out = []
    if members:
        picked = []
        for m in members:
            d = by_name.get(m.name) or by_path.get(os.path.realpath(m.path))
            if d is None and m.role == "primary":
                raise UsageError(f"drive '{m.name}' ({m.path}) of the rig is not in the bench result {bench_path} "
                                 f"(it has {', '.join(by_name) or 'no drives'}); run `iobench run --rig {rig.root}` again")
            if d is None:     # a replica synced after the bench: the plan goes on without it, and says how to add it
                left_out.append({"name": m.name, "path": m.path,
                                 "why": f"replica '{m.name}' is not in the bench result {bench_path}: left out of this plan; "
                                        f"`iobench run --rig {rig.root}` measures it"})
                continue
            picked.append((m.name, m.path, d))
    else:
        picked = [(d.name, d.path, d) for d in result.drives]
    if not picked:
        raise UsageError(f"{bench_path}: no drives in the bench result; run `iobench run`")
    drives = []
    for name, _, d in picked:
        if d.model is None:
            raise UsageError(f"{bench_path}: drive '{d.name}' has no fitted model; re-run `iobench run` with the prefill and "
                             "decode presets")
        drives.append(Drive(name, CorrectedCurve(d.model, measured_points(d)) if calibrate else d.model,
                            latency_shape(d) if tails else None))
    links = shared_links(result, [d.name for _, _, d in picked])
    manifest = load_manifest(rig, required=False) if members else None
    provenance = {
        "bench": bench_path,
        "bench_created": result.created,
        "bench_sha256": file_sha256(bench_path),
        "rig": rig.root,
        "manifest": manifest.digest() if manifest is not None else None,
        "calibrated": calibrate,
        "tails": tails,
        "drive_models": {name: {"lat_s": d.model.lat_s, "stream_bw": d.model.stream_bw, "bw_max": d.model.bw_max,
                                "iops_max": d.model.iops_max, "fit_err_pct": d.model.fit_err_pct}
                         for name, _, d in picked},
        "links": [{"name": x.name, "drives": [picked[i][0] for i in x.members], "ceiling_Bps": x.ceiling_Bps} for x in links],
    }
    if left_out:
        provenance["left_out"] = left_out
    return Inputs(tuple(Source(n, p) for n, p, _ in picked), tuple(drives), provenance, links)


def parse_background(spec: str, names: list[str]) -> Background:
    """'primary:engram', 'NAME:engram', 'NAME:25%' (busy a quarter of the time) -> Background."""
    who, _, what = str(spec).partition(":")
    if not who or not what:
        raise UsageError(f"--background {spec!r}: use SOURCE:engram or SOURCE:PERCENT%, e.g. primary:engram")
    if who == "primary":
        idx = 0
    elif who in names:
        idx = names.index(who)
    else:
        raise UsageError(f"--background {spec!r}: unknown drive {who!r}; sources are primary, {', '.join(names)}")
    if what == "engram":
        return Background(idx, "engram")
    if what.endswith("%"):
        try:
            pct = float(what[:-1])
        except ValueError:
            pct = -1.0
        if not 0 <= pct < 100:
            raise UsageError(f"--background {spec!r}: the busy share must be 0..99%, e.g. {who}:20%")
        return Background(idx, "busy", pct / 100.0)
    raise UsageError(f"--background {spec!r}: unknown kind {what!r}; use engram or PERCENT%")


def holds_of(sources, files: Sequence[str]) -> tuple[frozenset[str] | None, ...]:
    """Per source (primary first): the model's files its copy holds (None when it holds them
    all, as a full replica does). `files`: the model's files, relative to its root. Asked on disk:
    an engine that reads a mirror's shards by name (colibri) reads what is there."""
    out = []
    for s in sources:
        root = s.path if os.path.isdir(s.path) else os.path.dirname(s.path)
        have = frozenset(f for f in files if os.path.isfile(os.path.join(root, f)))
        out.append(None if len(have) == len(files) else have)
    return tuple(out)


def full_members_for(inputs: Inputs, engine) -> tuple[Inputs, tuple[dict, ...]]:
    """The inputs an engine can use: an engine that cannot read a partial replica
    (`Engine.partial_refusal`) gets the rig's full members only. Returns (inputs, the members left
    out, each {name, path, why}); the drive links are re-indexed over the sources kept."""
    if not engine.partial_refusal:
        return inputs, ()
    rig = load_rig(inputs.provenance.get("rig") or ".", must_exist=False)
    partial = {os.path.realpath(m.path): m for m in rig.replicas if m.partial}
    keep, out = [], []
    for i, s in enumerate(inputs.sources):
        m = partial.get(os.path.realpath(s.path)) if i else None
        if m is None:
            keep.append(i)
        else:
            n = len(rig.files) or "?"
            out.append({"name": s.name, "path": s.path,
                        "why": f"replica '{s.name}' holds {len(m.holds)} of the model's {n} files; {engine.partial_refusal}: "
                               "left out of this plan (`replicas sync` without --partial makes it whole)"})
    if not out:
        return inputs, ()
    where = {old: new for new, old in enumerate(keep)}
    links = tuple(SharedLink(x.name, tuple(where[i] for i in x.members if i in where), x.ceiling_Bps) for x in inputs.links)
    links = tuple(x for x in links if len(x.members) > 1)
    provenance = dict(inputs.provenance, left_out=list(inputs.provenance.get("left_out", ())) + out)
    return Inputs(tuple(inputs.sources[i] for i in keep), tuple(inputs.drives[i] for i in keep), provenance, links), tuple(out)
