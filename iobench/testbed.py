"""Throttled test drives on one Linux machine (root): `iobench testbed check|up|run|show|down`.

Each drive is an ext4 file system on a loop device with direct I/O on its backing image (a
hidden file in the testbed folder), mounted at <root>/<name>; one cgroup caps each device's
reads (and writes, IOPS): `io.max` on cgroup v2 when its io controller is on the unified
hierarchy, `blkio.throttle.*` on cgroup v1 otherwise. A process placed in the group (`run`) sees
drive N's ceilings on drive N. Where the machine has a memory controller, a memory group (the
same group on cgroup v2) holds the processes to the testbed's RAM budget: the page cache counts
against it, so a model larger than the budget is read again from the drives, as on a rig whose
RAM is smaller than the model. The pure parts (limits, lines, state) are in testbed_spec.py.

What `up` makes is written to <root>/testbed.json (atomically) before and after each step, so
`down` takes apart a testbed a crash left half-built, and touches only what the state names and
the machine confirms is ours: a loop device only if its backing file is one of our images, a
mount only if a loop device of ours is mounted there. `up` builds only in a new or empty folder
and refuses a group that already exists. MB here is 10**6 bytes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import datetime
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

from core.errors import MismatchError, MissingError, ReplicaTunerError, UsageError, WriteError
from core.jsonfile import read_json, write_json
from core.ramlimit import stat_value
from core.units import format_bytes, parse_size
from models.formats import RAW
from models.modelset import NotAModel, discover

from . import servedrive
from .testbed_spec import (
    PEAK_FILE,
    STATE_FILE,
    STATE_KIND,
    STATE_SCHEMAS,
    SERVICE,
    THROTTLE,
    V2,
    Controller,
    DriveLimits,
    RamSpec,
    TestbedState,
    backing_path,
    cgroup_mounts,
    choose_controller,
    choose_memory,
    memory_line,
    memory_use,
    mounted_devices,
    new_state,
    ram_bytes,
    state_from_doc,
    state_to_doc,
    v1_lines,
    v1_mount,
    v2_line,
)

TOOLS = ("losetup", "mkfs.ext4", "mount", "umount")
DETACH_WAIT_S = 10.0        # a loop device detaches lazily (autoclear) once its last user lets go
SERVE_WAIT_S = 10.0         # a drive's daemon shows its image within this, or `up` says why not


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def controller() -> tuple[Controller | None, str]:
    """The block I/O controller this machine offers, and a line saying which or why none."""
    v2, v1 = cgroup_mounts(_read("/proc/mounts"))
    v2_controllers = _read(os.path.join(v2, "cgroup.controllers")) if v2 else ""
    v1_throttle = bool(v1) and os.path.exists(os.path.join(v1, "blkio.throttle.read_bps_device"))
    return choose_controller(v2, v2_controllers, v1, v1_throttle)


def memory_controller() -> tuple[Controller | None, str]:
    """The memory controller this machine offers for RAM budgets, and a line saying which or why none."""
    mounts = _read("/proc/mounts")
    v2, _ = cgroup_mounts(mounts)
    return choose_memory(v2, _read(os.path.join(v2, "cgroup.controllers")) if v2 else "", v1_mount(mounts, "memory"))


def check(pacing: str = THROTTLE) -> list[str]:
    """Why this machine cannot host a testbed paced so (empty: it can)."""
    problems = []
    if pacing == SERVICE:
        problems += service_problems()
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        problems.append("not root")
    if not os.path.exists("/dev/loop-control"):
        problems.append("no loop devices (/dev/loop-control)")
    ctl, why = controller()
    if ctl is None:
        problems.append(f"no block I/O controller ({why})")
    problems += [f"no {tool} on PATH" for tool in TOOLS if shutil.which(tool) is None]
    return problems


def service_problems() -> list[str]:
    """Why drives paced by their service time cannot be built here (empty: they can): they need
    FUSE (/dev/fuse), libfuse3 and the mfusepy package."""
    import ctypes.util
    import importlib.util

    problems = []
    if not os.path.exists("/dev/fuse"):
        problems.append("no FUSE (/dev/fuse) for --pacing service")
    if ctypes.util.find_library("fuse3") is None:
        problems.append("no libfuse3 for --pacing service (apt install fuse3)")
    if importlib.util.find_spec("mfusepy") is None:
        problems.append("no mfusepy package for --pacing service (pip install -e '.[bench]')")
    return problems


def state_path(root: str) -> str:
    return os.path.join(os.path.realpath(root), STATE_FILE)


def load_state(root: str) -> TestbedState:
    """The testbed at `root`: exit 3 when there is none, exit 2 when the file is not ours."""
    path = state_path(root)
    doc = read_json(path, STATE_KIND, "build one with `iobench testbed up`", schema=STATE_SCHEMAS, what="testbed state")
    return state_from_doc(doc, path)


def _save(state: TestbedState) -> None:
    write_json(os.path.join(state.root, STATE_FILE), state_to_doc(state))


def _sh(*cmd: str) -> str:
    # Its own session: a Ctrl-C at the terminal reaches the caller, who finishes or undoes the step.
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, start_new_session=True)
    if p.returncode:
        raise WriteError(f"{' '.join(cmd)} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p.stdout.strip()


def _write(path: str, line: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(line + "\n")
    except OSError as e:
        raise WriteError(f"cannot write {line!r} to {path}: {e.strerror or e}") from None


# ---- up ----------------------------------------------------------------------------------------

def up(root: str, drives: tuple[DriveLimits, ...], size: int, report: Callable[[str], None] | None = None,
       ram: RamSpec | None = None, model_bytes: int = 0, pacing: str = THROTTLE) -> TestbedState:
    """Build the testbed at `root` (a new or empty folder): one `size`-byte drive per entry of
    `drives`, throttled by the cgroup (`pacing` "throttle") or served by a daemon at its rate
    ("service"), and a memory group where the machine has a memory controller, holding its
    processes to `ram` (a share of `model_bytes`; None: no budget yet, `set_ram` sets one). On
    any failure, or an exception such as KeyboardInterrupt, what was made is taken down again
    before the error goes on."""
    say = report or (lambda msg: None)
    limit = ram_bytes(ram, model_bytes) if ram else 0
    problems = check(pacing)
    if pacing == SERVICE and any(d.read_iops or d.write_iops for d in drives):
        raise UsageError("--pacing service keeps MB/s ceilings only; IOPS ceilings are the throttle's: leave out "
                         "--iops/--write-iops or use --pacing throttle")
    if problems:
        raise UsageError(f"cannot build a testbed here: {', '.join(problems)}; see `iobench testbed check`")
    memory, memory_why = memory_controller()
    if ram and memory is None:
        raise UsageError(f"cannot hold a testbed to a RAM budget here: {memory_why}; leave out --ram")
    root = os.path.realpath(root)
    if os.path.exists(os.path.join(root, STATE_FILE)):
        raise UsageError(f"{root}: a testbed is already up there; take it down with `iobench testbed down --root {root}`")
    if os.path.exists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise UsageError(f"{root}: exists and is not an empty folder; a testbed is only built in a new or empty "
                         "folder, so nothing in it is ever touched: choose another --root")
    ctl, _ = controller()
    made_root = not os.path.exists(root)
    state = new_state(root, ctl, drives, size, made_root,
                      datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), memory, memory_why,
                      pacing)
    for group in {state.cgroup, state.ram.cgroup} - {""}:
        if os.path.exists(group):
            raise UsageError(f"{group}: a group of that name exists and this testbed did not make it; "
                             "remove it (rmdir) if it is a leftover, or choose another --root")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise WriteError(f"cannot create the testbed folder {root}: {e.strerror or e}") from None
    try:
        _save(state)                       # the plan first: a crash from here on leaves a state to undo
        _build(state, say)
        if ram:
            _set_ram(state, limit, ram.text, model_bytes if ram.needs_model else 0)
            say(state.ram.text())
    except BaseException:
        try:
            _teardown(state, kill=True)
        except MismatchError as e:      # the build's own error is the one to see; this one too
            say(str(e))
        raise
    return state


def _enable(group: str, controller: str) -> bool:
    """v2: make `controller` available in the groups under `group`'s parent; True when we did."""
    parent = os.path.dirname(group)
    if controller in _read(os.path.join(parent, "cgroup.subtree_control")).split():
        return False
    _write(os.path.join(parent, "cgroup.subtree_control"), f"+{controller}")
    return True


