"""`planner whatif` as a function (the I/O around `planner.whatif`): the rig's problem, the drive
to add (from an iobench result of a scratch file, measured now on a folder of that drive, or read
ceilings given by hand) or the drive to remove, a measured run's timing, and the comparison."""

from __future__ import annotations

import glob
import json
import os
import threading
from dataclasses import dataclass, replace

from core.errors import MissingError, UsageError
from core.events import Reporter
from core.jsonfile import read_json
from core.platform import available_memory
from core.rig import Rig, unique_name
from core.drives import drive_of
from core.tiers import is_memory, nearest_existing, ram_note
from core.units import format_bytes
from engines.registry import get_engine
from replicas.manifests import load_manifest

from .barrier import SharedLink
from .drivecurves import CorrectedCurve
from .plans import measured_points
from .rigmodel import RigProblem
from .whatif import (
    CandidateDrive,
    Timing,
    WhatIf,
    best_prices,
    ceiling_curve,
    file_heat,
    hottest_files,
    phase_changes,
    with_drive,
    without_drive,
)

SEQ_READ = (1 << 20, 8)      # (bytes, in flight): the primary's read a copy makes (iobench's seq preset)
WIDE_READ = (32 << 20, 16)   # (bytes, in flight): a device's ceiling, at iobench's largest prefill shape


# ---------------------------------------------------------------------------------------------
# The drive to add

def bench_candidate(result_path: str, drive: str | None = None) -> CandidateDrive:
    """A drive from an iobench result (a scratch file's, `iobench scratch`, or any run): its fitted
    model corrected by its measurements, and the write speed the scratch file was written at."""
    from iobench.result import load_result

    r = load_result(result_path)
    if drive is None and len(r.drives) != 1:
        raise UsageError(f"{result_path}: {len(r.drives)} drives ({', '.join(d.name for d in r.drives)}); "
                         "name the one to add with --add-bench RESULT:DRIVE")
    d = r.drives[0] if drive is None else next((x for x in r.drives if x.name == drive), None)
    if d is None:
        raise UsageError(f"{result_path}: no drive {drive!r} (it has {', '.join(x.name for x in r.drives)})")
    if d.model is None:
        raise UsageError(f"{result_path}: drive '{d.name}' has no fitted model (its trials were flagged or too few); "
                         "measure it again with `iobench scratch DIR`")
    sc = r.settings.get("scratch") or {}
    where = sc.get("directory") or os.path.dirname(d.path)
    return CandidateDrive(d.name, CorrectedCurve(d.model, measured_points(d)), write_Bps=sc.get("write_Bps") or None,
                     memory=is_memory(where), how=f"measured by iobench ({os.path.abspath(result_path)})", path=where)


def measure_candidate(rig: Rig, directory: str, name: str | None, size: int, presets: tuple[str, ...],
                      seconds: float, repeat: int, lanes: tuple[int, ...] | None = None, report: Reporter = None,
                      cancel: threading.Event | None = None) -> tuple[CandidateDrive, str]:
    """Measure a folder's drive now on a scratch file (`iobench.scratch`), save the result in
    rig/bench/scratch, and return the drive and that result's path."""
    from core.drives import drive_label
    from iobench.bench import rig_component_bytes
    from iobench.constants import SCRATCH_FOLDER
    from iobench.result import save_result
    from iobench.schedule import RunOptions
    from iobench.scratch import bench_scratch, check_folder

    directory = check_folder(directory)
    label = unique_name(name or drive_label(directory), set())
    opts = RunOptions(presets=presets, seconds=seconds, repeat=repeat, lanes=lanes, together=False)
    result = bench_scratch(directory, label, size, opts, rig_component_bytes(rig), report=report, cancel=cancel)
    path = save_result(rig, result, SCRATCH_FOLDER)
    return bench_candidate(path), path


