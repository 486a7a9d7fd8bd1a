"""`iobench`: what each drive really delivers, cold, for the engine's read shapes, alone and together."""

from __future__ import annotations

import os
import threading
from typing import List, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from core.cli import JsonOption, QuietOption, RigOption, err, make_app, out, print_result, run
from core.errors import MissingError, UsageError
from core.events import Notice
from core.events import Progress as ProgressEvent
from core.drives import drive_label
from core.rig import load_rig, rig_dir, unique_name
from core.units import parse_size
from engines.split import parse_weights

from . import render
from .bench import FioComparison, fio_compare, rig_component_bytes, run_bench, targets_from_paths, targets_from_rig
from .constants import DEFAULT_REPEAT, DEFAULT_RESTARTS, DEFAULT_SECONDS, PRESETS, SCRATCH_FOLDER
from .result import latest_result, load_result, resolve_result_path, result_files, save_result
from .scratch import bench_scratch, check_folder
from models.modelset import check_outside_members, member_set
from .schedule import RunOptions, parse_groups, parse_lanes, parse_presets
from .testbed_cli import app as testbed_app

app = make_app("iobench", "Measure each drive's ceilings, cold, with the engine's read shapes: alone, grouped and together.")
app.add_typer(testbed_app, name="testbed")

PresetOption = typer.Option("all", "--preset", help="seq, prefill, decode, rand4k, all, or a comma list.")
SecondsOption = typer.Option(DEFAULT_SECONDS, "--seconds", help="Seconds per measured window.")
RepeatOption = typer.Option(DEFAULT_REPEAT, "--repeat", help="Windows per trial; the spread is taken over them.")
LanesOption = typer.Option(None, "--lanes", metavar="1,2,4,8,16",
                           help="Lane counts (requests in flight per drive) for every preset; default per preset.")
RestartsOption = typer.Option(None, "--restarts", metavar="N",
                              help="Restarted trials per lane count, the median counts (default: decode "
                                   f"{DEFAULT_RESTARTS['decode']}, others 1).")


class _Renderer:
    """Progress events -> a Rich progress bar on stderr, one line per finished trial."""

    def __init__(self, quiet: bool = False):
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=err, transient=True, disable=quiet)
        self.task = None
        self.quiet = quiet

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)

    def __call__(self, ev):
        if isinstance(ev, ProgressEvent):
            if self.task is None:
                self.task = self.bar.add_task(ev.task, total=ev.total)
            self.bar.update(self.task, description=ev.task, completed=ev.done, total=ev.total)
        elif isinstance(ev, Notice) and (ev.warning or not self.quiet):
            self.bar.console.print(f"  {ev.task:<28} {ev.message}", highlight=False)


def _print_result(r, path: str | None = None, lanes: bool = False) -> None:
    out.print(render.drives_table(r))
    if lanes:
        out.print(render.lanes_table(r))
    for table in (render.groups_table(r), render.queue_table(r), render.models_table(r)):
        if table is not None:
            out.print(table)
    out.print(render.bar_chart(render.ceiling_rows(r), "Ceilings (GB/s, decimal)"))
    out.print(render.topology_text(r), end="")
    out.print(render.notes_text(r), end="")
    if path:
        out.print(f"result: {path}", style="dim", highlight=False)


