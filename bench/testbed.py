"""Throttled test drives for benchmarks: a context manager around ../shared/testbed/drives.

    with Testbed({"internal": 300, "green": 150, "white": 150}, write_mbs=150) as tb:
        tb.mount("green")              # where to put files
        tb.run(["b3sum", path])        # a command whose I/O sees the throttles
        tb.drop_caches()

The testbed is always taken down on exit (loop devices detached, blkio group removed).
Benchmarks hold /tmp/replica-tuner-testbed.lock while they run so measurements never collide
(the class takes the lock itself: do not wrap a script that uses it in `flock` on the same file).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVES = os.path.join(os.path.dirname(ROOT), "shared", "testbed", "drives")
LOCK = "/tmp/replica-tuner-testbed.lock"


def available() -> tuple[bool, str]:
    if not os.path.exists(DRIVES):
        return False, f"{DRIVES} not found"
    p = subprocess.run([sys.executable, DRIVES, "check"], capture_output=True, text=True)
    return p.returncode == 0, p.stdout.strip()


def _terminate(signum, frame):
    raise SystemExit(f"terminated by signal {signum}")


class Testbed:
    def __init__(self, read_mbs: dict[str, float], *, write_mbs: float = 0, iops: dict[str, int] | None = None,
                 size: str = "3G", root: str | None = None):
        self.read_mbs, self.write_mbs, self.iops, self.size = read_mbs, write_mbs, iops or {}, size
        self.root = root or tempfile.mkdtemp(prefix="rt-testbed-", dir="/var/tmp")
        self.state: dict = {}
        self._lock = None

    def __enter__(self) -> "Testbed":
        # `timeout` and CI send SIGTERM: turn it into an exception so the testbed still comes down.
        signal.signal(signal.SIGTERM, _terminate)
        ok, why = available()
        if not ok:
            raise SystemExit(f"testbed unavailable: {why}")
        self._lock = open(LOCK, "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        cmd = [sys.executable, DRIVES, "up", "--root", self.root, "--size", self.size]
        for name, mbs in self.read_mbs.items():
            cmd += ["--drive", f"{name}:{mbs}"]
        for name, n in self.iops.items():
            cmd += ["--iops", f"{name}:{n}"]
        if self.write_mbs:
            cmd += ["--write-mbs", str(self.write_mbs)]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as e:
            self._release()
            raise SystemExit(f"testbed up failed: {e.stderr or e.stdout}")
        with open(os.path.join(self.root, "testbed.json")) as f:
            self.state = json.load(f)
        return self

    def __exit__(self, *exc) -> None:
        try:
            subprocess.run([sys.executable, DRIVES, "down", "--root", self.root], capture_output=True, text=True)
        finally:
            self._release()

    def _release(self) -> None:
        if self._lock:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def mount(self, name: str) -> str:
        return next(d["mount"] for d in self.state["drives"] if d["name"] == name)

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        """Run a command inside the testbed's blkio group (its reads and writes are throttled)."""
        return subprocess.run([sys.executable, DRIVES, "run", "--root", self.root, "--", *cmd], **kw)

    def timed(self, cmd: list[str], cold: bool = True, warm: list[str] | None = None) -> float:
        """Wall seconds of a throttled command, page cache dropped first; raises if it fails.

        `warm`, if given, runs after the drop and before the clock starts: it loads the tool's
        own code (e.g. `replicas --help`) so the figure is about the data, not about reading a
        Python interpreter's files back from a cold disk.
        """
        if cold:
            self.drop_caches()
        if warm:
            subprocess.run(warm, capture_output=True)
        t0 = time.perf_counter()
        p = self.run(cmd, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
        return dt

    @staticmethod
    def drop_caches() -> None:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def fill_random(path: str, size: int, seed: int = 0) -> None:
    """A file of `size` pseudo-random bytes, durable on its drive."""
    import numpy as np

    rng = np.random.default_rng(seed)
    block = 16 << 20
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(block, left)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n
        f.flush()
        os.fsync(f.fileno())


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
