"""Throttled test drives on one Linux machine (root): `iobench testbed check|up|run|show|down`.

Each drive is an ext4 file system on a loop device with direct I/O on its backing image (a
hidden file in the testbed folder), mounted at <root>/<name>; one cgroup caps each device's
reads (and writes, IOPS): `io.max` on cgroup v2 when its io controller is on the unified
hierarchy, `blkio.throttle.*` on cgroup v1 otherwise. A process placed in the group (`run`) sees
drive N's ceilings on drive N. The pure parts (limits, lines, state) are in testbed_spec.py.

What `up` makes is written to <root>/testbed.json (atomically) before and after each step, so
`down` takes apart a testbed a crash left half-built, and touches only what the state names and
the machine confirms is ours: a loop device only if its backing file is one of our images, a
mount only if a loop device of ours is mounted there. `up` builds only in a new or empty folder
and refuses a group that already exists. MB here is 10**6 bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import os
import shutil
import signal
import subprocess
import time
from typing import Callable

from core.errors import MismatchError, MissingError, UsageError, WriteError
from core.jsonfile import read_json, write_json

from .testbed_spec import (
    STATE_FILE,
    STATE_KIND,
    STATE_SCHEMA,
    V2,
    Controller,
    DriveLimits,
    TestbedState,
    backing_path,
    cgroup_mounts,
    choose_controller,
    mounted_devices,
    new_state,
    state_from_doc,
    state_to_doc,
    v1_lines,
    v2_line,
)

TOOLS = ("losetup", "mkfs.ext4", "mount", "umount")
DETACH_WAIT_S = 10.0        # a loop device detaches lazily (autoclear) once its last user lets go


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


def check() -> list[str]:
    """Why this machine cannot host a testbed (empty: it can)."""
    problems = []
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        problems.append("not root")
    if not os.path.exists("/dev/loop-control"):
        problems.append("no loop devices (/dev/loop-control)")
    ctl, why = controller()
    if ctl is None:
        problems.append(f"no block I/O controller ({why})")
    problems += [f"no {tool} on PATH" for tool in TOOLS if shutil.which(tool) is None]
    return problems


def state_path(root: str) -> str:
    return os.path.join(os.path.realpath(root), STATE_FILE)


def load_state(root: str) -> TestbedState:
    """The testbed at `root`: exit 3 when there is none, exit 2 when the file is not ours."""
    path = state_path(root)
    doc = read_json(path, STATE_KIND, "build one with `iobench testbed up`", schema=STATE_SCHEMA, what="testbed state")
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

def up(root: str, drives: tuple[DriveLimits, ...], size: int, report: Callable[[str], None] | None = None) -> TestbedState:
    """Build the testbed at `root` (a new or empty folder): one `size`-byte drive per entry of
    `drives`, throttled. On any failure, or an exception such as KeyboardInterrupt, what was made
    is taken down again before the error goes on."""
    say = report or (lambda msg: None)
    problems = check()
    if problems:
        raise UsageError(f"cannot build a testbed here: {', '.join(problems)}; see `iobench testbed check`")
    root = os.path.realpath(root)
    if os.path.exists(os.path.join(root, STATE_FILE)):
        raise UsageError(f"{root}: a testbed is already up there; take it down with `iobench testbed down --root {root}`")
    if os.path.exists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise UsageError(f"{root}: exists and is not an empty folder; a testbed is only built in a new or empty "
                         "folder, so nothing in it is ever touched: choose another --root")
    ctl, _ = controller()
    made_root = not os.path.exists(root)
    state = new_state(root, ctl, drives, size, made_root,
                      datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if os.path.exists(state.cgroup):
        raise UsageError(f"{state.cgroup}: a group of that name exists and this testbed did not make it; "
                         "remove it (rmdir) if it is a leftover, or choose another --root")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise WriteError(f"cannot create the testbed folder {root}: {e.strerror or e}") from None
    try:
        _save(state)                       # the plan first: a crash from here on leaves a state to undo
        _build(state, say)
    except BaseException:
        try:
            _teardown(state, kill=True)
        except MismatchError as e:      # the build's own error is the one to see; this one too
            say(str(e))
        raise
    return state


def _build(state: TestbedState, say: Callable[[str], None]) -> None:
    os.mkdir(state.cgroup)
    if state.controller == V2:
        parent = os.path.dirname(state.cgroup)
        if "io" not in _read(os.path.join(parent, "cgroup.subtree_control")).split():
            state.enabled_io = True
            _save(state)
            _write(os.path.join(parent, "cgroup.subtree_control"), "+io")
    for d in state.drives:
        with open(d.image, "xb") as f:     # "x": never reuse a file someone else made
            f.truncate(state.size)
        d.device = _sh("losetup", "--find", "--show", "--direct-io=on", d.image)
        st = os.stat(d.device)
        d.majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        _save(state)
        _sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", d.device)
        os.mkdir(d.mount)
        _sh("mount", d.device, d.mount)
        d.mounted = True
        _save(state)
        _limit(state, d.majmin, d.limits)
        say(f"{d.name}: {d.device} on {d.mount}, read {d.limits.read_mbs:g} MB/s")
    state.phase = "up"
    _save(state)


def _limit(state: TestbedState, majmin: str, limits: DriveLimits) -> None:
    if state.controller == V2:
        _write(os.path.join(state.cgroup, "io.max"), v2_line(majmin, limits))
    else:
        for fname, line in v1_lines(majmin, limits):
            _write(os.path.join(state.cgroup, fname), line)


def set_read_limit(root: str, name: str, read_mbs: float) -> None:
    """Change drive `name`'s read ceiling while the testbed is up (a drive that slows or recovers
    mid-run); its other limits stay. The change is not written to the state file: `down` needs
    only the devices."""
    state = load_state(root)
    for d in state.drives:
        if d.name == name:
            _limit(state, d.majmin, dataclasses.replace(d.limits, read_mbs=read_mbs))
            return
    raise UsageError(f"testbed at {root}: no drive named {name!r} (it has {', '.join(x.name for x in state.drives)})")


# ---- down --------------------------------------------------------------------------------------

def group_pids(state: TestbedState) -> list[int]:
    return [int(x) for x in _read(os.path.join(state.cgroup, "cgroup.procs")).split()]


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
    """{image: /dev/loopN} for every loop device backed by one of our images (whatever the state
    recorded: a crash may come between attaching and saving)."""
    images = {d.image for d in state.drives}
    out = {}
    for f in glob.glob("/sys/block/loop*/loop/backing_file"):
        path = backing_path(_read(f))
        if path in images:
            out[path] = "/dev/" + f.split("/")[3]
    return out


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
    return _teardown(state, kill=True)


def _teardown(state: TestbedState, kill: bool) -> list[str]:
    done, left = [], []
    state.phase = "down"
    if kill and os.path.isdir(state.cgroup):
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
        for path, remove in ((d.image, os.remove), (d.mount, os.rmdir)):
            if os.path.lexists(path) and not os.path.ismount(path):
                try:
                    remove(path)
                except OSError as e:
                    left.append(f"{path} not removed ({e.strerror or e})")
    if os.path.isdir(state.cgroup):
        try:
            os.rmdir(state.cgroup)
            done.append(f"removed {state.cgroup}")
        except OSError as e:
            left.append(f"{state.cgroup} not removed ({e.strerror or e}; pids {group_pids(state)})")
    if state.enabled_io and not os.path.isdir(state.cgroup):
        parent = os.path.dirname(state.cgroup)
        try:
            _write(os.path.join(parent, "cgroup.subtree_control"), "-io")
        except WriteError:
            pass                            # another group uses io now: leaving it on harms nothing
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

def join_group(root: str, pid: int = 0) -> TestbedState:
    """Put process `pid` (0: this one) in the testbed's group; its children follow it."""
    state = load_state(root)
    if state.phase != "up":
        raise UsageError(f"the testbed at {state.root} is {state.phase}, not up; take it down and build it again")
    _write(os.path.join(state.cgroup, "cgroup.procs"), str(pid or os.getpid()))
    return state


def exec_in_group(root: str, cmd: list[str]) -> None:
    """Replace this process with `cmd`, inside the testbed's group (its drive I/O is throttled)."""
    if not cmd:
        raise UsageError("run wants a command after --, e.g. `iobench testbed run --root DIR -- b3sum FILE`")
    if shutil.which(cmd[0]) is None:
        raise MissingError(f"{cmd[0]}: no such command")
    join_group(root)
    os.execvp(cmd[0], cmd)