@app.command("run")
def run_cmd(paths: Optional[List[str]] = typer.Argument(None, metavar="PATH", help="Files to read (default: the rig's members)."),
            rig: Optional[str] = RigOption,
            preset: str = PresetOption,
            seconds: float = SecondsOption,
            repeat: int = RepeatOption,
            restarts: Optional[int] = RestartsOption,
            lanes: Optional[str] = LanesOption,
            alone: Optional[bool] = typer.Option(None, "--alone/--together",
                                                 help="Only drives alone, or only groups and all together (default: both)."),
            group: Optional[List[str]] = typer.Option(None, "--group", metavar="NAME=DRIVE,DRIVE",
                                                      help="Drives sharing an uplink, measured together. Repeatable."),
            topology: bool = typer.Option(True, "--topology/--no-topology",
                                          help="Also measure together the drives the OS says share a disk, "
                                               "controller, bridge or hub (Linux sysfs; default on)."),
            weights: Optional[str] = typer.Option(None, "--weights", metavar="W:W:W",
                                                  help="Prefill split weights, one per drive (default: from the seq ceilings)."),
            decode_weights: Optional[str] = typer.Option(None, "--decode-weights", metavar="W:W:W",
                                                         help="Decode split weights (default: --weights)."),
            save: bool = typer.Option(True, "--save/--no-save",
                                      help="Write the result to the rig's bench folder."),
            quiet: bool = QuietOption,
            json_out: bool = JsonOption):
    """Measure drives cold with the engine's read shapes; prints a table and writes rig/bench/<timestamp>.json."""
    root = rig_dir(rig)
    if paths:
        the_rig = load_rig(root, must_exist=False)
        targets = targets_from_paths(paths, the_rig)
    else:
        the_rig = load_rig(root)
        targets = targets_from_rig(the_rig)
    names = [t.name for t in targets]
    opts = RunOptions(presets=parse_presets(preset), skip_small=preset == "all", seconds=seconds, repeat=repeat,
                      restarts=restarts, lanes=parse_lanes(lanes),
                      alone=alone is not False, together=alone is not True,
                      groups=parse_groups(group or [], names), topology=topology,
                      weights=parse_weights(weights) if weights else None,
                      decode_weights=parse_weights(decode_weights) if decode_weights else None)
    previous = None
    if result_files(the_rig):
        try:
            previous = latest_result(the_rig)
        except (UsageError, MissingError):   # malformed, or gone since it was listed: measure afresh
            previous = None
    cancel = threading.Event()
    with _Renderer(quiet) as progress:
        try:
            result = run_bench(targets, opts, previous=previous, report=progress, cancel=cancel)
        except KeyboardInterrupt:
            cancel.set()
            raise
    path = save_result(the_rig, result) if save else None
    if json_out:
        print_result(result)
    else:
        _print_result(result)            # the path once, below, as with --json
    if path and not quiet:
        err.print(f"iobench: wrote {path}", highlight=False)


@app.command()
def scratch(directory: str = typer.Argument(..., metavar="DIR",
                                            help="A folder on the drive to measure (it holds no replica yet)."),
            name: Optional[str] = typer.Option(None, "--name", help="The drive's name in the result (default: its mount point)."),
            size: str = typer.Option("1G", "--size", help="Bytes of scratch file to write, measure and remove (binary units)."),
            rig: Optional[str] = RigOption,
            preset: str = PresetOption,
            seconds: float = SecondsOption,
            repeat: int = RepeatOption,
            restarts: Optional[int] = RestartsOption,
            lanes: Optional[str] = LanesOption,
            quiet: bool = QuietOption,
            json_out: bool = JsonOption):
    """Measure a drive before copying to it: write a scratch file in DIR (its write speed is the copy's), read it cold
    with the engine's shapes, remove it; writes rig/bench/scratch/<timestamp>.json for `planner whatif --add-bench`."""
    root = rig_dir(rig)
    the_rig = load_rig(root, must_exist=False)
    directory = check_folder(directory)
    if the_rig.model is not None:       # a scratch file inside the model's folder would be one of its files
        check_outside_members(directory, member_set(the_rig, the_rig.model), the_rig, f"scratch folder {directory}")
    opts = RunOptions(presets=parse_presets(preset), seconds=seconds, repeat=repeat, restarts=restarts, lanes=parse_lanes(lanes),
                      together=False)
    cancel = threading.Event()
    with _Renderer(quiet) as progress:
        try:
            label = unique_name(name or drive_label(directory), set())
            result = bench_scratch(directory, label, parse_size(size, "--size"), opts,
                                   rig_component_bytes(the_rig), report=progress, cancel=cancel)
        except KeyboardInterrupt:
            cancel.set()
            raise
    path = save_result(the_rig, result, SCRATCH_FOLDER)
    if json_out:
        print_result(result)
    else:
        _print_result(result)
        sc = result.settings["scratch"]
        out.print(f"write {sc['write_Bps'] / 1e6:,.1f} MB/s over {sc['size']:,} B; scratch file "
                  f"{'removed' if sc['removed'] else 'NOT removed (it changed under us)'}", highlight=False)
    if not quiet:
        err.print(f"iobench: wrote {path}", highlight=False)


