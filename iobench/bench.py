"""`iobench run` as a function: targets, the order of trials, and the result.

Order (DESIGN §4): every drive alone (seq first, so its ceilings can set the split weights of
the other presets), then each `--group` of drives together, then all drives together. Each
lane count of each preset is one trial of `repeat` back-to-back windows of `seconds`; the
spread is taken over those windows.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Sequence

from core.errors import MissingError, UsageError
from core.events import Notice, Progress, Reporter, emit
from core.rig import Rig, unique_name
from core.units import format_rate
from engines.ds4_argodrive import COMPONENT_BYTES, PREFILL_CHUNK
from engines.split import check_weights
from replicas import platform
from replicas.coldio import ColdReader
from replicas.drives import DriveInfo, drive_of

from . import stats
from .constants import (
    DEFAULT_LANES,
    DEFAULT_REPEAT,
    DEFAULT_SECONDS,
    DRIVE_IO_UNIT,
    PLAUSIBLE_BW,
    PLAUSIBLE_MIN_LAT_NS,
    PRESETS,
    RESIDENT_WARN,
    SEQ_PIECE,
    TOGETHER_LANES,
)
from .layout import ExpertLayout, expert_layout
from .meter import DeviceMeter, device_meter, io_unit
from .model import DriveSample, fit_drive_model
from .result import BenchResult, DriveResult, GroupResult, LaneResult, Latency, MemberResult, PresetResult
from .shapes import Shape, decode_shape, min_slots, prefill_shape, rand4k_shape, seq_shape
from .trials import Stream, StreamRun, run_trial


@dataclass(frozen=True)
class Target:
    """One file to read, on one drive."""

    name: str
    path: str
    size: int
    drive: DriveInfo
    layout: ExpertLayout | None = None
    notes: tuple[str, ...] = ()

    @property
    def component_bytes(self) -> int:
        return self.layout.component_bytes if self.layout else COMPONENT_BYTES

    @property
    def regions(self) -> tuple[tuple[int, int], ...]:
        return self.layout.regions if self.layout else ()


@dataclass(frozen=True)
class RunOptions:
    presets: tuple[str, ...] = PRESETS
    seconds: float = DEFAULT_SECONDS
    repeat: int = DEFAULT_REPEAT
    lanes: tuple[int, ...] | None = None          # overrides every preset's lane counts
    alone: bool = True
    together: bool = True
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    weights: tuple[int, ...] | None = None        # prefill split, one per drive
    decode_weights: tuple[int, ...] | None = None  # decode split (default: weights)
    seed: int = 0

    def lanes_for(self, preset: str) -> tuple[int, ...]:
        return tuple(self.lanes) if self.lanes else DEFAULT_LANES[preset]


# ---- targets ---------------------------------------------------------------------------------

def check_file(path: str) -> int:
    """Size of a regular, readable file; UsageError otherwise."""
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file; give the model file or a replica")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: not a regular file; give the model file or a replica")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{path}: not readable (permission denied)")
    size = os.path.getsize(path)
    if size <= 0:
        raise UsageError(f"{path}: empty file")
    return size


def make_target(path: str, name: str) -> Target:
    path = os.path.abspath(path)
    size = check_file(path)
    notes = []
    try:
        layout = expert_layout(path)
    except ValueError as e:
        layout = None
        notes.append(f"{e}; decode uses {COMPONENT_BYTES:,} B components over the whole file")
    if layout:
        notes.append(f"decode: {layout.component_bytes:,} B components from {len(layout.regions)} GGUF expert tensors")
    return Target(name=name, path=path, size=size, drive=drive_of(path), layout=layout, notes=tuple(notes))


def targets_from_paths(paths: Sequence[str]) -> list[Target]:
    """Name each file by its drive's mount point (made unique)."""
    out, taken = [], set()
    for p in paths:
        check_file(p)
        name = unique_name(drive_of(p).label, taken)
        taken.add(name)
        out.append(make_target(p, name))
    return out


def targets_from_rig(rig: Rig) -> list[Target]:
    if not rig.members:
        raise UsageError(f"the rig at {rig.root} has no model or replicas: run `replicas init` / `replicas sync`, or give PATHs")
    return [make_target(m.path, m.name) for m in rig.members]