def parse_ceiling(spec: str, default_lat_s: float) -> CandidateDrive:
    """'NAME=READ_GBPS[@LAT_MS][/WRITE_GBPS]' -> a drive given by its read ceiling (decimal GB/s),
    the latency of one request (ms; default: the rig's drives' median) and its write speed."""
    name, _, rest = str(spec).partition("=")
    if not name or not rest:
        raise UsageError(f"--add-ceiling {spec!r}: use NAME=READ_GBPS[@LAT_MS][/WRITE_GBPS], e.g. usb=0.9@0.2/0.8")
    rest, _, write = rest.partition("/")
    read, _, lat = rest.partition("@")
    try:
        read_Bps = float(read) * 1e9
        lat_s = float(lat) / 1e3 if lat else default_lat_s
        write_Bps = float(write) * 1e9 if write else None
    except ValueError:
        raise UsageError(f"--add-ceiling {spec!r}: the read ceiling, latency and write speed must be numbers") from None
    if read_Bps <= 0 or lat_s < 0 or (write_Bps is not None and write_Bps <= 0):
        raise UsageError(f"--add-ceiling {spec!r}: the read ceiling and write speed must be positive")
    how = (f"given: reads up to {read_Bps / 1e9:g} GB/s, {lat_s * 1e3:g} ms a request"
           + ("" if lat else " (the rig's drives' median)"))
    return CandidateDrive(unique_name(name, set()), ceiling_curve(read_Bps, lat_s), write_Bps=write_Bps, how=how)


