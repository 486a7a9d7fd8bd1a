"""The throttled test drives every benchmark runs on: one module for finding the drives tool,
the lock, building and always taking down the testbed, dropping caches, waiting for writeback
and writing random files.

    with Testbed({"internal": 300, "green": 150, "white": 150}, write_mbs=150) as tb:
        path = os.path.join(tb.mount("green"), "model.bin")
        write_random([path], 2 << 30, seed=1)
        wait_writeback()
        tb.run(["b3sum", path])        # a command whose I/O sees the throttles
        drop_caches()

The drives tool (`drives check/up/run/show/down`: loop-device drives with cgroup-v1 blkio
throttles; root, Linux) is $REPLICA_TUNER_TESTBED (the tool, or a folder holding `drives`), else
../shared/testbed/drives next to the repository. Where it is missing or the machine cannot host
it, the benchmark says so in one line and exits 2.

The tool keeps no lock of its own, so a Testbed holds LOCK from before `drives up` until after
`drives down`: two benchmarks never measure each other (a script wrapped in `flock LOCK` is
recognised and not blocked by its own wrapper). The testbed always comes down, on leaving the
block, on an exception and on SIGINT, SIGTERM or SIGHUP (exit 130): processes left in its blkio
group are killed, `drives down` unmounts, detaches the loop devices and removes the group, and a
root folder the Testbed made is deleted. MB here is 10**6 bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import NoReturn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = "REPLICA_TUNER_TESTBED"
BESIDE_REPO = os.path.join("..", "shared", "testbed", "drives")   # relative to REPO
LOCK = "/tmp/replica-tuner-testbed.lock"    # machine-wide on purpose: every clone shares the disk
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prog() -> str:
    return os.path.splitext(os.path.basename(sys.argv[0] or "bench"))[0]


def say(msg: str) -> None:
    print(f"{_prog()}: {msg}", file=sys.stderr, flush=True)


def usage_exit(msg: str) -> NoReturn:
    """One line on stderr, exit 2: bad input, or no testbed this benchmark can use."""
    say(msg)
    raise SystemExit(EXIT_USAGE)


def find_drives() -> str:
    """Path of the drives tool ($REPLICA_TUNER_TESTBED, else ../shared/testbed/drives beside the
    repository); exits 2 with one line when it is not there."""
    given = os.environ.get(ENV)
    if given:
        path = os.path.join(given, "drives") if os.path.isdir(given) else given
        if not os.path.isfile(path):
            usage_exit(f"{ENV}={given} is not the drives tool (no such file); point it at the testbed's drives script")
        return os.path.abspath(path)
    path = os.path.normpath(os.path.join(REPO, BESIDE_REPO))
    if not os.path.isfile(path):
        usage_exit(f"no testbed: {ENV} is not set and there is no {BESIDE_REPO} beside the repository; "
                    f"set {ENV} to the testbed's drives script")
    return path


def require_testbed() -> str:
    """The drives tool, once `drives check` says this machine can host it; else one line, exit 2."""
    drives = find_drives()
    p = subprocess.run([sys.executable, drives, "check"], check=False, capture_output=True, text=True)
    if p.returncode:
        why = (p.stdout.strip() or p.stderr.strip() or f"exit {p.returncode}").splitlines()[-1]
        usage_exit(f"testbed {drives} cannot run here ({why}): it needs root, loop devices and cgroup-v1 blkio")
    return drives


def parse_drives(items, what: str = "--drive", zero_ok: bool = False) -> dict[str, float]:
    """'a:200,b:120' or ['a:200', 'b:120'] -> {'a': 200.0, 'b': 120.0} (NAME:NUMBER, order kept;
    0 only where `zero_ok`, e.g. an IOPS ceiling of 0 is none); anything else: one line, exit 2."""
    out: dict[str, float] = {}
    for item in (x.strip() for it in ([items] if isinstance(items, str) else items) for x in it.split(",")):
        name, _, value = item.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not name or name in out or not (number >= 0 if zero_ok else number > 0):
            usage_exit(f"{what} {item!r}: want NAME:NUMBER, each name once, the number "
                       f"{'0 or more' if zero_ok else 'above 0'} (e.g. a:200)")
        out[name] = number
    return out


def drop_caches() -> None:
    """Write dirty pages out, then drop the page cache (root): the next read comes from the drive."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def pending_writeback() -> int:
    """Bytes the host still has to write back (Dirty + Writeback in /proc/meminfo)."""
    with open("/proc/meminfo") as f:
        kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}
    return (kb.get("Dirty", 0) + kb.get("Writeback", 0)) * 1024


