"""`iobench run` as a function: open the targets, run the trials the plan asks for, build the result.

What is measured and in what order, and how runs become numbers, is decided without a drive in
`schedule` and `aggregate`; this module finds the files, opens them cold, reads each drive's
queue limits (its I/O unit, `devlimits`), says what cannot be a ceiling (a memory file system,
no O_DIRECT, a cached file under F_NOCACHE), runs each trial on the drives and reports progress.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import ClassVar, Sequence

from core.errors import MissingError, ReplicaTunerError, UsageError
from core.results import Document
from core.events import Notice, Progress, Reporter, emit
from core.fsutil import require_file
from core.rig import Rig, unique_name
from core.units import format_rate
from core import platform
from core.coldio import ColdReader, aligned_buffer, huge_backed
from core.constants import HUGE_PAGE
from core.drives import drive_of, drives_topology
from core.tiers import memory_fs
from core.topology import topology_lines
from models.formats import RAW, SPLIT_NAME, sniff
from models.modelset import FILE, ModelSet, discover, member_set, one_file
from models.tensortable import inspect_model

from . import stats
from .aggregate import model_samples, suspect_cache, window_rate
from .constants import DRIVE_IO_UNIT, PRESETS, RESIDENT_WARN, TOGETHER_LANES
from .devlimits import queue_limits
from .iounit import QueueLimits
from .layout import ExpertLayout
from .meter import DeviceMeter, device_meter
from .drivemodel import fit_drive_model
from .result import BenchResult, DriveResult, PresetResult
from .shapes import engine_shapes
from .schedule import (
    RunOptions,
    Target,
    Trial,
    check_options,
    count_trials,
    fitting_presets,
    measure,
    run_plan,
    run_settings,
    shape_for,
    with_topology,
)
from .trials import SYSTEM_CLOCK, TrialClock, Stream, StreamRun, run_trial



# ---- targets ---------------------------------------------------------------------------------

def check_file(path: str) -> int:
    """Size of a regular, readable, non-empty file (MissingError / UsageError otherwise)."""
    size = require_file(path, "", "give the model file or a replica").st_size
    if size <= 0:
        raise UsageError(f"{path}: empty file")
    return size


def make_target(path: str, name: str, layout: ExpertLayout | None = None, notes: Sequence[str] = ()) -> Target:
    """A file to read; `layout`: its experts as the model's geometry places them (else the file's
    own header is asked, as a one-file model)."""
    path = os.path.abspath(path)
    size = check_file(path)
    notes = list(notes)
    if layout is None and not notes:
        _, layout, notes = model_layout(one_file(path, sniff(path) or RAW))
    return Target(name=name, path=path, size=size, drive=drive_of(path), layout=layout, notes=tuple(notes))


def model_layout(model: ModelSet, header: ModelSet | None = None,
                 holds=None) -> tuple[str, ExpertLayout | None, list[str]]:
    """The file iobench reads of `model` and where its routed experts are, from the model's own
    header (models.tensortable and models.geometry, the planner's reading too): the decode
    read is the model's component (its largest slice), and a split set's or a directory's experts
    may be in any of its files, so the file holding most of them is read. A model without a
    readable geometry is read whole (its largest file) with the engine's default component, and
    says so unless it is raw bytes. `header`: the same model where its header is read (a partial
    replica may lack the files that hold it: the primary's); `holds(rel)`: the files `model` holds
    (a partial replica's own set, `core.rig.Member.holds_file`; None: all) — only those are read."""
    held_paths = [p for r, p in zip(model.files, model.paths) if holds is None or holds(r)]
    if not held_paths:
        raise UsageError(f"{model.path}: holds none of the model's files; `replicas sync` it again")
    try:
        g = inspect_model(header or model)
    except ReplicaTunerError as e:
        largest = max(held_paths, key=os.path.getsize)
        default = engine_shapes().decode_bytes
        why = [] if model.format == RAW else [f"{e}; decode uses {default:,} B components over the whole file"]
        return largest, None, why
    largest = [t for t in g.tensors if t.component_bytes == g.component_bytes and (holds is None or holds(t.file))]
    if not largest:
        path = max(held_paths, key=os.path.getsize)
        return path, None, [f"holds none of the model's expert tensors: its largest file {os.path.relpath(path, model.root)} "
                            f"is read whole in {g.component_bytes:,} B components"]
    held = Counter()
    for t in largest:
        held[t.file] += t.nbytes
    rel = held.most_common(1)[0][0]
    regions = tuple(sorted((t.offset, t.offset + t.nbytes) for t in largest if t.file == rel))
    note = (f"decode: the model's {g.component_bytes:,} B components from {len(regions)} expert tensors"
            f"{f' of {rel}' if model.layout != FILE else ''}")
    return model.abs(rel), ExpertLayout(g.component_bytes, regions, g.experts), [note]


def rig_layout(rig: Rig, member) -> tuple[str, ExpertLayout | None, list[str]]:
    """`model_layout` of the rig's model where `member` keeps it: a partial replica is read in a
    file it holds, with the geometry the primary's header gives (models.modelset.member_files'
    rule: a member's files are the ones it holds)."""
    model = member_set(rig, member)
    if model.format == RAW and model.layout == FILE:
        try:
            model = discover(model.path)          # a rig from before formats were recorded: ask the file
        except ReplicaTunerError:
            pass                                  # not a model file: read it whole
    if getattr(member, "holds", None) is None:
        return model_layout(model)
    header = member_set(rig, rig.model) if rig.model is not None and os.path.exists(rig.model.path) else None
    return model_layout(model, header, member.holds_file)


def rig_component_bytes(rig: Rig) -> int:
    """The decode read of the rig's model (its component, from its header, as `model_layout`
    takes it), else the engine's default component: a scratch file is read in those pieces."""
    if rig.model is not None and os.path.exists(rig.model.path):
        try:
            _, layout, _ = rig_layout(rig, rig.model)
            if layout is not None:
                return layout.component_bytes
        except (ReplicaTunerError, OSError):
            pass
    return engine_shapes().decode_bytes


def targets_from_paths(paths: Sequence[str], rig: Rig | None = None) -> list[Target]:
    """A path that is a member of `rig` (its file, first file or directory) is read as that member
    and takes its name, so the result can feed the planner; any other path is named by its
    drive's mount point (made unique). A path is a file, or a model of several files (its
    directory, any file of its split set): that model is read as a rig member is, the file
    holding most of its experts (`model_layout`)."""
    members = {os.path.realpath(m.path): m for m in (rig.members if rig is not None else ())}
    out, taken = [], {m.name for m in members.values()}
    for p in paths:
        m = members.get(os.path.realpath(p))
        if m is not None:
            out.append(make_target(*_at(rig, m)))
            continue
        several = os.path.isdir(p) or (os.path.isfile(p) and SPLIT_NAME.match(os.path.basename(p)) is not None)
        at = model_layout(discover(p)) if several else (p, None, ())
        check_file(at[0])
        name = unique_name(drive_of(p).label, taken)
        taken.add(name)
        out.append(make_target(*at[:1], name, *at[1:]))
    return out


def targets_from_rig(rig: Rig) -> list[Target]:
    if not rig.members:
        raise UsageError(f"the rig at {rig.root} has no model or replicas: run `replicas init` / `replicas sync`, or give PATHs")
    return [make_target(*_at(rig, m)) for m in rig.members]


def _at(rig: Rig, member):
    path, layout, notes = rig_layout(rig, member)
    return path, member.name, layout, notes


def check_run(targets: Sequence[Target], opts: RunOptions) -> None:
    """`check_options` with the targets' symlinks resolved (one file given twice is refused)."""
    check_options(targets, opts, [os.path.realpath(t.path) for t in targets])


# ---- running -----------------------------------------------------------------------------------

@dataclass
class _Open:
    target: Target
    reader: ColdReader
    meter: DeviceMeter | None
    queue: QueueLimits
    notes: list[str] = field(default_factory=list)
    not_cold: bool = False
    memory: bool = False          # a RAM member: measured as RAM, never flagged as the page cache


def _open(t: Target, huge: bool | None) -> _Open:
    """Open a target; `huge`: whether this host's read buffers lie in huge pages (`_huge_buffers`)."""
    reader = ColdReader(t.path)
    queue = replace(queue_limits(t.path, t.drive.disk), buffers_contiguous=huge)
    o = _Open(t, reader, device_meter(t.path), queue)
    if memory_fs(t.drive.fs_type):
        o.memory = True
        o.notes.append(f"{t.drive.fs_type} keeps files in RAM: measured as a RAM member (no drive behind it), which "
                       "takes RAM for as long as it exists and vanishes at reboot")
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
    q = o.queue
    if q.known:
        how = ("read buffers in huge pages" if q.buffers_contiguous else
               "read buffers in 4 KiB pages (no huge pages here: a read lying on contiguous pages gets "
               f"{q.contiguous_request_bytes:,} B requests)")
        o.notes.append(f"I/O unit {q.unit:,} B from {q.device or 'the device'}'s queue limits ({q.source}), {how}")
    else:
        o.notes.append("the OS reports no queue limits here: the drive model measures its I/O unit")
    return o


def _huge_buffers() -> bool | None:
    """Whether the buffers trials read into lie in huge pages (asked of one such buffer)."""
    buf = aligned_buffer(HUGE_PAGE)
    try:
        return huge_backed(buf)
    finally:
        buf.release()


def _resident(path: str, size: int) -> float:
    """Fraction of the file cached, sampled over 16 windows of 64 MiB (mincore)."""
    win = 64 << 20
    if size <= 16 * win:
        return platform.resident_fraction(path)
    fracs = [platform.resident_fraction(path, i * (size - win) // 15, win) for i in range(16)]
    return sum(fracs) / len(fracs)


def run_bench(targets: Sequence[Target], opts: RunOptions, *, previous: BenchResult | None = None,
              report: Reporter = None, cancel: threading.Event | None = None,
              clock: TrialClock = SYSTEM_CLOCK) -> BenchResult:
    """Measure the targets; returns the result (the caller saves it). Progress: a Progress event
    (phase 'trial', done/total trials) before each trial and a Notice with its rate after.
    `clock` times the trials (the host's unless a test passes its own). With `opts.topology`, the
    drives the OS says share a disk, controller, bridge or hub are also measured together
    (`schedule.with_topology`) and the result keeps what the OS said. Presets not named that a
    target is too small for are skipped, with a note on that drive (`fitting_presets`)."""
    opts, skipped = fitting_presets(targets, opts)
    for name, note in skipped:
        emit(report, Notice(task=name, message=note))
    check_run(targets, opts)
    topology = drives_topology([(t.name, t.path) for t in targets]) if opts.topology else None
    if topology is not None:
        opts = with_topology(opts, topology, [t.name for t in targets])
        for line in topology_lines(topology):
            emit(report, Notice(task="topology", message=line))
    t_wall = time.perf_counter()
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    huge = _huge_buffers()
    opened = {t.name: _open(t, huge) for t in targets}
    total = count_trials(targets, opts)
    done = 0

    def run(trial: Trial) -> list[StreamRun]:
        nonlocal done
        emit(report, Progress(task=trial.label, phase="trial", done=done, total=total))
        # each trial, a restarted one too, starts somewhere else: no drive cache sees a repeat
        streams = [Stream(leg.name, opened[leg.name].reader, leg.shape, leg.lanes, opened[leg.name].meter,
                          seed=opts.seed * 100_003 + done) for leg in trial.legs]
        runs = run_trial(streams, opts.seconds, opts.repeat, cancel=cancel, clock=clock)
        done += 1
        emit(report, Notice(task=trial.label, message="  ".join(f"{r.name} {format_rate(window_rate(r))}" for r in runs)))
        return runs

    try:
        m = run_plan(measure(targets, opts, {n: o.not_cold for n, o in opened.items()}, previous,
                             memory={n for n, o in opened.items() if o.memory}), run)
    finally:
        for o in opened.values():
            o.reader.close()

    drives = []
    for t in targets:
        o = opened[t.name]
        presets = m.presets[t.name]
        drives.append(DriveResult(name=t.name, path=t.path, size=t.size, cold=o.reader.how, drive=t.drive,
                                  presets=presets, model=_fit(presets, o.queue),
                                  notes=tuple(list(t.notes) + o.notes + m.notes[t.name]
                                              + [note for name, note in skipped if name == t.name]), queue=o.queue))
    return BenchResult(created=created, drives=tuple(drives), groups=tuple(m.groups), together=tuple(m.together),
                       settings=run_settings(opts, m), host=socket.gethostname(),
                       wall_s=round(time.perf_counter() - t_wall, 3), topology=topology)


def _fit(presets: dict[str, PresetResult], queue: QueueLimits):
    """The drive model, pricing reads in the device requests its queue limits allow (or, where
    the OS reports none, in a unit the fit measures)."""
    samples = model_samples(presets.values())
    if not samples:
        return None
    return fit_drive_model(samples, io_unit=DRIVE_IO_UNIT, units=queue.units())


class FioComparison(Document):
    """`iobench fio`: iobench's and fio's numbers for the same job on the same file (`fio_compare`)."""

    KIND: ClassVar[str] = "fio-compare"
    SCHEMA: ClassVar[int] = 1


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
    check_run([t], opts)
    shape = shape_for(t, preset, 0, (1,), (1,))
    o = _open(t, _huge_buffers())
    try:
        run = run_trial([Stream(t.name, o.reader, shape, lanes, o.meter)], seconds, repeat, cancel=cancel)[0]
    finally:
        o.reader.close()
    bws = [w[0] for w in run.windows]
    ours = {"bw_bytes": stats.median(bws), "iops": stats.median([w[1] for w in run.windows]),
            "lat_ns": stats.latency_summary(run.lat_ns), "spread_pct": round(stats.spread_pct(bws), 3),
            "suspect_cache": suspect_cache(run, o.not_cold), "cold": o.reader.how}
    args = fio_args(fio, t.path, shape, lanes, seconds * repeat, MIN_WARMUP_S)
    theirs = run_fio(args, timeout=seconds * repeat + 60)
    return {"path": t.path, "preset": preset, "lanes": lanes, "piece_bytes": shape.piece_bytes,
            "seconds": seconds * repeat, "iobench": ours, "fio": theirs, "fio_args": args[1:],
            "ratio": ours["bw_bytes"] / theirs["bw_bytes"] if theirs["bw_bytes"] > 0 else None}