def _build(state: TestbedState, say: Callable[[str], None]) -> None:
    os.mkdir(state.cgroup)
    if state.controller == V2:
        state.enabled_io = True                         # saved before the write: a crash after it undoes it
        _save(state)
        state.enabled_io = _enable(state.cgroup, "io")
        _save(state)
    if state.ram.cgroup:
        if state.ram.cgroup != state.cgroup:
            os.mkdir(state.ram.cgroup)
        if state.ram.controller == V2:
            state.ram.enabled_memory = True
            _save(state)
            state.ram.enabled_memory = _enable(state.ram.cgroup, "memory")
            _save(state)
    for d in state.drives:
        with open(d.image, "xb") as f:     # "x": never reuse a file someone else made
            f.truncate(state.size)
        if d.served:
            _serve(state, d)
        d.device = _sh("losetup", "--find", "--show", "--direct-io=on", d.backing)
        st = os.stat(d.device)
        d.majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        _save(state)
        _sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", d.device)
        os.mkdir(d.mount)
        _sh("mount", d.device, d.mount)
        d.mounted = True
        _save(state)
        if d.served:
            say(f"{d.name}: {d.device} on {d.mount}, read {d.limits.read_mbs:g} MB/s, served one request at a time "
                f"(pid {d.daemon})")
            continue
        _limit(state, d.majmin, d.limits)
        say(f"{d.name}: {d.device} on {d.mount}, read {d.limits.read_mbs:g} MB/s")
    state.phase = "up"
    _save(state)


