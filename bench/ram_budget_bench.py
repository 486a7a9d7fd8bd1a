"""The testbed's RAM budget, measured: a file larger than the budget is read from the drive again the
second time, and from the page cache without the budget.

One testbed drive, one file written on it (600 MB by default, from outside the testbed and then
dropped from the cache), read whole twice in a row (buffered, 4 MiB reads) by a fresh process
inside the testbed, with the budget (100M by default) and without it, in the order A B B A, the
page cache dropped before each arm. Per arm: each read's seconds and the bytes it made the block
layer fetch (/proc/PID/io read_bytes), and what the memory group holds afterwards (memory.stat);
then the second read's time with the budget over without it. MB = 10**6 bytes.

    python -m bench.ram_budget_bench [--mb 600] [--ram 100M] [--mbs 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from bench.testbed import Testbed, drop_caches, require_testbed, usage_exit
from core.errors import ReplicaTunerError
from iobench import testbed
from iobench.testbed_spec import parse_ram

READ_TWICE = """import json, sys, time
def fetched():
    with open("/proc/self/io") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("read_bytes:"))
out = []
for _ in range(2):
    before, t0 = fetched(), time.perf_counter()
    with open(sys.argv[1], "rb", buffering=0) as f:
        while f.read(4 << 20):
            pass
    out.append([time.perf_counter() - t0, fetched() - before])
print(json.dumps(out))
"""


def arm(tb: Testbed, path: str, ram: str | None) -> dict:
    st = testbed.set_ram(tb.root, parse_ram(ram) if ram else None)
    drop_caches()
    p = tb.run([sys.executable, "-c", READ_TWICE, path], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"ram_budget_bench: the reads failed (exit {p.returncode}): {p.stderr.strip()[-300:]}")
    (t1, b1), (t2, b2) = json.loads(p.stdout)
    held = testbed.ram_status(st)
    return {"ram": ram or "none", "t1": t1, "b1": b1, "t2": t2, "b2": b2, "cache": held["cache"], "oom": held["oom_kills"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=600.0, help="The file's size, MB (10**6 bytes).")
    ap.add_argument("--ram", default="100M", help="The budget, as `iobench testbed up --ram` takes it (a size).")
    ap.add_argument("--mbs", type=float, default=2000.0, help="The drive's read ceiling, MB/s (default: above this disk's).")
    a = ap.parse_args()
    size = int(a.mb * 1e6)
    try:
        spec = parse_ram(a.ram)
    except ReplicaTunerError as e:
        usage_exit(str(e))
    if size < 1 << 20:
        usage_exit("--mb: give at least 1 MB")
    if spec is None or spec.needs_model:
        usage_exit("--ram: give a size (e.g. 100M): the file is the model here")
    require_testbed()
    if testbed.memory_controller()[0] is None:
        usage_exit(f"no RAM budget here: {testbed.memory_controller()[1]}")
    with Testbed({"disk": a.mbs}, size=f"{(size >> 20) + 256}M", ram=a.ram) as tb:
        path = os.path.join(tb.mount("disk"), "file.bin")
        with open(path, "wb") as f:
            for left in range(size, 0, -(16 << 20)):
                f.write(os.urandom(min(left, 16 << 20)))
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        runs = [arm(tb, path, r) for r in (a.ram, None, None, a.ram)]
    print(f"file {size / 1e6:.0f} MB on a testbed drive ({a.mbs:g} MB/s ceiling), read whole twice by one process; "
          f"order {' '.join(r['ram'] for r in runs)}")
    print(f"{'budget':>8} {'1st read s':>10} {'1st MB from drive':>17} {'2nd read s':>10} {'2nd MB from drive':>17} "
          f"{'cache after MB':>14} {'OOM kills':>9}")
    for r in runs:
        print(f"{r['ram']:>8} {r['t1']:10.3f} {r['b1'] / 1e6:17.1f} {r['t2']:10.3f} {r['b2'] / 1e6:17.1f} "
              f"{r['cache'] / 1e6:14.1f} {r['oom'] if r['oom'] is not None else '-':>9}")
    t_with = statistics.median(r["t2"] for r in runs if r["ram"] != "none")
    t_without = statistics.median(r["t2"] for r in runs if r["ram"] == "none")
    b_with = statistics.median(r["b2"] for r in runs if r["ram"] != "none")
    print(f"second read: {t_with:.3f} s with the budget, {t_without:.3f} s without: {t_with / t_without:.1f}x; "
          f"from the drive with the budget: {b_with / size:.0%} of the file")


if __name__ == "__main__":
    main()
