"""The throttled test drives every benchmark (and `make demo`) runs on: the project's own testbed
(`iobench testbed`, iobench/testbed.py) behind a `with` block, plus the lock, the RAM budget,
dropping caches, waiting for writeback and writing random files.

    with Testbed({"internal": 300, "green": 150, "white": 150}, write_mbs=150, ram="ref+768M") as tb:
        path = os.path.join(tb.mount("green"), "model.bin")
        write_random([path], 2 << 30, seed=1)
        tb.set_ram_for([path])         # a share's budget is set once the model is there; prints the header
        wait_writeback()
        tb.run(["b3sum", path])        # a command whose I/O sees the throttles and the RAM budget
        drop_caches()

The drives are loop devices with direct I/O, ext4, throttled by the kernel's block I/O
controller (cgroup v2 io.max, or cgroup v1 blkio.throttle); they need root and Linux. Where the
machine cannot host them (`iobench testbed check`), the benchmark says why in one line and exits 2.

The RAM budget (`ram`, as `iobench testbed up --ram` takes it: "2G", "25%", "ref", "ref+768M",
"none") holds every command run in the testbed to that much memory, page cache included, so a
model larger than the budget is read again from the drives (docs/iobench.md). A size applies
from the start; a share of the model once `set_ram_for` names the model (which then drops the
page cache: pages cached by a process outside the testbed are not charged to its budget and
would stay cached for it). `header()` is the one line every benchmark prints
first: the drives' ceilings and the budget (printed when the testbed is up, or, for a share,
when the budget is set). A command the kernel's OOM killer ends is said so in one line on its
stderr (the budget is smaller than the processes' own memory).

A Testbed holds LOCK from before the drives go up until after they are down: two benchmarks
never measure each other (a script wrapped in `flock LOCK` is recognised and not blocked by its
own wrapper). The testbed always comes down, on leaving the block, on an exception and on SIGINT,
SIGTERM or SIGHUP (exit 130): processes left in its group are killed, the drives unmounted and
detached, the group removed, and a root folder the Testbed made is deleted. A testbed a SIGKILL
left behind is taken down with `iobench testbed down --root DIR --kill`. MB here is 10**6 bytes.
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
if REPO not in sys.path:        # `python bench/x.py` as well as `python -m bench.x`
    sys.path.insert(0, REPO)

from core.coldio import aligned_buffer  # noqa: E402
from core.errors import ReplicaTunerError  # noqa: E402
from iobench import testbed  # noqa: E402
from iobench.testbed_spec import (  # noqa: E402
    PACINGS,  # noqa: F401 (the benches' --pacing choices, from here)
    STATE_FILE,
    THROTTLE,
    RamState,
    parse_pairs,
    parse_ram,
    parse_size,
    plan_drives,
    state_to_doc,
)

LOCK = "/tmp/replica-tuner-testbed.lock"    # machine-wide on purpose: every clone shares the disk
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prog() -> str:
    return os.path.splitext(os.path.basename(sys.argv[0] or "bench"))[0]


def say(msg: str) -> None:
    print(f"{_prog()}: {msg}", file=sys.stderr, flush=True)


def tool(name: str) -> list[str]:
    """argv prefix of one of the project's console scripts, in this interpreter (run from the
    repository, so its modules are the ones imported)."""
    mod = {"replicas": "replicas.main", "iobench": "iobench.cli", "planner": "planner.cli",
           "engine-bridge": "engine_bridge.cli"}[name]
    return [sys.executable, "-c", f"from {mod} import main; main()"]


def step(title: str, cmd: list[str], wrap: list[str]) -> str:
    """Run one step (inside the drives' group with a testbed's `wrap`); its stdout. A failed step
    stops the benchmark with its last error line."""
    t0 = time.perf_counter()
    p = subprocess.run([*wrap, *cmd], text=True, capture_output=True, cwd=REPO)
    print(f"  {title}: {time.perf_counter() - t0:.1f}s, exit {p.returncode}", file=sys.stderr, flush=True)
    if p.returncode != 0:
        tail = [x for x in p.stderr.splitlines() if x.strip()]
        raise SystemExit(f"{_prog()}: {title} failed (exit {p.returncode}): {tail[-1] if tail else ''}")
    return p.stdout


def usage_exit(msg: str) -> NoReturn:
    """One line on stderr, exit 2: bad input, or no testbed this benchmark can use."""
    say(msg)
    raise SystemExit(EXIT_USAGE)


def available(pacing: str = THROTTLE) -> tuple[bool, str]:
    """(True, which controller) when this machine can host the testbed, else (False, why not)."""
    problems = testbed.check(pacing)
    if problems:
        return False, "; ".join(problems)
    return True, testbed.controller()[1]


def require_testbed(pacing: str = THROTTLE) -> str:
    """The controller line, once this machine can host a testbed; else one line, exit 2."""
    ok, why = available(pacing)
    if not ok:
        usage_exit(f"no testbed here ({why}): it needs root, loop devices and a block I/O controller "
                   "(cgroup v2 io or cgroup v1 blkio), and for --pacing service FUSE, libfuse3 and mfusepy; see "
                   "`iobench testbed check`")
    return why


def parse_drives(items, what: str = "--drive", zero_ok: bool = False, three: str = "") -> dict[str, float]:
    """'a:200,b:120' or ['a:200', 'b:120'] -> {'a': 200.0, 'b': 120.0} (NAME:NUMBER, order kept;
    0 only where `zero_ok`, e.g. an IOPS ceiling of 0 is none); anything else: one line, exit 2.
    `three`: the bench takes exactly three drives, in this order (e.g. "primary first")."""
    try:
        drives = parse_pairs(items, what, zero_ok)
    except ReplicaTunerError as e:
        usage_exit(str(e))
    if three and len(drives) != 3:
        usage_exit(f"give exactly three {what} NAME:MBPS ({three})")
    return drives


def folder_drives(out: str, names) -> dict[str, str]:
    """`--folders` in a benchmark: one folder per drive name under OUT/drives, on this disk, no
    throttles (it checks a flow where there is no testbed, not the drives)."""
    mounts = {n: os.path.join(out, "drives", n) for n in names}
    for d in mounts.values():
        os.makedirs(d, exist_ok=True)
    return mounts


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


class WarmMemory:
    """Memory this machine has backed, handed to the next process a benchmark starts: `nbytes` held
    and touched between runs (`hold`), let go just before one starts (`release`). On a virtual
    machine that hands freed memory back to its host (virtio free page reporting, as here), memory
    freed more than a second or two ago faults in at ~0.1 GB/s when a process next touches it, and
    at ~8 GB/s when it was freed a moment ago: a run's fresh buffers landed on one or the other by
    chance, and the reader's lanes faulting them in held both cores for up to 0.2 s of a 0.15 s
    prefill (docs/reader.md "Round 24"). Let go just before a run, the reservoir is
    what that run's memory comes from, as on a machine that keeps its memory. 0 bytes: off."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._buf = None

    def hold(self) -> None:
        if self._buf is None and self.nbytes > 0:
            self._buf = aligned_buffer(self.nbytes, fault=True)

    def release(self) -> None:
        self._buf = None            # its only view: the mapping goes with it


