"""The testbed's throttle after idle, measured: a read that follows idle time on a throttled drive
is served at once, not at the drive's ceiling.

One testbed drive (60 MB/s by default), one file written on it, read by a fresh process inside the
testbed with O_DIRECT in reads of one size (2.5 MB by default, about a colibri expert load): first
back to back for a few seconds (the drive's rate: its ceiling), then with the drive idle for a
while before each read (20, 50, 100 and 200 ms by default), 15 reads each. Per idle time: the reads'
times against what one read takes at the ceiling. MB = 10**6 bytes.

Why it matters: blk-throttle (cgroup v1 and v2) charges a read against the group's budget of the
current time slice, and a group that idled for a read's worth of time gets the next read through
at once. An engine whose drives idle between its loads (colibri's unstriped reads: each load on one
drive) meets faster drives here than the drive curves (measured back to back) say; one whose
drives never idle (striped reads) does not (docs/planner.md, the end-to-end bench).

The same drive paced by its service time (`iobench testbed up --pacing service`: a daemon serves
each request in bytes / rate after the one before it) banks nothing: the second block of lines.

    python -m bench.throttle_burst_bench [--mbs 60] [--read-mb 2.5] [--idle-ms 20,50,100,200]
                                         [--pacing throttle,service]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from bench.testbed import PACINGS, THROTTLE, Testbed, require_testbed, usage_exit, write_random

READS = """import json, mmap, os, sys, time
path, size, idles = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
buf, total, off = mmap.mmap(-1, size), os.fstat(fd).st_size, 0
def read():
    global off
    t = time.perf_counter()
    os.preadv(fd, [buf], off)
    off = (off + size) % (total - size) // 4096 * 4096
    return time.perf_counter() - t
t0, n = time.perf_counter(), 0
while time.perf_counter() - t0 < 3:
    read()
    n += 1
out = {"back_to_back_Bps": n * size / (time.perf_counter() - t0), "idle": {}}
for ms in idles:
    ts = []
    for _ in range(15):
        time.sleep(ms / 1000)
        ts.append(read())
    out["idle"][str(ms)] = ts
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbs", type=float, default=60.0, help="The drive's read ceiling, MB/s.")
    ap.add_argument("--read-mb", type=float, default=2.5, help="The size of each read, MB (rounded down to 4 KiB).")
    ap.add_argument("--idle-ms", default="20,50,100,200", help="Idle times before each read, ms, comma-separated.")
    ap.add_argument("--pacing", default="throttle,service",
                    help="How the drive keeps its ceiling (iobench testbed up --pacing): throttle, service, or both "
                         "one after the other (default).")
    a = ap.parse_args()
    size = int(a.read_mb * 1e6) // 4096 * 4096
    try:
        idles = [float(x) for x in a.idle_ms.split(",") if x.strip()]
    except ValueError:
        usage_exit(f"--idle-ms {a.idle_ms!r}: give milliseconds separated by commas (e.g. 20,50,100)")
    if size < 4096 or a.mbs <= 0 or not idles or min(idles) < 0:
        usage_exit("--read-mb, --mbs: give positive sizes; --idle-ms: at least one time >= 0")
    pacings = [x.strip() for x in a.pacing.split(",") if x.strip()]
    if not pacings or set(pacings) - set(PACINGS):
        usage_exit(f"--pacing {a.pacing!r}: give throttle, service or both (throttle,service)")
    for pacing in pacings:
        require_testbed(pacing)
    for pacing in pacings:
        measure(a.mbs, size, idles, pacing)


def measure(mbs: float, size: int, idles: list[float], pacing: str) -> None:
    """One drive paced so: its reads back to back, then after each idle time."""
    with Testbed({"disk": mbs}, size="768M", pacing=pacing) as tb:
        path = os.path.join(tb.mount("disk"), "file.bin")
        write_random([path], 400 << 20)
        p = tb.run([sys.executable, "-c", READS, path, str(size), json.dumps(idles)], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"throttle_burst_bench: the reads failed (exit {p.returncode}): {p.stderr.strip()[-300:]}")
        r = json.loads(p.stdout)
    at_ceiling = size / (mbs * 1e6)
    how = "blk-throttle" if pacing == THROTTLE else "served in bytes / rate, --pacing service"
    print(f"one testbed drive at {mbs:g} MB/s ({how}), O_DIRECT reads of {size / 1e6:.2f} MB by one process; "
          f"one read at the ceiling takes {at_ceiling * 1000:.1f} ms")
    print(f"back to back for 3 s: {r['back_to_back_Bps'] / 1e6:.1f} MB/s")
    for ms, ts in r["idle"].items():
        med = statistics.median(ts)
        print(f"idle {float(ms):5.0f} ms before each read: median {med * 1000:6.1f} ms (min {min(ts) * 1000:.1f}, max "
              f"{max(ts) * 1000:.1f}), {size / med / 1e6:7.1f} MB/s while reading: {at_ceiling / med:5.1f}x the ceiling",
              flush=True)


if __name__ == "__main__":
    main()
