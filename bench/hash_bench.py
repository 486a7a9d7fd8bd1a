"""Hashing at the drives' pace (docs/replicas.md): replicas' hashing against b3sum and the copy
floor from RAM, and sync / verify against their ideal on throttled drives, from one run.

From RAM (a tmpfs folder, /dev/shm by default; at most 3 copies of SIZE there at once, removed
afterwards), each pair run once untimed, then side by side A B A B ..., the median of 5 compared:

  hash    `replicas hash FILE` vs `b3sum FILE`                                target >= 0.9x b3sum
  sync    `replicas sync` to 2 destinations (copy, hashes, cold read-back of both, stamps) vs the
          memory copy floor, `cp` to each destination in turn (no hashing, no read-back)
  verify  `replicas verify --full` of the 3 copies vs `b3sum` of the 3 files   target >= 0.9x b3sum

Each line also gives the CPU seconds (user + system) of both sides, less sensitive than the wall
clock to other work on the machine.

On throttled drives (bench/testbed.py: root, Linux): a model on the
first drive, `replicas sync` to the other two (with its read-back) and `replicas verify --full` of
the three, each against its ideal from fio ceilings measured in the same run (as in
bench/replicas_bench.py; --part ram skips it).                             target >= 0.95 of ideal

  python bench/hash_bench.py [--part ram|drives|all] [--size 3G] [--ram /dev/shm] [--testbed-size 2G]
                             [--read internal:300,green:150,white:150] [--write-mbs 150]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from core.units import parse_size  # noqa: E402

REPLICAS = os.path.join(os.path.dirname(sys.executable), "replicas")
RUNS = 5
HASH_TARGET = VERIFY_TARGET = 0.9      # x b3sum's speed
DRIVES_TARGET = 0.95                   # of the ideal


def load() -> str:
    """The machine's load averages: what else was running while this was measured."""
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def startup() -> float:
    """Median wall seconds of `replicas verify --help` (the command line's start-up: interpreter,
    Typer, Rich, our modules) right now, on this machine as loaded as it is."""
    return statistics.median(timed([REPLICAS, "verify", "--help"])[0] for _ in range(RUNS))


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user + system) of one command, which must succeed; its output
    is discarded."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"hash_bench: {' '.join(cmd)} failed (exit {p.returncode}): {err.strip()[-300:]}")
    return wall, ru.ru_utime + ru.ru_stime


def abab(name: str, ours, theirs, before=None) -> tuple[tuple[float, float], tuple[float, float]]:
    """Run ours and theirs once each untimed (the first run after a file is written pays for
    what the later ones find ready, Python's compiled modules among them), then alternately RUNS
    times each (`before()` ahead of every run, untimed); (median wall, median CPU) of each."""
    for fn in (ours, theirs):
        if before is not None:
            before()
        fn()
    a, b = [], []
    for _ in range(RUNS):
        for runs, fn in ((a, ours), (b, theirs)):
            if before is not None:
                before()
            runs.append(fn())
    print(f"  {name}: ours {' '.join(f'{w:.2f}' for w, _ in a)} s, theirs {' '.join(f'{w:.2f}' for w, _ in b)} s",
          file=sys.stderr, flush=True)
    med = lambda xs: (statistics.median(w for w, _ in xs), statistics.median(c for _, c in xs))  # noqa: E731
    return med(a), med(b)


def ram_case(size: int, ram: str) -> bool:
    root = tempfile.mkdtemp(prefix="replica-tuner-hashbench-", dir=ram)
    try:
        src_dir, d1, d2 = (os.path.join(root, n) for n in ("internal", "green", "white"))
        for d in (src_dir, d1, d2):
            os.makedirs(d)
        src = os.path.join(src_dir, "model.bin")
        subprocess.run(["dd", "if=/dev/urandom", f"of={src}", "bs=16M", f"count={size >> 24}", "iflag=fullblock",
                        "status=none"], check=True)
        size = os.path.getsize(src)
        print(f"from RAM ({ram}): a {size / 2**30:.2f} GiB file, median of {RUNS}, run A B A B; {load()}", flush=True)
        ok = True

        (h_w, h_c), (b_w, b_c) = abab("hash", lambda: timed([REPLICAS, "hash", src]), lambda: timed(["b3sum", src]))
        ok &= b_w / h_w >= HASH_TARGET
        print(f"hash 1 file        replicas {h_w:6.3f} s ({size / h_w / 1e9:5.2f} GB/s, cpu {h_c:5.2f} s)   b3sum "
              f"{b_w:6.3f} s ({size / b_w / 1e9:5.2f} GB/s, cpu {b_c:5.2f} s)   {b_w / h_w:.2f}x b3sum "
              f"(target >= {HASH_TARGET})", flush=True)

        rig = os.path.join(root, "rig")
        dests = [os.path.join(d, "model.bin") for d in (d1, d2)]

        def clear():
            for p in dests:
                if os.path.exists(p):
                    os.unlink(p)
            shutil.rmtree(rig, ignore_errors=True)

        def copy_floor():
            t = [timed(["cp", src, p]) for p in dests]
            return sum(w for w, _ in t), sum(c for _, c in t)

        (s_w, s_c), (c_w, c_c) = abab("sync", lambda: timed([REPLICAS, "sync", "--rig", rig, "--allow-same-device", "--quiet",
                                                             src, d1, d2]), copy_floor, before=clear)
        clear()
        timed([REPLICAS, "sync", "--rig", rig, "--allow-same-device", "--quiet", src, d1, d2])   # the copies verify reads
        print(f"sync to 2          replicas {s_w:6.3f} s (cpu {s_c:5.2f} s)   cp to each in turn {c_w:6.3f} s (cpu "
              f"{c_c:5.2f} s)   {c_w / s_w:.2f}x the copy floor (sync also hashes the source and reads both copies "
              f"back)", flush=True)

        members = [src] + dests
        (v_w, v_c), (b_w, b_c) = abab("verify", lambda: timed([REPLICAS, "verify", "--rig", rig, "--full", "--quiet"]),
                                      lambda: timed(["b3sum", *members]))
        ok &= b_w / v_w >= VERIFY_TARGET
        print(f"verify --full of 3 replicas {v_w:6.3f} s ({3 * size / v_w / 1e9:5.2f} GB/s, cpu {v_c:5.2f} s)   b3sum of 3 "
              f"{b_w:6.3f} s ({3 * size / b_w / 1e9:5.2f} GB/s, cpu {b_c:5.2f} s)   {b_w / v_w:.2f}x b3sum "
              f"(target >= {VERIFY_TARGET}); the command's start-up alone {startup():.2f} s", flush=True)
        print(f"(after: {load()})", flush=True)
        return ok
    finally:
        shutil.rmtree(root, ignore_errors=True)


