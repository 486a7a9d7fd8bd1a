"""`iobench testbed`: build, use, show and take down throttled test drives (see testbed.py)."""

from __future__ import annotations

import signal
from typing import List, Optional

import typer

from core.cli import JsonOption, err, finish, make_app, out, print_result
from core.errors import EXIT_MISMATCH

from . import testbed
from .testbed_spec import parse_pairs, parse_size, plan_drives

app = make_app("testbed", "Throttled test drives (Linux, root): loop devices whose I/O a cgroup caps.")

RootOption = typer.Option(..., "--root", metavar="DIR", help="The testbed folder (holds the images, mounts and state).")


@app.command()
def check():
    """Say whether this machine can host a testbed (exit 0) or why not (exit 1)."""
    problems = testbed.check()
    _, why = testbed.controller()
    if problems:
        typer.echo(f"unavailable: {'; '.join(problems)}")
        finish(EXIT_MISMATCH)
    typer.echo(f"ok: root, loop devices, {why}")


def _raise_on_hangup(signum, frame):
    raise KeyboardInterrupt     # up takes down what it made on the way out


@app.command()
def up(root: str = RootOption,
       drive: List[str] = typer.Option(..., "--drive", metavar="NAME:MBPS",
                                       help="A drive and its read ceiling in MB/s (10**6 B/s). Repeatable, in order."),
       write_mbs: Optional[List[str]] = typer.Option(None, "--write-mbs", metavar="MBPS|NAME:MBPS",
                                                     help="Write ceiling: one for every drive, or per drive (default: none)."),
       iops: Optional[List[str]] = typer.Option(None, "--iops", metavar="NAME:IOPS", help="Read IOPS ceiling of a drive (0: "
                                                                                          "none)."),
       write_iops: Optional[List[str]] = typer.Option(None, "--write-iops", metavar="NAME:IOPS",
                                                      help="Write IOPS ceiling of a drive (0: none)."),
       size: str = typer.Option("3G", "--size", help="Each drive's size (K, M, G, T: binary units)."),
       json_out: bool = JsonOption):
    """Build the drives in a new or empty folder: image, loop device (direct I/O), ext4, mount, limits."""
    reads = parse_pairs(drive, "--drive")
    writes: float | dict[str, float] = 0
    if write_mbs:
        if len(write_mbs) == 1 and ":" not in write_mbs[0]:
            writes = parse_pairs(f"all:{write_mbs[0]}", "--write-mbs", zero_ok=True)["all"]
        else:
            writes = parse_pairs(write_mbs, "--write-mbs", zero_ok=True)
    drives = plan_drives(reads, writes, parse_pairs(iops or [], "--iops", zero_ok=True),
                         parse_pairs(write_iops or [], "--write-iops", zero_ok=True))
    old = {s: signal.signal(s, _raise_on_hangup) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        state = testbed.up(root, drives, parse_size(size), report=lambda m: err.print(f"testbed: {m}", highlight=False))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if json_out:
        print_result(state)
    else:
        out.print(f"testbed up at {state.root} ({state.controller} group {state.cgroup})", highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(root: str = RootOption,
        cmd: List[str] = typer.Argument(..., metavar="-- COMMAND...", help="The command to run inside the group.")):
    """Run COMMAND inside the testbed's group: its reads (and writes) on the drives are throttled."""
    testbed.exec_in_group(root, list(cmd))


@app.command()
def show(root: str = RootOption, json_out: bool = JsonOption):
    """The drives, their devices, mount points and limits."""
    state = testbed.load_state(root)
    if json_out:
        print_result(state)
        return
    out.print(f"testbed at {state.root}: {state.phase}, {state.controller} group {state.cgroup}", highlight=False)
    for d in state.drives:
        lim = d.limits
        extra = "".join(f", {label} {v:g}" for label, v in (("write MB/s", lim.write_mbs), ("read IOPS", lim.read_iops),
                                                             ("write IOPS", lim.write_iops)) if v)
        out.print(f"  {d.name:12} {d.device or '-':12} {d.mount}  read {lim.read_mbs:g} MB/s{extra}", highlight=False)


@app.command()
def down(root: str = RootOption,
         kill: bool = typer.Option(False, "--kill", help="Kill processes still running in the group first.")):
    """Unmount, detach and remove everything the testbed made (also after a crash)."""
    for line in testbed.down(root, kill=kill):
        err.print(f"testbed: {line}", highlight=False)