@app.command()
def show(result: Optional[str] = typer.Argument(None, metavar="RESULT",
                                                help="A result file, its name in rig/bench, or 'latest' (default: the newest)."),
         rig: Optional[str] = RigOption,
         lanes: bool = typer.Option(False, "--lanes", help="Also show every lane count."),
         json_out: bool = JsonOption):
    """A result as a table and a bar chart of the per-drive ceilings."""
    the_rig = load_rig(rig_dir(rig), must_exist=False)
    path = resolve_result_path(result or "latest", the_rig)
    r = load_result(path)
    if json_out:
        print_result(r)
    else:
        _print_result(r, path, lanes)


@app.command()
def compare(a: str = typer.Argument(..., metavar="A", help="Result (the baseline): a file, its name in rig/bench, or 'latest'."),
            b: str = typer.Argument(..., metavar="B", help="Result to compare with A, named as A."),
            rig: Optional[str] = RigOption,
            json_out: bool = JsonOption):
    """Two results side by side: per drive and preset, both ceilings and B/A, with a bar chart."""
    the_rig = load_rig(rig_dir(rig), must_exist=False)
    a, b = (resolve_result_path(x, the_rig) for x in (a, b))
    ra, rb = load_result(a), load_result(b)
    rows = render.compare_rows(ra, rb)
    if json_out:
        print_result(render.Comparison(os.path.abspath(a), os.path.abspath(b), tuple(rows)))
        return
    # The files on lines of their own, not in the table's title: a title wraps at the table's width.
    out.print(f"A = {a} ({ra.created})\nB = {b} ({rb.created})", highlight=False)
    out.print(render.compare_table(rows))
    out.print(render.compare_chart(ra, rb))


@app.command()
def fio(path: str = typer.Argument(..., metavar="PATH", help="File to read (read-only)."),
        preset: str = typer.Option("seq", "--preset", help="seq, prefill, decode or rand4k."),
        lanes: Optional[int] = typer.Option(None, "--lanes", min=1, max=256, help="Requests in flight (default: seq 8, "
                                                                                  "prefill 8, decode 3, rand4k 16)."),
        seconds: float = SecondsOption,
        repeat: int = RepeatOption,
        json_out: bool = JsonOption):
    """Run the equivalent fio job on the same file and print both results side by side."""
    if preset not in PRESETS:
        raise UsageError(f"--preset {preset!r}: use seq, prefill, decode or rand4k")
    err.print(f"iobench: {preset} on {path}, then fio ...", highlight=False)
    r = fio_compare(path, preset, lanes, seconds, repeat)
    if json_out:
        print_result(FioComparison(r))
        return
    out.print(f"{r['preset']} on {r['path']}: {r['piece_bytes']:,} B x {r['lanes']} in flight, {r['seconds']:.1f}s each",
              highlight=False)
    t = Table()
    for col in ("", "iobench", "fio", "iobench/fio"):
        t.add_column(col, justify="left" if not col else "right")
    i, f = r["iobench"], r["fio"]
    t.add_row("GB/s (bw_bytes)", render.gbs(i["bw_bytes"]), render.gbs(f["bw_bytes"]), f"{r['ratio']:.3f}" if r["ratio"] else "-")
    t.add_row("IOPS", f"{i['iops']:.1f}", f"{f['iops']:.1f}", f"{i['iops'] / f['iops']:.3f}" if f["iops"] else "-")
    for k in ("p50", "p95", "p99"):
        a, b = i["lat_ns"][k], f["lat_ns"][k]
        t.add_row(f"latency {k} ms", render.ms(a), render.ms(b), f"{a / b:.3f}" if b else "-")
    out.print(t)
    if i["suspect_cache"]:
        out.print("iobench's reads look served from the page cache (or are not cold): not a ceiling", style="yellow")


def main() -> None:
    run(app, "iobench")


if __name__ == "__main__":
    main()