def parse_groups(items: Sequence[str], names: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """'NAME=DRIVE,DRIVE' -> (NAME, (DRIVE, DRIVE)); drives must be measured, at least two."""
    out, seen = [], set()
    for item in items:
        gname, sep, rest = item.partition("=")
        members = tuple(x.strip() for x in rest.split(",") if x.strip())
        if not sep or not gname.strip() or len(members) < 2:
            raise UsageError(f"--group {item!r}: use NAME=DRIVE,DRIVE (at least two drives), e.g. hub=green,white")
        unknown = [m for m in members if m not in names]
        if unknown:
            raise UsageError(f"--group {item!r}: no drive named {unknown[0]!r}; drives here: {', '.join(names)}")
        if len(set(members)) != len(members):
            raise UsageError(f"--group {item!r}: a drive is named twice")
        if gname in seen or gname == "together":
            raise UsageError(f"--group {item!r}: group name {gname!r} is taken")
        seen.add(gname)
        out.append((gname.strip(), members))
    return tuple(out)


def check_options(targets: Sequence[Target], opts: RunOptions) -> None:
    """Everything that can be wrong before the first read: a UsageError naming it."""
    if not targets:
        raise UsageError("nothing to measure: give PATHs or a rig with members")
    if opts.seconds <= 0 or opts.seconds > 600:
        raise UsageError(f"--seconds {opts.seconds}: give a positive number of seconds (at most 600)")
    if opts.repeat < 1 or opts.repeat > 100:
        raise UsageError(f"--repeat {opts.repeat}: give 1..100")
    bad = [p for p in opts.presets if p not in PRESETS]
    if bad or not opts.presets:
        raise UsageError(f"--preset {bad[0] if bad else ''!r}: use seq, prefill, decode, rand4k or all")
    if opts.lanes is not None and (not opts.lanes or any(x < 1 or x > 256 for x in opts.lanes)):
        raise UsageError("--lanes: give lane counts 1..256, e.g. 1,2,4,8,16")
    if not opts.alone and not opts.together:
        raise UsageError("nothing to run: both alone and together runs are off")
    if not opts.alone and len(targets) < 2:
        raise UsageError("--together needs at least two drives")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise UsageError(f"two targets share a name ({', '.join(names)})")
    paths = [os.path.realpath(t.path) for t in targets]
    if len(set(paths)) != len(paths):
        raise UsageError("the same file is given twice")
    split = [p for p in opts.presets if p in ("prefill", "decode")]
    if split and len(targets) > 3:
        raise UsageError(f"{'/'.join(split)} split each read over at most 3 sources as the engine does; "
                         f"got {len(targets)} drives (measure at most 3, or use --preset seq)")
    for w, what in ((opts.weights, "--weights"), (opts.decode_weights, "--decode-weights")):
        if w is not None:
            check_weights(w)
            if len(w) != len(targets):
                raise UsageError(f"{what} {':'.join(map(str, w))}: give one weight per drive ({len(targets)}: {', '.join(names)})")
    # Sizes: the largest piece each preset can ask of a drive, at the most lanes.
    for t in targets:
        for p in opts.presets:
            # together runs use the alone best lane count, or the engine's default without alone runs
            lanes = tuple(opts.lanes_for(p)) if opts.alone else (TOGETHER_LANES[p],)
            probe = shape_for(t, p, 0, (1,), (1,))        # unsplit: the largest piece
            need = min_slots(lanes)
            if probe.slots < need:
                step = probe.step
                raise UsageError(f"{t.path}: {t.size:,} bytes is too small for the {p} preset at {max(lanes)} lanes "
                                 f"(needs {need} requests of {step:,} B apart, about {need * step + probe.piece_bytes:,} bytes); "
                                 f"give a bigger file or fewer --lanes")


MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})   # file systems with no drive behind them


# ---- running -----------------------------------------------------------------------------------

@dataclass
class _Open:
    target: Target
    reader: ColdReader
    meter: DeviceMeter | None
    notes: list[str] = field(default_factory=list)
    not_cold: bool = False


