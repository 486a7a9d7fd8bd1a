"""iobench on throttled drives: measured ceilings next to the throttles and next to fio, from one run.

    python3 bench/iobench_bench.py [--mbs fast:200,mid:100,slow:100] [--size 1.5G] [--seconds S] [--repeat N]

Builds a testbed (bench/testbed.py: loop-device drives throttled by the block I/O controller, cgroup v2 io.max or v1 blkio),
writes one file of random bytes on each drive, then, with every read throttled:

1. one `iobench run --preset all` over the three files (its wall time is the last figure);
2. `iobench fio FILE --preset seq` and `--preset prefill` on each file (iobench, then fio's
   bw_bytes, on the same file and shape; 3 s each by default).

It prints, from that one run: seq and prefill ceilings / throttle (target within 5 %), the spread
over repeats (target under 3 %), iobench / fio (target within 5 %) and the wall time of the full
run (target under 2 minutes). MB = 10**6 bytes. Needs root and the testbed; where they are missing
it says why in one line and exits 2. Holds the testbed lock while it runs, so benchmarks never
measure each other, and always takes the testbed down (also on SIGINT, SIGTERM and SIGHUP).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.testbed import (  # noqa: E402
    Testbed,
    drop_caches,
    parse_drives,
    require_testbed,
    say,
    wait_writeback,
    write_random,
)

_SCRIPT = os.path.join(os.path.dirname(sys.executable), "iobench")
IOBENCH = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-c", "from iobench.cli import main; main()"]

TARGET_CEILING = 0.05     # |measured / throttle - 1|
TARGET_SPREAD = 3.0       # % over repeats
TARGET_FIO = 0.05         # |iobench / fio - 1|
TARGET_WALL = 120.0       # s for --preset all on 3 drives


def parse_bytes(text: str) -> int:
    units = {"K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9}
    t = text.strip().upper()
    return int(float(t[:-1]) * units[t[-1]]) if t[-1] in units else int(t)


def ok(good: bool) -> str:
    return "ok" if good else "MISS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbs", default="fast:200,mid:100,slow:100", help="drive:MB/s read throttles")
    ap.add_argument("--size", default="1.5G", help="bytes per file (decimal suffixes)")
    ap.add_argument("--seconds", default=None, help="iobench --seconds (default: iobench's)")
    ap.add_argument("--repeat", default=None, help="iobench --repeat (default: iobench's)")
    ap.add_argument("--settle", default="30", help="seconds to let writes drain after writing the files")
    ap.add_argument("--fio-seconds", default="1", help="--seconds of each `iobench fio` window (3 windows)")
    a = ap.parse_args()
    mbs = parse_drives(a.mbs, "--mbs")
    size = parse_bytes(a.size)

    require_testbed()
    if shutil.which("fio") is None:
        say("fio not installed; the fio comparison will be skipped")

    disk = max(3, int(size * 1.3 / 1e9) + 1)
    with Testbed(mbs, size=f"{disk}G") as tb:
        mounts = tb.mounts()
        files = {name: os.path.join(mounts[name], "model.bin") for name in mbs}
        t0 = time.perf_counter()
        write_random(list(files.values()), size, seed=0)
        print(f"testbed: {', '.join(f'{n} {v:g} MB/s' for n, v in mbs.items())}; "
              f"{size / 1e9:.2f} GB file on each (written in {time.perf_counter() - t0:.0f}s)")
        extra = []
        if a.seconds:
            extra += ["--seconds", a.seconds]
        if a.repeat:
            extra += ["--repeat", a.repeat]

        # 1. one full run
        drop_caches()
        conditions = wait_writeback(quiet_s=float(a.settle), timeout_s=60)
        print(f"host before the run: {conditions}")
        rig = os.path.join(tb.root, "rig")
        t0 = time.perf_counter()
        p = tb.run(IOBENCH + ["run", *files.values(), "--preset", "all", "--rig", rig, "--json", *extra],
                   capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if p.returncode:
            print(f"iobench run failed ({p.returncode}): {p.stderr[-2000:]}")
            return 1
        result = json.loads(p.stdout)

        # 2. the same file and shape, iobench then fio
        fio = {}
        if shutil.which("fio"):
            for name, path in files.items():
                for preset in ("seq", "prefill"):
                    q = tb.run(IOBENCH + ["fio", path, "--preset", preset, "--seconds", a.fio_seconds, "--json"],
                               capture_output=True, text=True, cwd=ROOT)
                    if q.returncode:
                        print(f"iobench fio {name} {preset} failed: {q.stderr[-1000:]}")
                        continue
                    fio[(name, preset)] = json.loads(q.stdout)

    out = os.path.join(ROOT, "bench", "out")
    os.makedirs(out, exist_ok=True)
    raw = os.path.join(out, f"iobench-{time.strftime('%Y%m%dT%H%M%S')}.json")
    with open(raw, "w") as f:
        json.dump({"throttles_mbs": mbs, "wall_s": wall, "conditions": conditions, "result": result,
                   "fio": [{"drive": n, "preset": p, **r} for (n, p), r in fio.items()]}, f, indent=1)
    report(result, mbs, fio, wall)
    print(f"  raw figures: {raw}")
    return 0


def report(result: dict, mbs: dict, fio: dict, wall: float) -> None:
    s = result["settings"]
    print(f"\niobench run --preset all on {len(result['drives'])} drives: seconds {s['seconds']}, repeat {s['repeat']}, "
          f"split {':'.join(map(str, s['weights'] or []))} ({s['weights_from']})")
    print(f"{'drive':<6} {'throttle':>8} | {'seq MB/s':>8} {'/thr':>6} {'spread%':>7} | "
          f"{'prefill':>8} {'/thr':>6} {'spread%':>7} {'knee':>4} {'MiB':>5} | {'decode':>7} {'model err%':>10}")
    worst = {"ceiling": 0.0, "spread": 0.0}
    for d in result["drives"]:
        thr = mbs[d["name"]] * 1e6
        seq, pre, dec = d["presets"]["seq"], d["presets"]["prefill"], d["presets"]["decode"]
        for p in (seq, pre):
            worst["ceiling"] = max(worst["ceiling"], abs(p["bw_bytes"] / thr - 1))
            worst["spread"] = max(worst["spread"], p["spread_pct"])
        print(f"{d['name']:<6} {thr / 1e6:>8.0f} | {seq['bw_bytes'] / 1e6:>8.1f} {seq['bw_bytes'] / thr:>6.3f} "
              f"{seq['spread_pct']:>7.2f} | {pre['bw_bytes'] / 1e6:>8.1f} {pre['bw_bytes'] / thr:>6.3f} "
              f"{pre['spread_pct']:>7.2f} {pre['knee_lanes']:>4} {pre['piece_bytes'] / (1 << 20):>5.1f} | "
              f"{dec['bw_bytes'] / 1e6:>7.1f} {d['model']['fit_err_pct'] if d['model'] else float('nan'):>10.2f}")
    total = sum(mbs.values()) * 1e6
    for g in result["together"]:
        if g["preset"] in ("seq", "prefill"):
            print(f"together {g['preset']:<8} {g['bw_bytes'] / 1e6:>7.1f} MB/s / sum of throttles {total / 1e6:.0f} "
                  f"= {g['bw_bytes'] / total:.3f}  spread {g['spread_pct']:.2f}%")
    if fio:
        print(f"\n{'drive':<6} {'preset':<8} {'iobench MB/s':>12} {'fio MB/s':>9} {'iobench/fio':>11}")
        worst_fio = 0.0
        for (name, preset), r in fio.items():
            worst_fio = max(worst_fio, abs(r["ratio"] - 1))
            print(f"{name:<6} {preset:<8} {r['iobench']['bw_bytes'] / 1e6:>12.1f} {r['fio']['bw_bytes'] / 1e6:>9.1f} "
                  f"{r['ratio']:>11.3f}")
    print("\nsummary")
    print(f"  seq and prefill ceilings / throttle: worst {worst['ceiling'] * 100:.1f}% off   (target < "
          f"{TARGET_CEILING * 100:.0f}%)  {ok(worst['ceiling'] < TARGET_CEILING)}")
    print(f"  spread over repeats (seq, prefill):  worst {worst['spread']:.2f}%         (target < {TARGET_SPREAD:.0f}%)  "
          f"{ok(worst['spread'] < TARGET_SPREAD)}")
    if fio:
        print(f"  iobench / fio, same file and shape:  worst {worst_fio * 100:.1f}% off   (target < {TARGET_FIO * 100:.0f}%) "
              f" {ok(worst_fio < TARGET_FIO)}")
    print(f"  wall time of --preset all, {len(result['drives'])} drives:  {wall:.1f}s (iobench's own {result['wall_s']:.1f}s)   "
          f"(target < {TARGET_WALL:.0f}s)  {ok(wall < TARGET_WALL)}")


if __name__ == "__main__":
    sys.exit(main())
