"""Why llama.cpp decodes faster on three throttled testbed drives than on one: the reads it has in
flight, one drive made faster, and drives modelled by their service time instead of a byte budget.

    LLAMA_CPP_BIN_DIR=/path/to/llama.cpp/bin .venv/bin/python -m bench.llama_cpp_inflight_bench \
        [--size 240M] [--mbs 60] [--fast 120,180] [--ram 33%] [--tokens 16] [--runs 2] [--no-service]

The model and the runs are bench/llama_cpp_drives_bench.py's (a qwen3moe Q8_0 model re-split one
tensor per file, byte-identical copies, llama.cpp's links for 1:1:1, read_ahead_kb 128, a RAM
budget of --ram of the model, llama-completion greedy with one thread, page cache dropped before
each run). The arms, in ABBA order over --runs:

- throttled: the testbed's drives (cgroup blkio throttle at --mbs MB/s each) — one drive, three,
  and one drive alone at each --fast ceiling (its throttle raised for those runs);
- service time: three FUSE views of one copy of the files in RAM (bench/service_time_fs.py, one
  daemon per view, outside the testbed's groups), each serving one read at a time in
  `latency + bytes / (--mbs MB/s)` — a drive that spends its bandwidth serving and banks none
  while idle — one drive against three (--no-service leaves them out; they need libfuse3 and
  mfusepy).

During each run the block devices' `/sys/block/loopN/inflight` (reads) and the FUSE connections'
`/sys/fs/fuse/connections/N/waiting` are sampled every ~1 ms; over decode (from the first token
on stdout to the timing lines) the bench prints the share of samples with 0, 1, 2 and 3+ reads in
flight summed over the drives, the largest sum, the share with reads on two drives or more at
once, and the decode window's read requests and their average size (/sys/block/loopN/stat).
blk-throttle holds a bio above the device until its group has the budget, so `inflight` counts
what the throttle let through; FUSE's `waiting` counts every request queued for or served by its
daemon. MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.llama_cpp_drives_bench import EVAL, PROMPT, READ_AHEAD_KB, layout_links, sha, split_on_drives  # noqa: E402
from bench.testbed import Testbed, drop_caches, require_testbed, usage_exit  # noqa: E402


def read_stat(path: str) -> tuple[int, int]:
    """(read requests completed, bytes read) of a block device."""
    with open(path) as f:
        x = f.read().split()
    return int(x[0]), int(x[2]) * 512


class Sampler(threading.Thread):
    """Sums the reads in flight over `files` (each: /sys/block/X/inflight, reads first, or a FUSE
    connection's `waiting`) every ~1 ms; `mark()` starts the window kept, `stop()` ends it."""

    def __init__(self, files: list[str]):
        super().__init__(daemon=True)
        self.files = files
        self.fds = [os.open(f, os.O_RDONLY) for f in files]
        self.counts: collections.Counter = collections.Counter()
        self.busy: collections.Counter = collections.Counter()     # drives with a read in flight at once
        self.on = False
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            each = []
            for i, fd in enumerate(self.fds):
                try:
                    each.append(int(os.pread(fd, 64, 0).split()[0]))
                except OSError:     # FUSE's control files cannot seek: read a fresh open
                    fd = os.open(self.files[i], os.O_RDONLY)
                    each.append(int(os.read(fd, 64).split()[0]))
                    os.close(fd)
            if self.on:
                self.counts[sum(each)] += 1
                self.busy[sum(1 for x in each if x)] += 1
            time.sleep(0.001)

    def stop(self) -> None:
        self.done.set()
        self.join()
        for fd in self.fds:
            os.close(fd)


def run_arm(tb: Testbed, binary: str, model: str, tokens: int, inflight: list[str], stats: list[str]) -> dict:
    drop_caches()
    sampler = Sampler(inflight)
    sampler.start()
    marks: dict = {}

    def start_window() -> None:
        if "start" not in marks:
            marks["start"] = time.perf_counter()
            marks["stat0"] = [read_stat(s) for s in stats]
            sampler.on = True

    def end_window() -> None:
        if "start" in marks and "end" not in marks:
            sampler.on = False
            marks["end"] = time.perf_counter()
            marks["stat1"] = [read_stat(s) for s in stats]

    p = subprocess.Popen([*tb.wrap, binary, "-m", model, "-lm", "mmap", "-p", PROMPT, "-n", str(tokens), "--temp",
                          "0", "--seed", "42", "-t", "1", "-no-cnv", "--no-display-prompt", "--ignore-eos", "-lv",
                          "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "OMP_THREAD_LIMIT": "1"})
    out, err = bytearray(), bytearray()

    def pump_out() -> None:
        while chunk := os.read(p.stdout.fileno(), 4096):
            start_window()
            out.extend(chunk)

    def pump_err() -> None:
        buf = b""
        while chunk := os.read(p.stderr.fileno(), 4096):
            err.extend(chunk)
            buf = (buf + chunk)[-4096:]
            if b"common_perf_print" in buf:
                end_window()

    threads = [threading.Thread(target=pump_out), threading.Thread(target=pump_err)]
    for t in threads:
        t.start()
    rc = p.wait()
    for t in threads:
        t.join()
    end_window()
    sampler.stop()
    text = err.decode(errors="replace")
    ev = EVAL.findall(text)
    window = {}
    if "stat1" in marks:
        reqs = sum(b[0] - a[0] for a, b in zip(marks["stat0"], marks["stat1"]))
        nbytes = sum(b[1] - a[1] for a, b in zip(marks["stat0"], marks["stat1"]))
        window = {"seconds": marks["end"] - marks["start"], "requests": reqs, "bytes": nbytes}
    return {"rc": rc, "decode": float(ev[-1][2]) if ev else None, "counts": dict(sampler.counts),
            "busy": dict(sampler.busy), "window": window,
            "out": hashlib.sha256(bytes(out)).hexdigest()[:16]}


def describe(r: dict) -> str:
    c = r["counts"]
    n = sum(c.values()) or 1
    share = [c.get(0, 0) / n, c.get(1, 0) / n, c.get(2, 0) / n, sum(v for k, v in c.items() if k >= 3) / n]
    w = r["window"]
    line = (f"decode {r['decode']} tok/s, in flight over decode (sum of drives, {n} samples): "
            f"0: {share[0]:.1%} 1: {share[1]:.1%} 2: {share[2]:.1%} 3+: {share[3]:.1%} max {max(c) if c else 0}; "
            f"2+ drives at once: {sum(v for k, v in r['busy'].items() if k >= 2) / n:.1%}")
    if w.get("requests"):
        line += (f"; {w['requests']} read requests, {w['bytes'] / 1e6:.1f} MB in {w['seconds']:.1f} s, "
                 f"average {w['bytes'] / w['requests'] / 1024:.0f} KiB")
    return line + f", rc {r['rc']}, output {r['out']}"


def fuse_connection(mountpoint: str) -> str:
    return f"/sys/fs/fuse/connections/{os.minor(os.stat(mountpoint).st_dev)}"


def mount_service(src: str, points: list[str], mbs: float) -> list[subprocess.Popen]:
    procs = []
    for mp in points:
        os.makedirs(mp)
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.service_time_fs", src, mp, "--mbs", str(mbs)],
                                      cwd=os.path.dirname(HERE), stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 20
    while not all(os.path.ismount(mp) for mp in points):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            unmount_service(points, procs)
            raise SystemExit("llama_cpp_inflight_bench: the service-time drives did not mount")
        time.sleep(0.1)
    if not os.path.ismount("/sys/fs/fuse/connections"):   # FUSE's control files (`waiting`), root only
        subprocess.run(["mount", "-t", "fusectl", "fusectl", "/sys/fs/fuse/connections"], check=True)
    for mp in points:
        dev = os.stat(mp).st_dev
        with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
            f.write(str(READ_AHEAD_KB))
    return procs


def unmount_service(points: list[str], procs: list[subprocess.Popen]) -> list[str]:
    said = []
    for mp in points:
        if os.path.ismount(mp):
            subprocess.run(["fusermount3", "-u", mp], check=False)
    for p in procs:
        try:
            _, e = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            _, e = p.communicate()
        said += [ln for ln in e.splitlines() if ln.startswith("service_time_fs:")]
    return said


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="240M")
    ap.add_argument("--mbs", type=float, default=60.0, help="Each drive's read ceiling, MB/s.")
    ap.add_argument("--fast", default="120,180", help="One drive's faster ceilings, MB/s.")
    ap.add_argument("--ram", default="33%")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=2, help="Runs per arm (ABBA order).")
    ap.add_argument("--no-service", action="store_true", help="Leave out the service-time drives.")
    a = ap.parse_args()
    binary = os.path.join(os.environ.get("LLAMA_CPP_BIN_DIR", ""), "llama-completion")
    if not os.access(binary, os.X_OK):
        usage_exit("set LLAMA_CPP_BIN_DIR to the folder holding llama.cpp's llama-completion (bench/build_llama_cpp.sh)")
    service = not a.no_service
    if service and (shutil.which("fusermount3") is None or subprocess.run(
            [sys.executable, "-c", "import mfusepy"], capture_output=True).returncode):
        usage_exit("the service-time drives need libfuse3 (apt fuse3) and mfusepy (pip install -e '.[bench]'); "
                   "or pass --no-service")
    require_testbed()
    fast = [float(x) for x in a.fast.split(",") if x]
    work = tempfile.mkdtemp(prefix="llama-inflight-", dir="/var/tmp")
    shm = tempfile.mkdtemp(prefix="llama-inflight-", dir="/dev/shm") if service else ""
    points = [os.path.join(work, f"s{i}") for i in (1, 2, 3)]
    procs: list[subprocess.Popen] = []
    said: list[str] = []
    try:
        src = os.path.join(work, "tiny.gguf")
        tool = os.path.join(os.path.dirname(sys.executable), "engine-bridge")
        subprocess.run([tool, "synth", src, "--format", "qwen3moe", "--size", a.size], check=True,
                       stdout=subprocess.DEVNULL)
        model_bytes = os.path.getsize(src)
        names = ["d1", "d2", "d3"]
        with Testbed({n: a.mbs for n in names}, size=f"{(model_bytes >> 20) + 400}M", ram=a.ram) as tb:
            dirs, files, devices = split_on_drives(tb, src, names, extra=(shm,) if service else (),
                                                   who="llama_cpp_inflight_bench")
            sizes = [(f, os.path.getsize(os.path.join(dirs[0], f))) for f in files]
            tb.set_ram_for(model_bytes)
            first = [os.path.join(d, files[0]) for d in dirs]
            models = {("throttled", n): layout_links(os.path.join(work, f"links{n}"), first[:n], sizes) for n in (1, 3)}
            stats = [f"/sys/block/{dev}/stat" for dev in devices.values()]
            blk = [f"/sys/block/{dev}/inflight" for dev in devices.values()]
            arms = [("throttled", 1, a.mbs), ("throttled", 3, a.mbs)] + [("throttled", 1, x) for x in fast]
            if service:
                procs = mount_service(shm, points, a.mbs)
                if not all(sha(os.path.join(p, f)) == sha(os.path.join(dirs[0], f)) for p in points for f in files):
                    raise SystemExit("llama_cpp_inflight_bench: a service-time view differs from d1's file")
                sfirst = [os.path.join(p, files[0]) for p in points]
                for n in (1, 3):
                    models[("service", n)] = layout_links(os.path.join(work, f"slinks{n}"), sfirst[:n], sizes)
                arms += [("service", 1, a.mbs), ("service", 3, a.mbs)]
            print(f"model: {model_bytes / 1e6:.1f} MB, {len(files)} files; read_ahead_kb {READ_AHEAD_KB}; budget "
                  f"{(tb.ram.limit or 0) / 1e6:.1f} MB; drives at {a.mbs:g} MB/s"
                  + (f", one drive also at {', '.join(f'{x:g}' for x in fast)}" if fast else "")
                  + ("; service-time drives at the same rate" if service else ""),
                  flush=True)
            order = []
            for i in range(a.runs):
                order += arms if i % 2 == 0 else arms[::-1]
            results: dict = collections.defaultdict(list)
            for kind, n, mbs in order:
                if kind == "throttled":
                    tb.throttle("d1", mbs)
                    r = run_arm(tb, binary, models[(kind, n)], a.tokens, blk, stats)
                    if mbs != a.mbs:
                        tb.throttle("d1", a.mbs)
                else:
                    conns = [fuse_connection(p) + "/waiting" for p in points]
                    r = run_arm(tb, binary, models[(kind, n)], a.tokens, conns, [])
                results[(kind, n, mbs)].append(r)
                print(f"  {kind} {n} drive(s) at {mbs:g} MB/s: {describe(r)}", flush=True)
            if service:
                said = unmount_service(points, procs)
                procs = []
        print("arm                              decode tok/s (each)")
        base = {}
        for kind, n, mbs in arms:
            x = [r["decode"] for r in results[(kind, n, mbs)] if r["decode"]]
            med = statistics.median(x) if x else float("nan")
            base.setdefault(kind, med)
            print(f"{kind:9} {n} drive{'s' if n > 1 else ' '} at {mbs:5g} MB/s  {med:6.2f} "
                  f"({', '.join(f'{v:.2f}' for v in x)})  {med / base[kind]:.2f}x")
        outs = {r["out"] for rr in results.values() for r in rr if r["rc"] == 0}
        print(f"outputs: {len(outs)} distinct sha256 ({', '.join(sorted(outs))})")
        for line in said:
            print(line)
    finally:
        if procs:
            unmount_service(points, procs)
        shutil.rmtree(work, ignore_errors=True)
        if shm:
            shutil.rmtree(shm, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