def drives_case(size: int, a) -> bool:
    from bench.replicas_bench import WARM, measure_ceilings
    from bench.testbed import Testbed, parse_drives, write_random

    ceilings = parse_drives(a.read, "--read", three="the source first")
    names = list(ceilings)
    src_name, dst_names = names[0], names[1:3]
    with Testbed(ceilings, write_mbs=a.write_mbs) as tb:
        src = os.path.join(tb.mount(src_name), "model.bin")
        print(f"throttled drives: read {a.read} MB/s, write {a.write_mbs:g} MB/s; a {size / 1e9:.2f} GB file; {load()}",
              flush=True)
        write_random([src], size, seed=1)
        read_bw, write_bw = measure_ceilings(tb, src_name, src, size, dst_names, min(size, 512 << 20))
        dirs = [os.path.join(tb.mount(n), "replica") for n in dst_names]
        for d in dirs:
            os.makedirs(d)
        rig = os.path.join(tb.root, "rig")
        t_sync = tb.timed([REPLICAS, "sync", "--rig", rig, "--quiet", src, *dirs], warm=WARM)
        t_verify = tb.timed([REPLICAS, "verify", "--rig", rig, "--full", "--quiet"], warm=WARM)
    ideal_copy = max(size / read_bw[src_name], max(size / write_bw[n] for n in dst_names))
    ideal_sync = ideal_copy + max(size / read_bw[n] for n in dst_names)      # the copy, then the slowest read-back
    ideal_verify = max(size / read_bw[n] for n in [src_name] + dst_names)   # drives in parallel: the slowest
    print("ceilings (fio)     " + " ".join(f"{n}: read {read_bw[n] / 1e6:.0f}" + (f" write {write_bw[n] / 1e6:.0f}"
                                                                                   if n in write_bw else "") + " MB/s"
                                          for n in read_bw))
    print(f"sync to 2          {t_sync:7.2f} s   ideal {ideal_sync:6.2f} s (copy, then the slowest read-back)   "
          f"{ideal_sync / t_sync:.3f} of ideal (target >= {DRIVES_TARGET})")
    print(f"verify --full of 3 {t_verify:7.2f} s   ideal {ideal_verify:6.2f} s (the slowest drive's read)   "
          f"{ideal_verify / t_verify:.3f} of ideal (target >= {DRIVES_TARGET})", flush=True)
    print(f"the command's start-up alone (replicas verify --help, not throttled) {startup():.2f} s; (after: {load()})",
          flush=True)
    return ideal_sync / t_sync >= DRIVES_TARGET and ideal_verify / t_verify >= DRIVES_TARGET


def main() -> None:
    # The commands run as a user's install runs them: with their bytecode cached (pip compiles it at
    # install time, an editable install writes it on first use). An environment that forbids writing
    # it (PYTHONDONTWRITEBYTECODE) would have every timed run compile our modules again, ~45 ms a run
    # on the 2-core test machine, a cost no user pays; the untimed first run of each pair caches it.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="3G", help="the file's bytes in RAM (3 copies are kept there at once)")
    ap.add_argument("--ram", default="/dev/shm", help="a folder on tmpfs")
    ap.add_argument("--part", choices=("ram", "drives", "all"), default="all",
                    help="ram: from RAM only; drives: the throttled drives only")
    ap.add_argument("--testbed-size", default="2G", help="the file's bytes on the throttled drives")
    ap.add_argument("--read", default="internal:300,green:150,white:150", help="NAME:MB/s read ceilings, the source first")
    ap.add_argument("--write-mbs", type=float, default=150)
    a = ap.parse_args()
    for tool in ("b3sum", "cp", "dd"):
        if shutil.which(tool) is None:
            raise SystemExit(f"hash_bench: {tool} not found (apt-get install b3sum coreutils)")
    ok = True
    if a.part in ("ram", "all"):
        ok &= ram_case(parse_size(a.size), a.ram)
    if a.part in ("drives", "all"):
        ok &= drives_case(parse_size(a.testbed_size), a)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