def wait_writeback(quiet_s: float = 5.0, timeout_s: float = 120.0, limit: int = 64 << 20) -> str:
    """Flush, wait up to `timeout_s` seconds until less than `limit` bytes wait for writeback, then
    `quiet_s` seconds more; returns the conditions in one line. Writeback competes with the reads
    being measured, and on a VM the hypervisor keeps writing our files out after this kernel is
    done (the first trials after writing 4.5 GB stalled for 0.3-0.5 s without the wait)."""
    t0 = time.monotonic()
    os.sync()
    while time.monotonic() - t0 < timeout_s and pending_writeback() > limit:
        time.sleep(0.5)
    drained = time.monotonic() - t0
    time.sleep(quiet_s)
    return (f"load average {os.getloadavg()[0]:.1f}, dirty+writeback {pending_writeback() / 1e6:.0f} MB "
            f"(drained in {drained:.0f}s, then {quiet_s:g}s quiet)")


def write_random(paths: list[str], size: int, seed: int = 0, block: int = 16 << 20) -> None:
    """The same `size` pseudo-random bytes (from `seed`) to every path: generated once, fanned
    out, each file fsynced."""
    import numpy as np

    rng = np.random.default_rng(seed)
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(p, "wb")) for p in paths]
        left = size
        while left > 0:
            data = rng.bytes(min(block, left))
            for f in files:
                f.write(data)
            left -= len(data)
        for f in files:
            f.flush()
            os.fsync(f.fileno())