def _open(t: Target) -> _Open:
    reader = ColdReader(t.path)
    o = _Open(t, reader, device_meter(t.path))
    if t.drive.fs_type in MEMORY_FS:
        o.not_cold = True
        o.notes.append(f"{t.drive.fs_type} keeps files in memory: this is not a drive, results are flagged")
    elif reader.how == "fadvise":
        o.not_cold = True
        o.notes.append(f"{t.drive.fs_type or 'this file system'} has no O_DIRECT: reads may come from the page cache, "
                       "so results are flagged, not ceilings")
    elif reader.how == "f_nocache":
        frac = _resident(t.path, t.size)
        if frac > RESIDENT_WARN:
            o.not_cold = True
            o.notes.append(f"{frac:.0%} of the file is in the page cache (F_NOCACHE does not evict it): results are flagged; "
                           "purge the cache (sudo purge) and run again")
    o.notes.append("rates from the device's own counter" if o.meter else
                   "no device counter here: rates credit requests by overlap")
    return o


def _resident(path: str, size: int) -> float:
    """Fraction of the file cached, sampled over 16 windows of 64 MiB (mincore)."""
    win = 64 << 20
    if size <= 16 * win:
        return platform.resident_fraction(path)
    fracs = [platform.resident_fraction(path, i * (size - win) // 15, win) for i in range(16)]
    return sum(fracs) / len(fracs)


def resolve_weights(targets: Sequence[Target], given: tuple[int, ...] | None, seq_bw: dict[str, float],
                    previous: BenchResult | None) -> tuple[tuple[int, ...], str]:
    """(weights, where they came from): --weights, else this run's seq ceilings, else the previous
    result's seq ceilings for the same drive names, else equal."""
    if given:
        return tuple(given), "--weights"
    names = [t.name for t in targets]
    if all(seq_bw.get(n, 0) > 0 for n in names):
        return stats.integer_weights([seq_bw[n] for n in names]), "seq ceilings of this run"
    if previous is not None:
        try:
            bws = [previous.drive(n).presets["seq"].bw_bytes for n in names]
            if all(b > 0 for b in bws):
                return stats.integer_weights(bws), f"seq ceilings of the result of {previous.created}"
        except KeyError:
            pass
    return tuple(1 for _ in names), "equal (no seq ceilings known)"


def shape_for(t: Target, preset: str, index: int, weights, decode_weights) -> Shape | None:
    if preset == "seq":
        return seq_shape(t.size)
    if preset == "prefill":
        return prefill_shape(t.size, weights, index, PREFILL_CHUNK)
    if preset == "rand4k":
        return rand4k_shape(t.size)
    return decode_shape(t.size, decode_weights, index, t.component_bytes, t.regions)


def _suspect(run: StreamRun, not_cold: bool) -> bool:
    """The page cache may have answered: not cold, faster than any drive, or bytes the device
    never delivered."""
    if not_cold:
        return True
    bw = stats.median([w[0] for w in run.windows])
    if bw > PLAUSIBLE_BW:
        return True
    p50 = stats.percentile(run.lat_ns, 50)
    if p50 > 0 and (p50 < PLAUSIBLE_MIN_LAT_NS or run.piece_bytes / (p50 / 1e9) > PLAUSIBLE_BW):
        return True
    if run.device_bytes is not None and run.app_bytes > 2 * run.device_bytes + (1 << 20):
        return True
    return False


def _latency(lat_ns) -> Latency:
    return Latency(**stats.latency_summary(lat_ns))


def _lane_result(run: StreamRun, not_cold: bool) -> LaneResult:
    bws = tuple(w[0] for w in run.windows)
    return LaneResult(lanes=run.lanes, bw_bytes=stats.median(bws), iops=stats.median([w[1] for w in run.windows]),
                      lat_ns=_latency(run.lat_ns), requests=run.requests, runs_bw=bws,
                      spread_pct=round(stats.spread_pct(bws), 3), suspect_cache=_suspect(run, not_cold))


def preset_result(preset: str, piece_bytes: int, lanes: Sequence[LaneResult], notes: Sequence[str] = ()) -> PresetResult:
    """Headline = the best lane count; knee = lowest lane count within 5 % of it (pure)."""
    by = {x.lanes: x.bw_bytes for x in lanes}
    best = stats.best_lanes(by)
    top = next(x for x in lanes if x.lanes == best)
    notes = list(notes)
    if any(x.suspect_cache for x in lanes):
        notes.append("served from the page cache or not cold: not a ceiling")
    return PresetResult(preset=preset, piece_bytes=piece_bytes, bw_bytes=top.bw_bytes, iops=top.iops, lat_ns=top.lat_ns,
                        lanes=tuple(sorted(lanes, key=lambda x: x.lanes)), best_lanes=best,
                        knee_lanes=stats.knee_lanes(by), spread_pct=top.spread_pct, runs_bw=top.runs_bw,
                        suspect_cache=any(x.suspect_cache for x in lanes), notes=tuple(notes))


def _group_result(name: str, preset: str, runs: Sequence[StreamRun], suspects: Sequence[bool]) -> GroupResult:
    windows = len(runs[0].windows)
    totals = tuple(sum(r.windows[w][0] for r in runs) for w in range(windows))
    members = tuple(MemberResult(name=r.name, lanes=r.lanes, piece_bytes=r.piece_bytes,
                                 bw_bytes=stats.median([w[0] for w in r.windows]),
                                 iops=stats.median([w[1] for w in r.windows]), lat_ns=_latency(r.lat_ns)) for r in runs)
    return GroupResult(name=name, preset=preset, drives=tuple(r.name for r in runs), bw_bytes=stats.median(totals),
                       members=members, runs_bw=totals, spread_pct=round(stats.spread_pct(totals), 3),
                       suspect_cache=any(suspects))


def count_trials(targets: Sequence[Target], opts: RunOptions) -> int:
    n = 0
    if opts.alone:
        n += len(targets) * sum(len(opts.lanes_for(p)) for p in opts.presets)
    if opts.together:
        n += len(opts.groups) * len(opts.presets)
        if len(targets) > 1:
            n += len(opts.presets)
    return n


def run_bench(targets: Sequence[Target], opts: RunOptions, *, previous: BenchResult | None = None,
              report: Reporter = None, cancel: threading.Event | None = None) -> BenchResult:
    """Measure the targets; returns the result (the caller saves it). Progress: a Progress event
    (phase 'trial', done/total trials) before each trial and a Notice with its rate after."""
    check_options(targets, opts)
    t_wall = time.perf_counter()
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    opened = {t.name: _open(t) for t in targets}
    total = count_trials(targets, opts)
    done = 0

    def trial(label: str, streams: list[Stream]) -> list[StreamRun]:
        nonlocal done
        emit(report, Progress(task=label, phase="trial", done=done, total=total))
        for s in streams:          # each trial starts somewhere else: no drive cache sees a repeat
            s.seed = opts.seed * 100_003 + done
        runs = run_trial(streams, opts.seconds, opts.repeat, cancel=cancel)
        done += 1
        emit(report, Notice(task=label, message="  ".join(f"{r.name} {format_rate(stats.median([w[0] for w in r.windows]))}"
                                                           for r in runs)))
        return runs

    try:
        presets_by_drive: dict[str, dict[str, PresetResult]] = {t.name: {} for t in targets}
        extra_notes: dict[str, list[str]] = {t.name: [] for t in targets}
        order = [p for p in PRESETS if p in opts.presets]
        weights = decode_weights = None
        weights_from = ""

        def ensure_weights():
            nonlocal weights, decode_weights, weights_from
            if weights is None:
                seq_bw = {n: d["seq"].bw_bytes for n, d in presets_by_drive.items() if "seq" in d}
                weights, weights_from = resolve_weights(targets, opts.weights, seq_bw, previous)
                decode_weights = tuple(opts.decode_weights) if opts.decode_weights else weights

        shapes: dict[tuple[str, str], Shape | None] = {}
        for preset in order:
            if preset in ("prefill", "decode"):
                ensure_weights()
            for i, t in enumerate(targets):
                shape = shape_for(t, preset, i, weights, decode_weights)
                shapes[(t.name, preset)] = shape
                if shape is None:
                    extra_notes[t.name].append(f"{preset}: the weights give this drive no bytes; not measured")
                    continue
                if not opts.alone:
                    continue
                o = opened[t.name]
                lanes_res = []
                for lanes in opts.lanes_for(preset):
                    run = trial(f"{t.name} {preset} x{lanes}", [Stream(t.name, o.reader, shape, lanes, o.meter)])[0]
                    lanes_res.append(_lane_result(run, o.not_cold))
                presets_by_drive[t.name][preset] = preset_result(preset, shape.piece_bytes, lanes_res)

        def lanes_together(t: Target, preset: str) -> int:
            pr = presets_by_drive[t.name].get(preset)
            return pr.best_lanes if pr else TOGETHER_LANES[preset]

        def together_run(name: str, members: Sequence[Target], preset: str) -> GroupResult | None:
            streams = []
            for t in members:
                shape = shapes.get((t.name, preset))
                if shape is not None:
                    o = opened[t.name]
                    streams.append(Stream(t.name, o.reader, shape, lanes_together(t, preset), o.meter))
            if len(streams) < 2:
                return None
            runs = trial(f"{name} {preset}", streams)
            return _group_result(name, preset, runs, [_suspect(r, opened[r.name].not_cold) for r in runs])

        groups, together = [], []
        if opts.together:
            by_name = {t.name: t for t in targets}
            for gname, members in opts.groups:
                for preset in order:
                    g = together_run(gname, [by_name[m] for m in members], preset)
                    if g:
                        groups.append(g)
            if len(targets) > 1:
                for preset in order:
                    g = together_run("together", targets, preset)
                    if g:
                        together.append(g)
    finally:
        for o in opened.values():
            o.reader.close()

    drives = []
    for t in targets:
        o = opened[t.name]
        presets = presets_by_drive[t.name]
        drives.append(DriveResult(name=t.name, path=t.path, size=t.size, cold=o.reader.how, drive=t.drive,
                                  presets=presets, model=_fit(t, presets),
                                  notes=tuple(list(t.notes) + o.notes + extra_notes[t.name])))
    settings = {
        "seconds": opts.seconds,
        "repeat": opts.repeat,
        "presets": list(order),
        "lanes": {p: list(opts.lanes_for(p)) for p in order},
        "alone": opts.alone,
        "together": opts.together,
        "groups": {g: list(m) for g, m in opts.groups},
        "weights": list(weights) if weights else None,
        "decode_weights": list(decode_weights) if decode_weights else None,
        "weights_from": weights_from or None,
        "prefill_chunk": PREFILL_CHUNK,
        "seq_piece": SEQ_PIECE,
        "seed": opts.seed,
    }
    return BenchResult(created=created, drives=tuple(drives), groups=tuple(groups), together=tuple(together),
                       settings=settings, host=socket.gethostname(), wall_s=round(time.perf_counter() - t_wall, 3))


def _fit(t: Target, presets: dict[str, PresetResult]):
    samples = [DriveSample(p.piece_bytes, x.lanes, x.bw_bytes)
               for p in presets.values() if not p.suspect_cache for x in p.lanes if x.bw_bytes > 0]
    if not samples:
        return None
    return fit_drive_model(samples, io_unit=io_unit(t.path, DRIVE_IO_UNIT))



def fio_compare(path: str, preset: str, lanes: int | None, seconds: float, repeat: int,
                cancel: threading.Event | None = None) -> dict:
    """The same shape on the same file, by iobench then by fio: both rates and iobench / fio.
    The file is read as one drive would be alone (no split)."""
    from .fio import fio_args, fio_binary, run_fio
    from .trials import MIN_WARMUP_S

    if preset not in PRESETS:
        raise UsageError(f"--preset {preset!r}: use seq, prefill, decode or rand4k")
    fio = fio_binary()
    if fio is None:
        raise MissingError("fio is not installed (apt-get install fio / brew install fio); `iobench fio` compares against it")
    t = targets_from_paths([path])[0]
    lanes = lanes or TOGETHER_LANES[preset]
    opts = RunOptions(presets=(preset,), seconds=seconds, repeat=repeat, lanes=(lanes,), together=False)
    check_options([t], opts)
    shape = shape_for(t, preset, 0, (1,), (1,))
    o = _open(t)
    try:
        run = run_trial([Stream(t.name, o.reader, shape, lanes, o.meter)], seconds, repeat, cancel=cancel)[0]
    finally:
        o.reader.close()
    bws = [w[0] for w in run.windows]
    ours = {"bw_bytes": stats.median(bws), "iops": stats.median([w[1] for w in run.windows]),
            "lat_ns": stats.latency_summary(run.lat_ns), "spread_pct": round(stats.spread_pct(bws), 3),
            "suspect_cache": _suspect(run, o.not_cold), "cold": o.reader.how}
    args = fio_args(fio, t.path, shape, lanes, seconds * repeat, MIN_WARMUP_S)
    theirs = run_fio(args, timeout=seconds * repeat + 60)
    return {"path": t.path, "preset": preset, "lanes": lanes, "piece_bytes": shape.piece_bytes,
            "seconds": seconds * repeat, "iobench": ours, "fio": theirs, "fio_args": args[1:],
            "ratio": ours["bw_bytes"] / theirs["bw_bytes"] if theirs["bw_bytes"] > 0 else None}
