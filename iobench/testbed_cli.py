"""`iobench testbed`: build, use, show and take down throttled test drives held to a RAM budget (see testbed.py)."""

from __future__ import annotations

import signal
from typing import List, Optional

import typer

from core.cli import JsonOption, err, finish, make_app, out, print_result
from core.errors import EXIT_MISMATCH
from core.ram import ram_limit
from core.units import format_bytes

from . import testbed
from .testbed_spec import PACINGS, THROTTLE, V2, parse_pairs, parse_ram, parse_size, plan_drives

app = make_app("testbed", "Throttled test drives (Linux, root): loop devices whose I/O a cgroup caps, held to a RAM budget.")

RootOption = typer.Option(..., "--root", metavar="DIR", help="The testbed folder (holds the images, mounts and state).")
RamOption = typer.Option(None, "--ram", metavar="SIZE|SHARE[+SIZE]|none",
                         help="The RAM its processes may use, page cache included: a size (2G), a share of the model's "
                              "bytes (25%, 128/518, ref: the reference rig's 128/518) plus an optional allowance for the "
                              "processes' own memory (ref+768M), or none.")
RamOfOption = typer.Option(None, "--ram-of", metavar="PATH|SIZE",
                           help="What a --ram share is of: the model's file or folder (all its files), or its size "
                                "(518G). Repeatable: added up.")


def _ram(ram: Optional[str], ram_of: Optional[List[str]]):
    """(the parsed --ram, the bytes its share is of)."""
    spec = parse_ram(ram) if ram is not None else None
    return spec, (testbed.ram_of(ram_of or []) if spec is not None and spec.needs_model else 0)


def _say(msg: str) -> None:
    err.print(f"testbed: {msg}", highlight=False, markup=False, soft_wrap=True)


@app.command()
def check():
    """Say whether this machine can host a testbed (exit 0) or why not (exit 1)."""
    problems = testbed.check()
    _, why = testbed.controller()
    memory, memory_why = testbed.memory_controller()
    ram = f"RAM budgets: {memory_why}" if memory else f"RAM budgets unavailable: {memory_why}"
    service = testbed.service_problems()
    paced = f"--pacing service: {'unavailable, ' + '; '.join(service) if service else 'FUSE, libfuse3, mfusepy'}"
    if problems:
        typer.echo(f"unavailable: {'; '.join(problems)}; {ram}; {paced}")
        finish(EXIT_MISMATCH)
    typer.echo(f"ok: root, loop devices, {why}; {ram}; {paced}")


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
       ram: Optional[str] = RamOption, ram_of: Optional[List[str]] = RamOfOption,
       pacing: str = typer.Option(THROTTLE, "--pacing", metavar="|".join(PACINGS),
                                  help="How a drive keeps its ceiling. throttle: the cgroup's byte budget per 100 ms "
                                       "slice, so a drive left idle gets its next read through at once; service: a "
                                       "daemon serves each request in bytes / rate after the one before it, nothing "
                                       "banked while idle, as a real drive (needs FUSE, libfuse3 and mfusepy; "
                                       "MB/s ceilings only)."),
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
    spec, of_bytes = _ram(ram, ram_of)
    old = {s: signal.signal(s, _raise_on_hangup) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        state = testbed.up(root, drives, parse_size(size), report=_say, ram=spec, model_bytes=of_bytes, pacing=pacing)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if json_out:
        print_result(state)
    else:
        out.print(f"testbed up at {state.root} ({state.controller} group {state.cgroup}, paced by "
                  f"{state.pacing}); {state.ram.text()}", highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(root: str = RootOption, ram: Optional[str] = RamOption, ram_of: Optional[List[str]] = RamOfOption,
        cmd: List[str] = typer.Argument(..., metavar="-- COMMAND...", help="The command to run inside the group.")):
    """Run COMMAND inside the testbed's groups: its reads (and writes) on the drives are throttled, its
    memory and page cache held to the RAM budget (--ram sets it first, for every process in the
    testbed). Exits with COMMAND's code; an OOM kill is said in one line."""
    if ram is not None:
        spec, of_bytes = _ram(ram, ram_of)
        _say(testbed.set_ram(root, spec, of_bytes).ram.text())
    raise typer.Exit(testbed.run_in_group(root, list(cmd), report=_say))


@app.command()
def show(root: str = RootOption, json_out: bool = JsonOption):
    """The drives, their devices, mount points and limits; the RAM budget and what its group holds."""
    state = testbed.load_state(root)
    if json_out:
        print_result(state)
        return
    out.print(f"testbed at {state.root}: {state.phase}, {state.controller} group {state.cgroup}, paced by {state.pacing}",
              highlight=False)
    for d in state.drives:
        lim = d.limits
        extra = "".join(f", {label} {v:g}" for label, v in (("write MB/s", lim.write_mbs), ("read IOPS", lim.read_iops),
                                                             ("write IOPS", lim.write_iops)) if v)
        served = f", served by pid {d.daemon}" if d.served else ""
        out.print(f"  {d.name:12} {d.device or '-':12} {d.mount}  read {lim.read_mbs:g} MB/s{extra}{served}",
                  highlight=False)
    for line in _ram_lines(state):
        out.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)


def _ram_lines(state) -> list[str]:
    """The budget, what the memory group holds now, and the RAM a command run in it sees."""
    r = state.ram
    if not r.cgroup:
        return [r.text()]
    lines = [f"{r.text()} ({r.controller} group {r.cgroup})"]
    now = testbed.ram_status(state)
    if now is not None:
        lines.append(f"memory group holds {format_bytes(now['usage'])}: page cache {format_bytes(now['cache'])}, "
                     f"processes' own {format_bytes(now['anon'])}; OOM kills "
                     f"{'not counted by this kernel' if now['oom_kills'] is None else now['oom_kills']}")
        group = "/" + r.cgroup.rstrip("/").rsplit("/", 1)[-1]
        lines.append(f"a command run in it sees: {ram_limit(groups={'' if r.controller == V2 else 'memory': group}).describe()}")
    return lines


@app.command()
def down(root: str = RootOption,
         kill: bool = typer.Option(False, "--kill", help="Kill processes still running in the group first.")):
    """Unmount, detach and remove everything the testbed made (also after a crash)."""
    for line in testbed.down(root, kill=kill):
        err.print(f"testbed: {line}", highlight=False)