def _serve(state: TestbedState, d) -> None:
    """Start drive `d`'s daemon (iobench/servedrive.py) at its rates, outside the testbed's groups
    (its own memory and the image's page cache are the machine's, not the budget's), and wait
    until it shows the image."""
    write_json(d.control, servedrive.control_doc(d.limits.read_mbs, d.limits.write_mbs))
    os.mkdir(d.served)
    log = open(d.served_log, "ab")
    with log:
        proc = subprocess.Popen([sys.executable, "-m", servedrive.MODULE, d.image, d.served, d.control],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    d.daemon = proc.pid
    _save(state)
    t0 = time.monotonic()
    while not (os.path.ismount(d.served) and os.path.exists(d.backing)):
        if proc.poll() is not None or time.monotonic() - t0 > SERVE_WAIT_S:
            said = _read(log.name).strip().splitlines()
            raise WriteError(f"the daemon serving {d.name} did not start ({said[-1] if said else 'no output'}); "
                             f"its log: {log.name}")
        time.sleep(0.02)


def _limit(state: TestbedState, majmin: str, limits: DriveLimits, clear: bool = False) -> None:
    """Write a drive's limits; `clear`: also lift those it no longer has (v2's line names every key)."""
    if state.controller == V2:
        _write(os.path.join(state.cgroup, "io.max"), v2_line(majmin, limits))
    else:
        for fname, line in v1_lines(majmin, limits, clear):
            _write(os.path.join(state.cgroup, fname), line)


def set_read_limit(root: str, name: str, read_mbs: float) -> None:
    """Change drive `name`'s read ceiling while the testbed is up (a drive that slows or recovers
    mid-run); its other limits stay. The change is not written to the state file: `down` needs
    only the devices."""
    state = load_state(root)
    for d in state.drives:
        if d.name == name:
            if d.served:
                write_json(d.control, servedrive.control_doc(read_mbs, d.limits.write_mbs))
            else:
                _limit(state, d.majmin, dataclasses.replace(d.limits, read_mbs=read_mbs), clear=True)
            return
    raise UsageError(f"testbed at {root}: no drive named {name!r} (it has {', '.join(x.name for x in state.drives)})")


# ---- the RAM budget ----------------------------------------------------------------------------

def bytes_of(paths: list[str]) -> int:
    """The bytes of the models (or plain files) at `paths`: a model's whole set of files (every
    member of a split GGUF, every file of a model folder), a plain file's size."""
    total = 0
    for path in paths:
        try:
            model = discover(path)
        except NotAModel:
            model = discover(path, RAW)
        total += sum(os.path.getsize(p) for p in model.paths)
    return total


def ram_of(items: list[str]) -> int:
    """--ram-of: model files or folders, or sizes ('518G'); their bytes added up (0: none given)."""
    total = 0
    for item in items:
        if os.path.exists(item):
            total += bytes_of([item])
            continue
        try:
            total += parse_size(item, "--ram-of")
        except UsageError:
            raise UsageError(f"--ram-of {item!r}: no such file or folder, and not a size (e.g. 518G)") from None
    return total


def _set_ram(state: TestbedState, limit: int, spec: str, of_bytes: int) -> None:
    kind = state.ram.controller
    fname, value = memory_line(kind, limit)
    path = os.path.join(state.ram.cgroup, fname)
    try:
        with open(path, "w") as f:
            f.write(value + "\n")
    except OSError as e:
        if e.errno == errno.EBUSY:      # v1 could not reclaim down to the new limit
            cache, anon = memory_use(kind, _read(os.path.join(state.ram.cgroup, "memory.stat")))
            raise WriteError(f"cannot set the testbed's RAM budget to {format_bytes(limit)}: its processes hold "
                             f"{format_bytes(anon)} of their own memory that the kernel cannot give back; give a larger "
                             "--ram or stop them") from None
        raise WriteError(f"cannot write {value!r} to {path}: {e.strerror or e}") from None
    state.ram = dataclasses.replace(state.ram, limit=limit, spec=spec if limit else "", model_bytes=of_bytes)
    _save(state)


def set_ram(root: str, ram: RamSpec | None, model_bytes: int = 0) -> TestbedState:
    """Hold the testbed at `root` to a RAM budget from now on (None: no budget): `ram` a size, or a
    share of `model_bytes`. Every process in the group is held to it at once (the kernel evicts
    page cache down to it); the state file records it."""
    state = load_state(root)
    if not state.ram.cgroup:
        raise UsageError(f"the testbed at {state.root} has no memory group, so no RAM budget: {state.ram.note}")
    limit = ram_bytes(ram, model_bytes) if ram else 0
    if limit:
        os.sync()       # dirty pages cannot be evicted until written: the new limit would be refused
    _set_ram(state, limit, ram.text if ram else "", model_bytes if ram and ram.needs_model else 0)
    return state


def ram_status(state: TestbedState) -> dict | None:
    """What the memory group holds now: {limit, usage, cache, anon, oom_kills} in bytes and
    counts, as the kernel says; None without a memory group or when it is gone."""
    g, v2 = _memory_group(state), state.ram.controller == V2
    if g is None:
        return None
    cache, anon = memory_use(state.ram.controller, _read(os.path.join(g, "memory.stat")))
    limit_text = _read(os.path.join(g, "memory.max" if v2 else "memory.limit_in_bytes")).strip()
    usage_text = _read(os.path.join(g, "memory.current" if v2 else "memory.usage_in_bytes")).strip()
    return {"limit": int(limit_text) if limit_text.isdigit() and int(limit_text) < 1 << 62 else 0,
            "usage": int(usage_text) if usage_text.isdigit() else 0, "cache": cache, "anon": anon,
            "oom_kills": oom_kills(state)}


def memory_counters(state: TestbedState) -> dict | None:
    """{peak, at_limit}: the memory group's highest use, bytes, since `reset_memory_peak` (or since
    the group was made), and how many times so far its use reached the budget and the kernel had to
    reclaim in the group's own processes first (v1 memory.max_usage_in_bytes and memory.failcnt;
    v2 memory.peak, 0 where the kernel has none, and memory.events' `max`); None without a memory
    group or when it is gone."""
    g, v2 = _memory_group(state), state.ram.controller == V2
    if g is None:
        return None
    peak = _read(os.path.join(g, PEAK_FILE[state.ram.controller])).strip()
    if v2:
        hits = stat_value(_read(os.path.join(g, "memory.events")), "max")
    else:
        count = _read(os.path.join(g, "memory.failcnt")).strip()
        hits = int(count) if count.isdigit() else None
    return {"peak": int(peak) if peak.isdigit() else 0, "at_limit": hits or 0}


def reset_memory_peak(state: TestbedState) -> bool:
    """Start the memory group's peak use afresh (v1 memory.max_usage_in_bytes; v2 memory.peak, on
    kernels that take a write to it); False without a memory group or where the kernel does not."""
    g = _memory_group(state)
    if g is None:
        return False
    try:
        with open(os.path.join(g, PEAK_FILE[state.ram.controller]), "w") as f:
            f.write("0\n")
    except OSError:
        return False
    return True


def _memory_group(state: TestbedState) -> str | None:
    """The testbed's memory group directory; None without one or when it is gone."""
    g = state.ram.cgroup
    return g if g and os.path.isdir(g) else None


def oom_kills(state: TestbedState) -> int | None:
    """Processes of the memory group the kernel's OOM killer has killed so far (v2 memory.events,
    v1 memory.oom_control: kernels from 4.13 count them); None where it does not say."""
    if not state.ram.cgroup:
        return None
    name = "memory.events" if state.ram.controller == V2 else "memory.oom_control"
    return stat_value(_read(os.path.join(state.ram.cgroup, name)), "oom_kill")


# ---- down --------------------------------------------------------------------------------------

def group_pids(state: TestbedState) -> list[int]:
    """The processes in the testbed's groups (the drives' and the memory group)."""
    pids: list[int] = []
    for group in dict.fromkeys(g for g in (state.cgroup, state.ram.cgroup) if g):
        pids += [int(x) for x in _read(os.path.join(group, "cgroup.procs")).split() if int(x) not in pids]
    return pids


def kill_group(state: TestbedState, timeout_s: float = 10.0) -> None:
    """SIGKILL whatever still runs in the group, until it is empty or `timeout_s` seconds pass."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        pids = group_pids(state)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _our_loops(state: TestbedState) -> dict[str, str]:
    """{image: /dev/loopN} for every loop device backed by one of our images or their paced views
    (whatever the state recorded: a crash may come between attaching and saving)."""
    images = {d.backing: d.image for d in state.drives}
    out = {}
    for f in glob.glob("/sys/block/loop*/loop/backing_file"):
        path = backing_path(_read(f))
        if path in images:
            out[images[path]] = "/dev/" + f.split("/")[3]
    return out


def _daemon_of(d) -> int:
    """Drive `d`'s daemon pid if that process is still ours (its command line names the module and
    the folder it serves), else 0."""
    cmdline = _read(f"/proc/{d.daemon}/cmdline").split("\0") if d.daemon else []
    return d.daemon if servedrive.MODULE in cmdline and d.served in cmdline else 0


def _stop_serving(d, left: list[str], done: list[str]) -> None:
    """Unmount drive `d`'s paced view (its daemon then ends) and wait for the daemon; one that
    outlives its mount is killed."""
    if os.path.ismount(d.served):
        p = subprocess.run(["umount", d.served], check=False, capture_output=True, text=True, start_new_session=True)
        if p.returncode:
            left.append(f"{d.served} still mounted ({(p.stderr or p.stdout).strip()})")
            return
        done.append(f"stopped serving {d.name}")
    t0 = time.monotonic()
    while _daemon_of(d):
        try:
            os.waitpid(d.daemon, os.WNOHANG)        # ours when `up` ran in this process: reap it
        except ChildProcessError:
            pass
        if time.monotonic() - t0 > SERVE_WAIT_S:
            os.kill(d.daemon, signal.SIGKILL)
            t0 = time.monotonic()
        time.sleep(0.02)


def _majmin_of(device: str) -> str:
    return _read(f"/sys/block/{os.path.basename(device)}/dev").strip()


def down(root: str, kill: bool = False) -> list[str]:
    """Take the testbed at `root` apart; returns what it did, one line each. Processes still in
    the group keep files open on the drives: with `kill` they are killed, otherwise nothing is
    touched and the command says which they are. Raises MismatchError naming anything it could
    not remove (the state file then stays, so `down` can be run again)."""
    state = load_state(root)
    pids = group_pids(state)
    if pids and not kill:
        raise UsageError(f"processes still run in the testbed's group {state.cgroup} (pids "
                         f"{' '.join(map(str, pids[:10]))}): stop them, or `iobench testbed down --kill`")
    done: list[str] = []        # what both passes did, when there are two
    try:
        return _teardown(state, kill=True, done=done)
    except MismatchError:
        if not (kill and group_pids(state)):
            raise
    # a command entered the group after it was emptied (a run starting as a signal stopped its
    # benchmark: the child joins the group between fork and exec): killed too, and the rest taken
    # down again
    return _teardown(load_state(root), kill=True, done=done)


def _teardown(state: TestbedState, kill: bool, done: list[str] | None = None) -> list[str]:
    """One pass of `down`: what it did, added to `done` (an earlier pass's lines) and returned."""
    done = [] if done is None else done
    left: list[str] = []
    state.phase = "down"
    if kill and any(os.path.isdir(g) for g in (state.cgroup, state.ram.cgroup) if g):
        kill_group(state)
    loops = _our_loops(state)
    ours = {_majmin_of(dev) for dev in loops.values()}
    mounts = mounted_devices(_read("/proc/self/mountinfo"))
    for d in reversed(state.drives):
        if mounts.get(d.mount) in ours:
            p = subprocess.run(["umount", d.mount], check=False, capture_output=True, text=True,
                               start_new_session=True)
            if p.returncode:
                left.append(f"{d.mount} still mounted ({(p.stderr or p.stdout).strip()})")
                continue
            done.append(f"unmounted {d.mount}")
        dev = loops.get(d.image)
        if dev:
            p = subprocess.run(["losetup", "-d", dev], check=False, capture_output=True, text=True,
                               start_new_session=True)
            if p.returncode:
                left.append(f"{dev} still attached to {d.image} ({(p.stderr or p.stdout).strip()})")
                continue
            done.append(f"detached {dev}")
    t0 = time.monotonic()
    while _our_loops(state) and time.monotonic() - t0 < DETACH_WAIT_S:
        time.sleep(0.1)
    still = _our_loops(state)
    left += [f"{dev} still attached to {image}" for image, dev in still.items() if not any(dev in x for x in left)]
    for d in state.drives:
        if d.image in still:
            continue
        if d.served:
            _stop_serving(d, left, done)
            if os.path.ismount(d.served):
                continue
        for path, remove in ((d.image, os.remove), (d.mount, os.rmdir), (d.served, os.rmdir), (d.control, os.remove),
                             (d.served_log, os.remove)):
            if not path:
                continue
            if os.path.lexists(path) and not os.path.ismount(path):
                try:
                    remove(path)
                except OSError as e:
                    left.append(f"{path} not removed ({e.strerror or e})")
    for group in dict.fromkeys(g for g in (state.ram.cgroup, state.cgroup) if g):
        if os.path.isdir(group):
            try:
                os.rmdir(group)
                done.append(f"removed {group}")
            except OSError as e:
                left.append(f"{group} not removed ({e.strerror or e}; pids {group_pids(state)})")
    for enabled, group, ctl in ((state.enabled_io, state.cgroup, "io"),
                                (state.ram.enabled_memory, state.ram.cgroup, "memory")):
        if enabled and not os.path.isdir(group):
            try:
                _write(os.path.join(os.path.dirname(group), "cgroup.subtree_control"), f"-{ctl}")
            except WriteError:
                pass                        # another group uses it now: leaving it on harms nothing
    if left:
        _save(state)
        raise MismatchError(f"testbed at {state.root} only partly taken down: {'; '.join(left)}; "
                            f"run `iobench testbed down --root {state.root}` again")
    os.remove(os.path.join(state.root, STATE_FILE))
    if state.made_root:
        try:
            os.rmdir(state.root)
        except OSError:
            done.append(f"kept {state.root}: something else was put in it")
    done.append(f"testbed at {state.root} removed")
    return done


# ---- run ---------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def run_in_group(root: str, cmd: list[str], report: Callable[[str], None] | None = None) -> int:
    """Run `cmd` inside the testbed's groups (its drive I/O throttled, its memory held to the RAM
    budget) and wait for it; returns its exit code (128 + N when signal N ended it, as a shell
    says). This process stays outside the groups, so its own memory is not charged to the budget,
    and tells an OOM kill in the group while the command ran in one line (`report`) instead of
    leaving a bare SIGKILL. SIGTERM and SIGHUP are passed on to the command; a Ctrl-C at the
    terminal reaches the command itself. Should this process die, the command is killed with it."""
    say = report or (lambda msg: None)
    if not cmd:
        raise UsageError("run wants a command after --, e.g. `iobench testbed run --root DIR -- b3sum FILE`")
    if shutil.which(cmd[0]) is None:
        raise MissingError(f"{cmd[0]}: no such command")
    state = load_state(root)
    if state.phase != "up":
        raise UsageError(f"the testbed at {state.root} is {state.phase}, not up; take it down and build it again")
    groups = list(dict.fromkeys(g for g in (state.cgroup, state.ram.cgroup) if g))
    fds = []
    try:
        for g in groups:
            fds.append(os.open(os.path.join(g, "cgroup.procs"), os.O_WRONLY))
    except OSError as e:
        for fd in fds:
            os.close(fd)
        raise WriteError(f"cannot enter the testbed's group {g}: {e.strerror or e}") from None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def enter() -> None:            # in the child, between fork and exec: it runs nothing outside the groups
        me = str(os.getpid()).encode()
        for fd in fds:
            os.write(fd, me)
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    before = oom_kills(state)
    try:
        proc = subprocess.Popen(cmd, preexec_fn=enter)  # noqa: PLW1509 (one thread here; the hook only writes)
    except subprocess.SubprocessError:
        raise WriteError(f"cannot put {cmd[0]} in the testbed's groups {', '.join(groups)}") from None
    finally:
        for fd in fds:
            os.close(fd)
    passed = {s: signal.signal(s, lambda signum, frame: proc.send_signal(signum)) for s in (signal.SIGTERM, signal.SIGHUP)}
    passed[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc = proc.wait()
    finally:
        for s, h in passed.items():
            signal.signal(s, h)
    after = oom_kills(state)
    if before is not None and after is not None and after > before:
        said = " ".join([os.path.basename(cmd[0]), *cmd[1:]])
        said = f"`{said if len(said) <= 60 else said[:59] + '…'}`"
        who = said if rc == -signal.SIGKILL else f"a process of {said}"
        budget = load_state(root).ram if os.path.exists(state_path(root)) else state.ram
        say(f"OOM: {who} was killed by the kernel's OOM killer: the testbed's {budget.text()} is less than its processes' "
            "own memory (the page cache gives way, their own memory cannot); give a larger --ram, e.g. a share with an "
            "allowance: --ram ref+1G")
    return 128 - rc if rc < 0 else rc


def run_command(argv: list[str], report: Callable[[str], None]) -> int:
    """[ROOT, COMMAND...] run by `run_in_group` (bench/testbed.py's light wrapper): its exit code,
    or an error of ours said in one line (`report`) with its exit code."""
    try:
        return run_in_group(argv[0], argv[1:], report)
    except ReplicaTunerError as e:
        report(f"error: {e}")
        return e.exit_code