def median_latency(rp: RigProblem) -> float:
    """The median per-request latency of the rig's fitted drive models (s), for a drive given by its ceiling alone."""
    lats = sorted(float(v.get("lat_s") or 0.0) for v in (rp.inputs.provenance.get("drive_models") or {}).values())
    return lats[len(lats) // 2] if lats else 0.0


@dataclass(frozen=True)
class WhatIfRequest:
    """What `planner whatif` was asked: one change (a folder to measure, an iobench result
    'PATH[:DRIVE]', ceilings 'NAME=READ[@LAT_MS][/WRITE]', or a drive to remove), and how."""
    add: str | None = None
    add_bench: str | None = None
    add_ceiling: str | None = None
    remove: str | None = None
    name: str | None = None
    partial: float | None = None
    timing: str | None = None          # a run result or an engine log (None: the newest harness arm)
    scratch_size: int = 1 << 30
    presets: tuple[str, ...] = ("seq", "prefill", "decode", "rand4k")
    seconds: float = 0.5
    repeat: int = 3
    lanes: tuple[int, ...] | None = None


def run_whatif(rp: RigProblem, rig: Rig, req: WhatIfRequest, report: Reporter = None,
               cancel: threading.Event | None = None) -> tuple[WhatIf, str]:
    """`planner whatif` as a function: the candidate drive as asked (measured now when `add` is a
    folder), the run's timing, the comparison; (the result, the scratch result written or '')."""
    cand, saved = None, ""
    if req.add is not None:
        cand, saved = measure_candidate(rig, req.add, req.name, req.scratch_size, req.presets, req.seconds, req.repeat,
                                        req.lanes, report, cancel)
    elif req.add_bench is not None:
        path, drive = req.add_bench, None
        if not os.path.isfile(path) and ":" in path:
            path, _, drive = path.rpartition(":")
        cand = bench_candidate(path, drive or None)
    elif req.add_ceiling is not None:
        cand = parse_ceiling(req.add_ceiling, median_latency(rp))
    if cand is not None and req.name:
        cand = replace(cand, name=req.name)
    engine = rp.problem.engine.name
    t = read_timing(req.timing, engine) if req.timing else latest_timing(rig, engine)
    shares = same_device(rp, cand) if cand is not None else ()
    return whatif(rp, rig, add=cand, remove=req.remove, partial=req.partial, timing=t, shares=shares), saved


# ---------------------------------------------------------------------------------------------
# A measured run's timing

def read_timing(path: str, engine: str) -> Timing:
    """A run's phases from an embedded engine's run result (JSON, kind 'run': each phase's seconds
    and read_wait_seconds) or from a real engine's log (text: the engine's `timing` reader)."""
    if path.endswith(".json"):
        d = read_json(path, "run", "give a run result written by `engine-bridge run --json` or a harness arm",
                      what="run result")
        phases = {}
        for ph in ("prefill", "decode"):
            p = d.get(ph) or {}
            if isinstance(p.get("seconds"), (int, float)) and isinstance(p.get("read_wait_seconds"), (int, float)):
                phases[ph] = (float(p["seconds"]), float(p["read_wait_seconds"]))
        if not phases:
            raise UsageError(f"{path}: a run result without read_wait_seconds per phase; run it again with this version")
        return Timing(phases, os.path.abspath(path))
    reader = get_engine(engine).timing
    if reader is None:
        raise UsageError(f"{path}: {engine}'s log gives no timing this tool reads; give a run result of the embedded "
                         "engine (`engine-bridge run --json`) instead")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            phases = reader(f.read())
    except FileNotFoundError:
        raise MissingError(f"{path}: no such log") from None
    if not phases:
        raise UsageError(f"{path}: no timing lines of {engine} in it")
    return Timing(phases, os.path.abspath(path))


def latest_timing(rig: Rig, engine: str) -> Timing | None:
    """The newest harness arm's run result for this engine in rig/runs (None: there is none)."""
    for path in sorted(glob.glob(os.path.join(rig.runs_dir, "*", "arms", "*.json")), reverse=True):
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and d.get("kind") == "run" and d.get("engine") == engine:
            try:
                return read_timing(path, engine)
            except (UsageError, MissingError):
                continue
    return None


# ---------------------------------------------------------------------------------------------
# The comparison

def _model_files(rp: RigProblem, rig: Rig) -> dict[str, int]:
    """The model's files and their sizes (bytes), from the geometry, else the primary's copy."""
    g = rp.chosen.workload.geometry
    sizes = dict(getattr(g, "file_sizes", ()) or ())
    if sizes:
        return sizes
    files = sorted({t.file for t in g.tensors})
    root = rp.inputs.sources[0].path
    root = root if os.path.isdir(root) else os.path.dirname(root)
    out = {}
    for f in files:
        try:
            out[f] = os.path.getsize(os.path.join(root, f))
        except OSError:
            continue
    return out


def same_device(rp: RigProblem, cand: CandidateDrive) -> tuple[int, ...]:
    """The rig's sources on the device the candidate's folder is on (its drive key, `core.drives`):
    a copy there shares their bandwidth (two partitions or folders of one disk)."""
    if not cand.path:
        return ()
    try:
        key = drive_of(nearest_existing(cand.path)).key
        return tuple(i for i, s in enumerate(rp.inputs.sources) if drive_of(nearest_existing(s.path)).key == key)
    except OSError:
        return ()


def whatif(rp: RigProblem, rig: Rig, *, add: CandidateDrive | None = None, remove: str | None = None,
           partial: float | None = None, timing: Timing | None = None, shares: tuple[int, ...] = ()) -> WhatIf:
    """The rig's best plan against the best plan with `add` (full, or holding the hottest
    `partial` share of the model's files) or without the drive named `remove`. `shares`: the
    sources on the added drive's device; with them it is priced as one link at the fastest's ceiling."""
    if (add is None) == (remove is None):
        raise UsageError("say what to change: a drive to add (--add DIR, --add-bench RESULT, --add-ceiling) or --remove DRIVE")
    problem, engine = rp.problem, rp.problem.engine
    names = tuple(s.name for s in rp.inputs.sources)
    notes: list[str] = []
    before = best_prices(problem)
    if remove is not None:
        if remove not in names:
            raise UsageError(f"--remove {remove}: not a drive of the rig ({', '.join(names)})")
        if len(names) == 1:
            raise UsageError(f"--remove {remove}: it is the rig's only drive")
        i = names.index(remove)
        if i == 0:
            notes.append(f"{remove} holds the primary: without it {names[1]} becomes the primary")
        after = best_prices(without_drive(problem, i))
        return WhatIf(engine.name, "remove", remove, names, tuple(n for n in names if n != remove),
                      phase_changes(before, after, timing), timing_source=timing.source if timing else "",
                      notes=tuple(notes))
    cand = add
    if cand.name in names:
        cand = replace(cand, name=unique_name(cand.name, set(names)))
    if cand.memory and engine.memory_member:
        raise UsageError(f"{cand.name} is in RAM (tmpfs): {engine.memory_member}")
    if len(names) + 1 > engine.max_sources:
        raise UsageError(f"{engine.name} reads at most {engine.max_sources} sources and the rig has {len(names)}: "
                         f"price a swap with --remove first, or plan another engine")
    sizes = _model_files(rp, rig)
    model_bytes = sum(sizes.values())
    if partial is not None:
        if engine.partial_refusal:
            raise UsageError(f"--partial: {engine.partial_refusal}")
        if rp.chosen.workload.name != "model":
            raise UsageError("--partial needs the rig's own model (its files): a named workload has none")
        if len(sizes) < 2:
            raise UsageError(f"--partial: the model is one file ({', '.join(sizes) or 'none found'}): a partial member "
                             "holds some of a model's files, so it needs a model of several")
        heat = file_heat(rp.chosen.workload.geometry, rp.chosen.workload.phases["decode"].steps)
        held = hottest_files(heat, sizes, partial)
        cand = replace(cand, holds=held)
        copy_bytes = sum(sizes[f] for f in held)
        notes.append(f"partial: the {len(held)} of {len(sizes)} files carrying the most decode reads per byte "
                     f"({format_bytes(copy_bytes)}, {copy_bytes / max(1, model_bytes):.0%} of the model)")
    else:
        manifest = load_manifest(rig, required=False) if rig.model is not None else None
        copy_bytes = manifest.size if manifest is not None else model_bytes
    grown = with_drive(problem, cand)
    if shares:
        # a link iobench measured with those drives together is the device's ceiling: the new
        # drive joins it; else one is made at the fastest one's ceiling
        n, joined = len(names), []
        links = []
        for k in grown.links:
            if set(k.members) & set(shares):
                k = SharedLink(k.name, tuple(k.members) + (n,), k.ceiling_Bps)
                joined.append(k)
            links.append(k)
        if not joined:
            ceiling = max(float(problem.drives[i].curve.throughput(*WIDE_READ)) for i in shares)
            joined.append(SharedLink(f"{cand.name}-device", tuple(shares) + (n,), ceiling))
            links.append(joined[-1])
        grown = replace(grown, links=tuple(links))
        notes.append(f"{cand.name} is on the device of {', '.join(names[i] for i in shares)}: priced as sharing its "
                     f"bandwidth ({min(k.ceiling_Bps for k in joined) / 1e6:,.0f} MB/s for them all), as a copy there would")
    after = best_prices(grown)
    write = cand.write_Bps
    if write:
        src = float(problem.drives[0].curve.throughput(*SEQ_READ))
        if 0 < src < write:
            notes.append(f"the copy is bound by reading the primary ({src / 1e6:,.0f} MB/s) rather than writing {cand.name}")
            write = src
    else:
        notes.append(f"no write speed for {cand.name}: measure it with --add DIR (a scratch file), or give "
                     "--add-ceiling NAME=READ@LAT/WRITE")
    if cand.memory:
        notes.append(f"{cand.name} is in RAM: " + ram_note(copy_bytes, available_memory()))
        avail = available_memory()
        if avail and copy_bytes > avail:
            notes.append(f"{format_bytes(copy_bytes)} does not fit the {format_bytes(avail)} of RAM available now")
    if engine.drive_limit is not None:
        why = engine.drive_limit(rp.chosen.workload.geometry, len(names) + 1, frozenset())
        if why:
            notes.append(why)
    if timing is None:
        notes.append("no timing of a run (time waiting for reads against computing): the gains are the reads' alone; "
                     "run the embedded engine (`engine-bridge bench`) or give --timing RUN.json / an engine log")
    return WhatIf(engine.name, "add", cand.name, names, names + (cand.name,), phase_changes(before, after, timing),
                  copy_bytes=copy_bytes, write_Bps=write, timing_source=timing.source if timing else "",
                  holds=tuple(sorted(cand.holds)) if cand.holds is not None else None, memory=cand.memory,
                  how=cand.how, notes=tuple(notes))