class TestbedInterrupted(SystemExit):
    """A signal stopped the benchmark; raised from the handler so the testbed still comes down."""

    def __init__(self, signum: int):
        super().__init__(EXIT_INTERRUPTED)
        self.signum = signum


class Testbed:
    """Throttled drives for the length of a `with` block (see the module docstring).

    read_mbs: {name: read ceiling in MB/s}, in order (the first is usually the primary);
    write_mbs: one write ceiling for every drive (0: none); iops: {name: read IOPS ceiling};
    size: each drive's image size ("3G"); root: the testbed folder (default: a new one in
    /var/tmp, deleted afterwards; a given root is only removed if it is left empty);
    ram: the RAM budget, as `iobench testbed up --ram` takes it (None or "none": no budget);
    pacing: "throttle" (the cgroup's byte budget) or "service" (a daemon serves each request at the
    drive's rate, nothing banked while idle), as `iobench testbed up --pacing` takes it.
    """

    def __init__(self, read_mbs: dict[str, float], *, write_mbs: float = 0, iops: dict[str, float] | None = None,
                 size: str = "3G", root: str | None = None, ram: str | None = None, pacing: str = THROTTLE):
        self.read_mbs, self.write_mbs, self.iops, self.size = dict(read_mbs), write_mbs, dict(iops or {}), size
        self.pacing = pacing
        self.ram_spec = ram
        self._given_root = root
        self.root = ""
        self.controller = ""
        self.state: dict = {}
        self.ram = RamState()
        self._lock_fd: int | None = None
        self._handlers: dict = {}
        self._deferring = False
        self._pending: int | None = None
        self._ram = None

    # ---- entering and leaving ----------------------------------------------------------------

    def __enter__(self) -> Testbed:
        self.controller = require_testbed(self.pacing)
        try:
            drives = plan_drives(self.read_mbs, self.write_mbs, self.iops)
            size = parse_size(self.size)
            self._ram = parse_ram(self.ram_spec) if self.ram_spec else None
        except ReplicaTunerError as e:
            usage_exit(str(e))
        memory, why = testbed.memory_controller()
        if self._ram and memory is None:     # the drives still differ: measure them, and say what is missing
            say(f"--ram {self.ram_spec}: {why}, so no RAM budget: the page cache may keep the whole model")
            self._ram = None
        try:
            self._install_handlers()
            self._take_lock()
            self.root = os.path.realpath(self._given_root or tempfile.mkdtemp(prefix="rt-testbed-", dir="/var/tmp"))
            self._deferring = True      # `up` runs to its end (or undoes itself): no half-built testbed to guess at
            try:
                sized = self._ram if self._ram and not self._ram.needs_model else None
                up = testbed.up(self.root, drives, size, ram=sized, pacing=self.pacing)
                self.state, self.ram = state_to_doc(up), up.ram
            except ReplicaTunerError as e:
                raise SystemExit(f"{_prog()}: testbed up failed: {e}") from None
            finally:
                self._deferring = False
            if self._pending is not None:
                raise TestbedInterrupted(self._pending)
        except BaseException as e:
            self._leave(e)
            raise
        print(self.header(), flush=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._leave(exc)

    def _leave(self, exc: BaseException | None) -> None:
        down = False
        try:
            self._deferring = True      # a second Ctrl-C must not cut the teardown short
            try:
                down = self._down()
            finally:
                self._deferring = False
                self._release_lock()
                self._restore_handlers()
        finally:
            said = "the testbed is down" if down else "the testbed is NOT down (said above)"
            if isinstance(exc, TestbedInterrupted):
                say(f"interrupted by {signal.Signals(exc.signum).name}; {said}")
        if self._pending is not None and exc is None:
            say(f"interrupted by {signal.Signals(self._pending).name}; {said}")
            raise TestbedInterrupted(self._pending)

    def _down(self) -> bool:
        """Kill what still runs in the group, take the drives down, delete a root we made; whether
        the testbed is down (else the line said why)."""
        if not self.root:
            return True
        if os.path.exists(os.path.join(self.root, STATE_FILE)):
            try:
                testbed.down(self.root, kill=True)
            except ReplicaTunerError as e:
                say(f"testbed down: {e}")
                return False    # never delete through a mount that is still there
        if self._given_root:
            with contextlib.suppress(OSError):
                os.rmdir(self.root)
        elif not any(os.path.ismount(os.path.join(self.root, n)) for n in self.read_mbs):
            shutil.rmtree(self.root, ignore_errors=True)
        return True

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
        raise TestbedInterrupted(signum)

    # ---- the header and the RAM budget ------------------------------------------------------

    def header(self) -> str:
        """The line every benchmark prints first: the drives' read ceilings, the throttle and the RAM budget."""
        drives = ", ".join(f"{n} {v:g}" for n, v in self.read_mbs.items())
        iops = "".join(f", {n} {v:g} IOPS" for n, v in self.iops.items() if v)
        ram = self.ram.text()
        if self.ram.cgroup and self.ram.limit:
            ram += f" (cgroup {self.ram.controller} memory)"
        elif self._ram and self._ram.needs_model:
            ram = f"RAM budget {self._ram.text} of the model: set once the model is written"
        elif self.ram_spec and not self._ram:
            ram += f" (--ram {self.ram_spec})"
        paced = (f"{self.controller}" if self.pacing == THROTTLE else
                 "served one request at a time in bytes / rate by a FUSE daemon, nothing banked while idle")
        return f"testbed: drives {drives} MB/s read{iops} ({paced}); {ram}"

    def set_ram_for(self, model, ram: str | None = None) -> str:
        """Set the RAM budget for the model now on the drives (its file or folder paths, or its
        bytes): the share given as `ram` here or to the Testbed, of the model's bytes; then drop
        the page cache, so pages cached by a process outside the testbed (a copy the benchmark
        made itself) are read again under the budget. Prints the header and returns it. Called
        again for another model (or with another `ram`), it sets the budget again; a size or no
        budget is left as it is, and so is everything where the machine has no memory controller."""
        spec = self._ram
        if ram is not None:
            try:
                spec = parse_ram(ram)
            except ReplicaTunerError as e:
                raise SystemExit(f"{_prog()}: {e}") from None
        if spec is not None and spec.needs_model and self.ram.cgroup:
            nbytes = model if isinstance(model, int) else testbed.bytes_of([str(p) for p in model])
            try:
                self.ram = testbed.set_ram(self.root, spec, nbytes).ram
            except ReplicaTunerError as e:
                raise SystemExit(f"{_prog()}: the RAM budget: {e}") from None
            drop_caches()
        line = self.header()
        print(line, flush=True)
        return line

    # ---- using the drives --------------------------------------------------------------------

    def mount(self, name: str) -> str:
        return next(d["mount"] for d in self.state["drives"] if d["name"] == name)

    def mounts(self) -> dict[str, str]:
        """{drive name: mount point}, in the order the drives were given."""
        return {d["name"]: d["mount"] for d in self.state["drives"]}

    @property
    def wrap(self) -> list[str]:
        """The prefix that runs a command inside the testbed's groups (throttled, held to the RAM
        budget): a Python outside the groups that starts the command in them, waits for it, exits
        with its code and says an OOM kill in one line on stderr; light enough not to weigh on
        timed commands, and its own memory is not charged to the budget."""
        return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                "from iobench.testbed import run_command; "
                "sys.exit(run_command(sys.argv[2:], lambda m: print('testbed:', m, file=sys.stderr)))", REPO, self.root]

    def throttle(self, name: str, read_mbs: float) -> None:
        """Change drive `name`'s read ceiling now, while commands run (a drive that slows or recovers)."""
        testbed.set_read_limit(self.root, name, read_mbs)

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        """Run a command inside the testbed's groups (its reads and writes throttled, its memory held to the budget)."""
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

    def memory_counters(self, reset: bool = False) -> dict | None:
        """The memory group's {peak, at_limit} (`iobench.testbed.memory_counters`); with `reset`,
        its peak started afresh first, and `peak` None where the kernel cannot restart it. None
        without a memory group."""
        state = testbed.load_state(self.root)
        fresh = testbed.reset_memory_peak(state) if reset else True
        got = testbed.memory_counters(state)
        if got is not None and not fresh:
            got["peak"] = None
        return got

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