def _ancestors() -> set[int]:
    pids, pid = set(), os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _lock_holders(fd: int) -> list[int]:
    """Pids holding a flock on the open file `fd` (from /proc/locks; waiters are left out)."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = []
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if "->" not in parts and len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == key:
                holders.append(int(parts[4]))
    return holders


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


class Interrupted(SystemExit):
    """A signal stopped the benchmark; raised from the handler so the testbed still comes down."""

    def __init__(self, signum: int):
        super().__init__(EXIT_INTERRUPTED)
        self.signum = signum


class Testbed:
    """Throttled drives for the length of a `with` block (see the module docstring).

    read_mbs: {name: read ceiling in MB/s}, in order (the first is usually the primary);
    write_mbs: one write ceiling for every drive (0: none); iops: {name: read IOPS ceiling};
    size: each drive's image size ("3G"); root: the testbed folder (default: a new one in
    /var/tmp, deleted afterwards; a given root is only removed if it is left empty).
    """

    def __init__(self, read_mbs: dict[str, float], *, write_mbs: float = 0, iops: dict[str, float] | None = None,
                 size: str = "3G", root: str | None = None):
        self.read_mbs, self.write_mbs, self.iops, self.size = dict(read_mbs), write_mbs, dict(iops or {}), size
        self._given_root = root
        self.root = ""
        self.drives = ""
        self.state: dict = {}
        self._lock_fd: int | None = None
        self._handlers: dict = {}
        self._deferring = False
        self._pending: int | None = None

    # ---- entering and leaving ----------------------------------------------------------------

    def __enter__(self) -> Testbed:
        self.drives = require_testbed()
        try:
            self._install_handlers()
            self._take_lock()
            self.root = os.path.realpath(self._given_root or tempfile.mkdtemp(prefix="rt-testbed-", dir="/var/tmp"))
            self._deferring = True      # `drives up` runs to its end: a half-built testbed cannot be taken down
            try:
                up = self._up()
            finally:
                self._deferring = False
            if up.returncode:
                raise SystemExit(f"{_prog()}: drives up failed: {(up.stderr or up.stdout).strip()}")
            with open(os.path.join(self.root, "testbed.json")) as f:
                self.state = json.load(f)
            if self._pending is not None:
                raise Interrupted(self._pending)
        except BaseException as e:
            self._leave(e)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._leave(exc)

    def _leave(self, exc: BaseException | None) -> None:
        try:
            self._deferring = True      # a second Ctrl-C must not cut the teardown short
            try:
                self._down()
            finally:
                self._deferring = False
                self._release_lock()
                self._restore_handlers()
        finally:
            if isinstance(exc, Interrupted):
                say(f"interrupted by {signal.Signals(exc.signum).name}; the testbed is down")
        if self._pending is not None and exc is None:
            say(f"interrupted by {signal.Signals(self._pending).name}; the testbed is down")
            raise Interrupted(self._pending)

    def _up(self) -> subprocess.CompletedProcess:
        cmd = [sys.executable, self.drives, "up", "--root", self.root, "--size", str(self.size)]
        for name, mbs in self.read_mbs.items():
            cmd += ["--drive", f"{name}:{mbs:g}"]
        for name, n in self.iops.items():
            cmd += ["--iops", f"{name}:{n:g}"]
        if self.write_mbs:
            cmd += ["--write-mbs", f"{self.write_mbs:g}"]
        # Its own session: a Ctrl-C at the terminal reaches us (deferred), not the half-done `up`.
        # Should we die anyway (SIGKILL), the kernel sends it SIGINT, on which it undoes itself.
        if shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "INT", *cmd]
        return subprocess.run(cmd, check=False, capture_output=True, text=True, start_new_session=True)

    def _down(self) -> None:
        if not self.root:
            return
        state, state_file = self.state, os.path.join(self.root, "testbed.json")
        if os.path.exists(state_file):
            with open(state_file) as f:
                state = json.load(f)
            self._kill_group(state.get("cgroup", ""))
            p = subprocess.run([sys.executable, self.drives, "down", "--root", self.root],
                               check=False, capture_output=True, text=True, start_new_session=True)
            if p.returncode:
                say(f"drives down failed: {(p.stderr or p.stdout).strip()}")
            self._report_leftovers(state)
        if any(os.path.ismount(d["mount"]) for d in state.get("drives", [])):
            return      # never delete through a mount that is still there
        if self._given_root:
            try:
                os.rmdir(self.root)
            except OSError:
                pass
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _kill_group(cgroup: str, timeout_s: float = 10.0) -> None:
        """Kill what still runs in the testbed's blkio group (commands started with `drives run`
        and their children, all ours): an open file would keep a drive mounted."""
        procs = os.path.join(cgroup, "cgroup.procs")
        t0 = time.monotonic()
        while os.path.exists(procs) and time.monotonic() - t0 < timeout_s:
            with open(procs) as f:
                pids = [int(x) for x in f.read().split()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    @staticmethod
    def _report_leftovers(state: dict, settle_s: float = 3.0) -> None:
        """Say what `drives down` left behind; a loop device still busy detaches itself when
        released (autoclear), so give it `settle_s` seconds first."""
        images = {d["image"]: d["device"] for d in state.get("drives", []) if d.get("image")}
        t0 = time.monotonic()
        while True:
            attached = subprocess.run(["losetup", "-a"], check=False, capture_output=True, text=True).stdout
            left = [dev for image, dev in images.items() if image in attached]
            if not left or time.monotonic() - t0 > settle_s:
                break
            time.sleep(0.2)
        if left:
            say(f"loop devices still attached: {', '.join(left)} (detach with `losetup -d DEVICE`)")
        if state.get("cgroup") and os.path.isdir(state["cgroup"]):
            say(f"blkio group still present: {state['cgroup']} (remove with `rmdir`)")

    # ---- the lock ----------------------------------------------------------------------------

    def _take_lock(self) -> None:
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holders = _lock_holders(fd)
            if set(holders) & _ancestors():
                os.close(fd)    # `flock LOCK benchmark`: the wrapper holds it for us
                return
            who = "; ".join(f"pid {p}: {_cmdline(p)}" for p in holders) or "another process"
            say(f"waiting for the testbed lock {LOCK} (held by {who})")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)     # closing the last descriptor releases the flock
            self._lock_fd = None

    # ---- signals -----------------------------------------------------------------------------

    def _install_handlers(self) -> None:
        for s in SIGNALS:
            self._handlers[s] = signal.signal(s, self._on_signal)

    def _restore_handlers(self) -> None:
        for s, h in self._handlers.items():
            signal.signal(s, h)
        self._handlers = {}

    def _on_signal(self, signum: int, frame) -> None:
        if self._deferring:
            self._pending = signum
            return
        raise Interrupted(signum)

    # ---- using the drives --------------------------------------------------------------------

    def mount(self, name: str) -> str:
        return next(d["mount"] for d in self.state["drives"] if d["name"] == name)

    def mounts(self) -> dict[str, str]:
        """{drive name: mount point}, in the order the drives were given."""
        return {d["name"]: d["mount"] for d in self.state["drives"]}

    @property
    def wrap(self) -> list[str]:
        """The prefix that runs a command inside the testbed's blkio group (throttled)."""
        return [sys.executable, self.drives, "run", "--root", self.root, "--"]

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        """Run a command inside the testbed's blkio group (its reads and writes are throttled)."""
        return subprocess.run([*self.wrap, *cmd], **kw)  # noqa: PLW1510 (the caller decides)

    def timed(self, cmd: list[str], cold: bool = True, warm: list[str] | None = None) -> float:
        """Wall seconds of a throttled command, page cache dropped first; raises if it fails.

        `warm`, if given, runs after the drop and before the clock starts: it loads the tool's
        own code (e.g. `replicas --help`) so the figure is about the data, not about reading a
        Python interpreter's files back from a cold disk.
        """
        if cold:
            drop_caches()
        if warm:
            subprocess.run(warm, check=False, capture_output=True)
        t0 = time.perf_counter()
        p = self.run(cmd, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
        return dt

    drop_caches = staticmethod(drop_caches)


def fio_seq(tb: Testbed, path: str, rw: str, size: int, runtime: int = 8) -> float:
    """fio's bytes/s for 1 MiB sequential direct I/O at depth 8 on a file, throttled."""
    cmd = ["fio", "--name=ceiling", f"--filename={path}", f"--size={size}", f"--rw={rw}", "--bs=1M",
           "--direct=1", "--ioengine=libaio", "--iodepth=8", f"--runtime={runtime}", "--time_based",
           "--output-format=json"]
    p = tb.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"fio failed: {p.stderr[-1000:]}")
    job = json.loads(p.stdout)["jobs"][0]
    return float(job["read" if "read" in rw else "write"]["bw_bytes"])
