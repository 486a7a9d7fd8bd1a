"""The split reader's own ceiling: how fast it moves bytes when storage is not the limit.

Reads from files in tmpfs (/dev/shm by default: RAM, no drive) with the engine's read shapes and
prints the reader's GB/s next to a plain single-threaded `os.preadv` loop over exactly the same
byte ranges, measured side by side in one run (ratio = reader / plain):

  prefill  32 MiB chunks, `--inflight` chunks in flight (the engine keeps 8 lanes per drive busy),
           weights 2:1:1, 8 lanes per source
  decode   expert components of 6,635,520 B at random component offsets, 9 in flight
           (3 experts x gate/up/down), weights 10:6:6

`cold=False` (page-cache reads, no O_DIRECT, no drop) measures the reader itself; `cold=True`
on tmpfs falls back to coldio's 'fadvise' mode (tmpfs has no O_DIRECT and its pages cannot be
dropped, so it only adds the fadvise call) and is shown for completeness.

  .venv/bin/python bench/reader_bench.py [--dir /dev/shm] [--size 512M] [--sources 3] [--repeat 3] [--balance]
  .venv/bin/python bench/reader_bench.py --cpu [--repeat 5]    # CPU per read: plain beside hedging+re-weighting+balancing
  .venv/bin/python bench/reader_bench.py --builds [--repeat 5] # CPU per read: the compiled reader beside its Python modules
  .venv/bin/python bench/reader_bench.py --ops                 # Python opcodes and calls per read: counted, not timed
  .venv/bin/python bench/reader_bench.py --instructions        # machine instructions per read (valgrind): counted, not timed
  .venv/bin/python bench/reader_bench.py --latency [--repeat 5]  # a decode step's reads: how long the engine waits
  .venv/bin/python bench/reader_bench.py --chunks [--repeat 5]   # prefill reads, balancing's chunks fixed or sized
  .venv/bin/python bench/reader_bench.py --pool [--pool-mib 69] [--repeat 5]   # decode after a prefill: small pool vs large

--ops counts the Python the reader runs per decode-shaped read (the --cpu shape, 1,000 reads), by a
tracer on every thread it starts: opcodes and calls, plain, each feature alone and all three, and
the functions that add the most. A count does not move with the machine's other work, as CPU time
does by more than a cut of a tenth: it shows whether a change did less work; --cpu and the stall
bench show what that is worth.

--builds measures --cpu's plain reader and all three features twice, with the reader's compiled
modules (the install compiles them where a C compiler is: docs/reader.md "Compiled") and with its
Python ones (REPLICA_TUNER_PURE=1), each measurement in a process of its own, the two in turn
`--repeat` times; it prints what the features add to the plain reader with each, and their ratio.
--ops counts Python opcodes: it runs the reader's Python modules (it runs itself again with
REPLICA_TUNER_PURE=1 where the compiled ones are in use: a tracer sees nothing of those).

--instructions counts the machine instructions the reader's process runs in user space per
decode-shaped read (the --cpu shape), plain and with all three features, under valgrind's callgrind
(Debian's `valgrind` package): each count in a process of its own, for `--ins-reads` reads and for a
fifth of them, the difference over the reads between (what opening the reader and the files cost
drops out); the two arms in turn `--repeat` times, the medians (~1 min a
repeat). Like --ops it does not move with the machine's other work, and unlike --ops it counts
the compiled modules too (and the C the Python ones run): whether a change did less work, whichever
build runs. The kernel's part (the copies from the page cache) is not counted.

--latency times what a decode step waits for: a group of 4 decode-shaped reads (835,584 B, 3 sources
at 1:1:1) submitted together and waited for, a pause of 0.5 ms (the engine's compute) between
groups, 400 groups per measurement; the 25th percentile and the median of the groups' latency, for
the plain reader, each feature alone and all three (the embedded engine's defaults), measured in
turn `--repeat` times; the medians over the repeats and their ratio to the plain reader. Where the
drives are faster than the reader (tmpfs here, NVMe on a user's rig) this is what each feature adds
to every step; the 25th percentile is the least disturbed by other work on a shared machine.

--chunks reads the engine's prefill staging reads (3 sources at 1:1:1, 8 lanes each, one read at a
time, page-cache reads) with the embedded engine's features, balancing's chunks once fixed at 1 MiB
(`--balance-chunk-max 1MiB`) and once sized to each drive's pace (the default), in turn `--repeat`
times: GB/s and this process's CPU per read (medians), their ratios, and the chunk each source ended
with. Where drives are faster than the reader, this is what the chunk's size costs.

--pool reads, with the plain reader (3 sources at 1:1:1, page-cache reads, pooled buffers), the
engine's prefill staging reads 3 at a time, then decode-shaped reads (835,584 B) 16 at a time,
once with the buffer pool a RAM budget allows (`--pool-mib`: 69 MiB, an eighth of the 552 MiB the
stall bench's `--ram 25%+512M` gives its model) and once with the default 512 MiB, in turn
`--repeat` times: the decode's CPU and minor page faults per read (medians) and the ratios. A
pool the prefill's buffers fill must still keep the decode's (each one it drops is a fresh buffer
for the next read, its pages faulted in, huge pages zeroed: docs/reader.md "Round 22").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.testbed import write_random  # noqa: E402
from core.units import parse_size  # noqa: E402
from engine_bridge.reader import build  # noqa: E402
from engine_bridge.reader.balancing import BalancePolicy  # noqa: E402
from engine_bridge.reader.buffers import POOL_BYTES  # noqa: E402
from engine_bridge.reader.settings import EMBEDDED, ReaderSettings  # noqa: E402
from engine_bridge.reader.split_reader import SplitReader  # noqa: E402
from iobench.shapes import engine_shapes  # noqa: E402
from core.coldio import aligned_buffer  # noqa: E402


def make_files(d: str, size: int, n: int) -> list[str]:
    paths = [os.path.join(d, "primary.gguf")] + [os.path.join(d, f"replica{i}.gguf") for i in range(1, n)]
    write_random(paths, size, seed=1)
    return paths


def faulted(nbytes: int):
    """An aligned buffer with every page already faulted in (long-lived staging buffers are)."""
    buf = aligned_buffer(nbytes)
    memoryview(buf).cast("B")[:] = bytes(len(buf))     # aligned_buffer gives a memoryview now, not an mmap
    return buf


def plain_loop(path: str, ranges, bufsize: int) -> float:
    """One thread, one fd, preadv into one reused buffer: the floor any reader must beat."""
    buf = memoryview(faulted(bufsize))
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for off, ln in ranges:
            done = 0
            while done < ln:
                done += os.preadv(fd, [buf[done:ln]], off + done)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def reader_loop(paths, weights, ranges, inflight: int, phase: str, cold: bool, lanes: int,
                bufsize: int, buffers: str, balance: bool = False) -> tuple[float, str]:
    """buffers: 'staged' reads into `inflight` caller buffers, 'pooled' lets the reader reuse
    its own (ticket.release()), 'fresh' takes a new buffer per read and never gives it back
    (its page faults cost more than the copy on a small VM)."""
    bufs = [faulted(bufsize) for _ in range(inflight)] if buffers == "staged" else None
    release = buffers == "pooled"
    with SplitReader(paths, weights, weights, settings=ReaderSettings(lanes=lanes, balance=balance), cold=cold) as r:
        read_in_groups(r, ranges[:inflight], inflight, phase, bufs, release)   # warm-up, untimed: lanes started,
        t0 = time.perf_counter()                                              # the pool filled once
        read_in_groups(r, ranges, inflight, phase, bufs, release)
        return time.perf_counter() - t0, r.how[0]


def read_in_groups(r: SplitReader, ranges, inflight: int, phase: str, bufs=None, release: bool = True) -> None:
    """Read `ranges` through `r`, `inflight` submitted at a time and all of them waited for before the
    next group: into the caller's `bufs` (one per read of a group) or the reader's own buffers,
    released when `release`."""
    for i in range(0, len(ranges), inflight):
        group = ranges[i:i + inflight]
        tickets = [r.submit(o, n, phase, None if bufs is None else bufs[k]) for k, (o, n) in enumerate(group)]
        for t in tickets:
            t.result()
            if release:
                t.release()


def decode_ranges(size: int, reads: int, nbytes: int = 835_584) -> list[tuple[int, int]]:
    """`reads` decode-shaped reads of `nbytes` at 4 KiB-aligned random offsets of a `size`-byte file
    (the same ones every time)."""
    rng = random.Random(2)
    return [(rng.randrange(0, (size - nbytes) // 4096) * 4096, nbytes) for _ in range(reads)]


def cpu_per_read(paths, size: int, settings: ReaderSettings, reads: int, inflight: int = 8,
                 nbytes: int = 835_584) -> tuple[float, float]:
    """µs of this process's CPU (every thread's) per decode-shaped read of `nbytes` at 4 KiB-aligned
    random offsets, `inflight` at a time, pooled buffers, page-cache reads: what the reader itself
    costs per read (on a machine bound by compute, the engine's CPU); and of it, the µs in user
    mode (the reader's Python: the copies from the page cache are the kernel's)."""
    ranges = decode_ranges(size, reads, nbytes)
    with SplitReader(paths, [1] * len(paths), [1] * len(paths), settings=settings, cold=False) as r:
        for o, n in ranges[:inflight]:          # warm-up: lanes started, the pool filled
            r.read(o, n, "decode")
        u0, c0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime, time.process_time()
        read_in_groups(r, ranges, inflight, "decode")
        c, u = time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF).ru_utime - u0
        return c / reads * 1e6, u / reads * 1e6


LATENCY_ARMS = (("plain", ReaderSettings()), ("hedging", ReaderSettings(hedge=True)),
                ("balancing", ReaderSettings(balance=True)), ("re-weighting", ReaderSettings(reweigh=True)),
                ("all three", EMBEDDED))


def group_latency(paths, size: int, settings: ReaderSettings, groups: int = 400, group: int = 4,
                  nbytes: int = 835_584, pause_s: float = 0.0005, seed: int = 2) -> tuple[float, float]:
    """(25th percentile, median) of the seconds `group` decode-shaped reads submitted together take
    to land, over `groups` groups with `pause_s` between them (the first tenth left out: the lanes
    and the pool warm up)."""
    rng = random.Random(seed)
    lat = []
    with SplitReader(paths, [1] * len(paths), [1] * len(paths), settings=settings, cold=False) as r:
        for _ in range(groups):
            ranges = [(rng.randrange(0, (size - nbytes) // 4096) * 4096, nbytes) for _ in range(group)]
            t0 = time.perf_counter()
            tickets = [r.submit(o, n, "decode") for o, n in ranges]
            for t in tickets:
                t.result()
            lat.append(time.perf_counter() - t0)
            for t in tickets:
                t.release()
            time.sleep(pause_s)
    kept = lat[groups // 10:]
    return statistics.quantiles(kept, n=4)[0], statistics.median(kept)


def latency_lines(paths, size: int, repeat: int) -> list[str]:
    """A decode step's latency per reader setting (`LATENCY_ARMS`), measured in turn `repeat` times:
    the medians over the repeats, and each one's ratio to the plain reader's."""
    got: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in LATENCY_ARMS}
    for _ in range(repeat):
        for name, settings in LATENCY_ARMS:
            got[name].append(group_latency(paths, size, settings))
    med = {name: (statistics.median(q for q, _ in v), statistics.median(m for _, m in v)) for name, v in got.items()}
    p25, p50 = med["plain"]
    out = [f"a decode step's 4 reads of 835,584 B, {len(paths)} sources at 1:1:1, 0.5 ms between steps, median of "
           f"{repeat}: latency 25th percentile / median, and / plain's"]
    for name, (q, m) in med.items():
        out.append(f"  {name:12} {q * 1e6:6.0f} / {m * 1e6:6.0f} µs   {q / p25:5.2f} / {m / p50:5.2f}")
    return out


def cpu_lines(paths, size: int, repeat: int, reads: int) -> list[str]:
    """The reader's CPU per read, plain (the engine's reads), with the embedded engine's features
    (hedging, re-weighting, balancing) and with each of them alone (`LATENCY_ARMS`), measured in
    turn `repeat` times: medians, the features' ratio to plain, what each adds to plain alone, and
    how much of what all three add is user CPU (Python)."""
    got: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in LATENCY_ARMS}
    for _ in range(repeat):
        for name, settings in LATENCY_ARMS:
            got[name].append(cpu_per_read(paths, size, settings, reads))
    med = {name: statistics.median(c for c, _ in v) for name, v in got.items()}
    user = {name: statistics.median(u for _, u in v) for name, v in got.items()}
    p, f = med["plain"], med["all three"]
    alone = ", ".join(f"{name} {med[name]:.0f} µs ({med[name] - p:+.0f})" for name, _ in LATENCY_ARMS[1:-1])
    return [f"cpu per read (decode 835,584 B, 8 in flight, {len(paths)} sources, {reads} reads, median of {repeat}): "
            f"plain {p:.0f} µs, features {f:.0f} µs, features / plain {f / p:.2f}",
            f"  each feature alone: {alone}; all three {f - p:+.0f} µs",
            f"  user CPU: plain {user['plain']:.0f} µs, features {user['all three']:.0f} µs "
            f"({user['all three'] - user['plain']:+.0f})"]


BUILDS = (("compiled", {}), ("python", {build.PURE_ENV: "1"}))


def build_lines(paths, size: int, repeat: int, reads: int, folder: str) -> list[str]:
    """`cpu_per_read` of the plain reader and of the embedded engine's features (all three), once
    with the reader's compiled modules and once with its Python ones (REPLICA_TUNER_PURE=1), each
    in a process of its own (a process runs one copy of them; its files in `folder`), the two in turn `repeat` times:
    medians, and what the features add to the plain reader with each build."""
    got: dict[str, list[dict]] = {name: [] for name, _ in BUILDS}
    how: dict[str, str] = {}
    for _ in range(repeat):
        for name, env in BUILDS:
            cmd = [sys.executable, "-m", "bench.reader_bench", "--cpu-one", "--cpu-reads", str(reads),
                   "--size", str(size), "--sources", str(len(paths)), "--dir", folder]
            out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, check=True, capture_output=True, text=True)
            one = json.loads(out.stdout)
            how[name] = one.pop("how")
            got[name].append(one)
    med = {name: {arm: statistics.median(r[arm] for r in runs) for arm in ("plain", "all three")}
           for name, runs in got.items()}
    if not how["compiled"].startswith("compiled"):
        return [f"cpu per read by build: the compiled modules are not in use here ({how['compiled']}); nothing to compare"]
    c, py = med["compiled"], med["python"]
    extra = {name: m["all three"] - m["plain"] for name, m in med.items()}
    return [f"cpu per read by build (decode 835,584 B, 8 in flight, {len(paths)} sources, {reads} reads, median of "
            f"{repeat}, each in its own process): compiled plain {c['plain']:.0f} µs, features {c['all three']:.0f} µs "
            f"({extra['compiled']:+.0f}); python plain {py['plain']:.0f} µs, features {py['all three']:.0f} µs "
            f"({extra['python']:+.0f}); what the features add, compiled / python "
            + (f"{extra['compiled'] / extra['python']:.2f}" if extra["python"] > 0 else "n/a")]


PLAIN_AND_ALL = (LATENCY_ARMS[0], LATENCY_ARMS[-1])      # plain, all three (--builds, --instructions)


def instructions(arm: str, reads: int, paths: list[str], folder: str) -> int:
    """User-space instructions of a process that opens the reader on `paths` and makes `reads`
    decode-shaped reads with arm `arm` (`--reads-one`), counted by callgrind (its output in `folder`)."""
    with tempfile.NamedTemporaryFile(prefix="reader-bench-callgrind-", dir=folder) as out:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", sys.executable, "-m",
               "bench.reader_bench", "--reads-one", arm, "--cpu-reads", str(reads), "--paths", os.pathsep.join(paths)]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        with open(out.name, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
    raise RuntimeError(f"callgrind wrote no total for {arm} ({reads} reads)")


def instruction_lines(paths, reads: int, folder: str, repeat: int) -> list[str]:
    """Instructions per decode-shaped read, plain and with all three features: each arm counted for
    `reads` and for a fifth of them, each in a process of its own; per read, the difference over the
    reads between; the two arms in turn `repeat` times, the medians."""
    if shutil.which("valgrind") is None:
        return ["instructions per read: valgrind is not installed (Debian: apt install valgrind); nothing counted"]
    few = max(1, reads // 5)
    got: dict[str, list[float]] = {name: [] for name, _ in PLAIN_AND_ALL}
    for _ in range(repeat):
        for name, _ in PLAIN_AND_ALL:
            got[name].append((instructions(name, reads, paths, folder) - instructions(name, few, paths, folder))
                             / (reads - few))
    p, f = (statistics.median(got[name]) for name, _ in PLAIN_AND_ALL)
    extra = sorted(a - b for a, b in zip(got[PLAIN_AND_ALL[1][0]], got[PLAIN_AND_ALL[0][0]]))
    return [f"instructions per read (user space, callgrind; decode 835,584 B, 8 in flight, {len(paths)} sources, "
            f"{reads} reads less {few}, median of {repeat}): plain {p / 1e3:.1f}k, features {f / 1e3:.1f}k "
            f"({(f - p) / 1e3:+.1f}k; each time {', '.join(f'{x / 1e3:+.1f}k' for x in extra)}), "
            f"features / plain {f / p:.2f}"]


def python_per_read(paths, size: int, settings: ReaderSettings, reads: int) -> tuple[float, float, Counter]:
    """(Python opcodes, Python calls, opcodes by function) per decode-shaped read of `cpu_per_read`'s
    shape, counted by a tracer (`sys.settrace`, every thread the reader starts): the work its Python
    does, which unlike its CPU time does not move with what else the machine runs. The reader and
    its lanes are started inside the count; the tracer slows every opcode, so only the counts mean
    anything, not the time it takes."""
    ops: Counter = Counter()
    calls = [0]

    def tracer(frame, event, arg):
        if event == "call":
            calls[0] += 1
            frame.f_trace_opcodes = True
            return tracer
        if event == "opcode":
            c = frame.f_code
            ops[(os.path.basename(c.co_filename), c.co_name)] += 1
        return tracer

    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        cpu_per_read(paths, size, settings, reads)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return sum(ops.values()) / reads, calls[0] / reads, ops


def ops_lines(paths, size: int, reads: int, top: int = 12) -> list[str]:
    """The Python work per read (`python_per_read`), plain, each feature alone and all three: opcodes
    and calls per read, what each adds to plain, and the functions that add the most with all three
    (where a cut of the features' CPU has to come from)."""
    got = {name: python_per_read(paths, size, settings, reads) for name, settings in LATENCY_ARMS}
    p_ops, p_calls, p_by = got["plain"]
    f_ops, f_calls, f_by = got["all three"]
    alone = ", ".join(f"{name} {got[name][0]:,.0f} ({got[name][0] - p_ops:+,.0f})" for name, _ in LATENCY_ARMS[1:-1])
    added = [x for x in sorted(((f_by[k] - p_by.get(k, 0)) / reads, k) for k in f_by)[::-1][:top] if x[0] >= 1]
    return [f"python per read (decode 835,584 B, 8 in flight, {len(paths)} sources, {reads} reads, counted): "
            f"plain {p_ops:,.0f} opcodes in {p_calls:.0f} calls, features {f_ops:,.0f} in {f_calls:.0f}; "
            f"features / plain {f_ops / p_ops:.2f}",
            f"  each feature alone (opcodes): {alone}; all three {f_ops - p_ops:+,.0f}",
            "  added most with all three: " + (", ".join(f"{f}:{fn} {n:+,.0f}" for n, (f, fn) in added)
                                               or "nothing" + (" (one source: the features have nothing to do)"
                                                               if len(paths) == 1 else ""))]


def pool_run(paths, size: int, pool_bytes: int, decode_reads: int = 2000, pre_inflight: int = 3,
             dec_inflight: int = 16, nbytes: int = 835_584) -> tuple[float, float]:
    """(µs of this process's CPU, minor page faults) per decode-shaped read of `nbytes`, `dec_inflight`
    at a time, after two passes of the engine's prefill staging reads `pre_inflight` at a time, with
    a buffer pool of `pool_bytes`: the plain reader, page-cache reads, every buffer released."""
    chunk = engine_shapes().prefill_bytes
    pre = [(o, chunk) for o in range(0, size - chunk + 1, chunk)] * 2
    rng = random.Random(3)
    dec = [(rng.randrange(0, (size - nbytes) // 4096) * 4096, nbytes) for _ in range(decode_reads + dec_inflight)]
    n = len(paths)
    with SplitReader(paths, [1] * n, [1] * n, cold=False, pool_bytes=pool_bytes) as r:
        read_in_groups(r, pre, pre_inflight, "prefill")
        read_in_groups(r, dec[:dec_inflight], dec_inflight, "decode")   # the decode's first buffers: fresh in any pool
        f0, c0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        read_in_groups(r, dec[dec_inflight:], dec_inflight, "decode")
        c, f = time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return c / decode_reads * 1e6, f / decode_reads


def pool_lines(paths, size: int, repeat: int, small_mib: int) -> list[str]:
    """Decode reads after a prefill with a pool of `small_mib` MiB beside the default 512 MiB
    (`buffers.POOL_BYTES`), alternated `repeat` times: medians and ratios."""
    arms = {"small": small_mib << 20, "large": POOL_BYTES}
    got: dict[str, list] = {a: [] for a in arms}
    for k in range(repeat):
        for a in (list(arms) if k % 2 == 0 else list(reversed(arms))):
            got[a].append(pool_run(paths, size, arms[a]))
    cpu = {a: statistics.median(c for c, _ in v) for a, v in got.items()}
    flt = {a: statistics.median(f for _, f in v) for a, v in got.items()}
    return [f"decode reads (835,584 B, 16 in flight) after prefill reads of {engine_shapes().prefill_bytes:,} B "
            f"(3 in flight), {len(paths)} sources, plain reader, median of {repeat}: pool {small_mib} MiB / "
            f"{POOL_BYTES >> 20} MiB: cpu per read {cpu['small']:.0f} / {cpu['large']:.0f} µs "
            f"({cpu['small'] / cpu['large']:.2f}), minor faults per read {flt['small']:.2f} / {flt['large']:.2f}"]


def chunk_run(paths, size: int, settings: ReaderSettings, nbytes: int, passes: int = 3) -> tuple[float, float, list]:
    """(GB/s, ms of this process's CPU per read, each source's chunk at the end) of `passes` passes of
    prefill-shaped reads of `nbytes` over the files, one at a time, after one untimed pass."""
    ranges = [(o, nbytes) for o in range(0, size - nbytes + 1, nbytes)]
    with SplitReader(paths, [1] * len(paths), [1] * len(paths), settings=settings, cold=False) as r:
        for o, n in ranges:
            r.read(o, n)
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(passes):
            for o, n in ranges:
                r.read(o, n)
        t, c = time.perf_counter() - t0, time.process_time() - c0
        return passes * len(ranges) * nbytes / t / 1e9, c / (passes * len(ranges)) * 1e3, \
            [s.chunk_bytes for s in r.stats().sources]


def chunk_lines(paths, size: int, repeat: int) -> list[str]:
    """Prefill reads with the embedded engine's features, chunks fixed at 1 MiB beside chunks sized
    to the drives (the default), alternated `repeat` times: medians and ratios."""
    nbytes = engine_shapes().prefill_bytes
    arms = {"1 MiB": replace(EMBEDDED, balance_policy=BalancePolicy(chunk_max=BalancePolicy.chunk_bytes)),
            "sized": EMBEDDED}
    got: dict[str, list] = {a: [] for a in arms}
    for k in range(repeat):
        for a in (list(arms) if k % 2 == 0 else list(reversed(arms))):
            got[a].append(chunk_run(paths, size, arms[a], nbytes))
    med = {a: (statistics.median(g for g, _, _ in v), statistics.median(c for _, c, _ in v)) for a, v in got.items()}
    (g1, c1), (gs, cs) = med["1 MiB"], med["sized"]
    sized = sorted({c >> 20 for _, _, ch in got["sized"] for c in ch})
    return [f"prefill reads of {nbytes:,} B, {len(paths)} sources at 1:1:1, all three features, median of {repeat}: "
            f"chunks of 1 MiB {g1:.2f} GB/s {c1:.2f} ms CPU per read; sized to the drives {gs:.2f} GB/s {cs:.2f} ms "
            f"(chunks of {'/'.join(map(str, sized))} MiB); sized / 1 MiB: GB/s {gs / g1:.2f}, CPU per read {cs / c1:.2f}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/dev/shm", help="where to put the test files (tmpfs or page-cached)")
    ap.add_argument("--size", default="512M", help="bytes per file (binary suffixes)")
    ap.add_argument("--sources", type=int, default=3, choices=(1, 2, 3))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inflight", default="1,8", help="prefill chunks in flight (comma list)")
    ap.add_argument("--balance", action="store_true", help="the reader balances (chunks, short kernel queues, idle "
                                                          "drives take queued chunks: `engine-bridge run`'s default)")
    ap.add_argument("--cpu", action="store_true", help="only the reader's CPU per read, plain beside the embedded "
                                                       "engine's features (hedging, re-weighting, balancing), "
                                                       "together and each alone")
    ap.add_argument("--cpu-reads", type=int, default=3000, help="reads per --cpu measurement")
    ap.add_argument("--builds", action="store_true", help="only --cpu's plain reader and all three features, with "
                                                          "the reader's compiled modules beside its Python ones "
                                                          "(REPLICA_TUNER_PURE=1), each in its own process")
    ap.add_argument("--cpu-one", action="store_true", help=argparse.SUPPRESS)   # one --builds measurement, as JSON
    ap.add_argument("--reads-one", choices=[name for name, _ in PLAIN_AND_ALL], help=argparse.SUPPRESS)  # --instructions' reads
    ap.add_argument("--instructions", action="store_true", help="only the machine instructions per read, counted by "
                                                                "valgrind (the same on a busy machine, compiled modules "
                                                                "included), plain beside all three features")
    ap.add_argument("--ins-reads", type=int, default=1000, help="reads per --instructions count (and a fifth of them)")
    ap.add_argument("--paths", help=argparse.SUPPRESS)      # --reads-one: the files to read, joined by os.pathsep
    ap.add_argument("--ops", action="store_true", help="only the Python work per read, counted (opcodes and calls: "
                                                       "the same on a busy machine), plain beside each feature and "
                                                       "all three, and the functions that add the most")
    ap.add_argument("--latency", action="store_true", help="only a decode step's latency: the plain reader beside "
                                                           "each feature and all three")
    ap.add_argument("--chunks", action="store_true", help="only prefill reads with balancing's chunks fixed at 1 MiB "
                                                          "beside chunks sized to the drives")
    ap.add_argument("--pool", action="store_true", help="only decode reads after a prefill, with the pool a RAM "
                                                        "budget allows beside the default one")
    ap.add_argument("--pool-mib", type=int, default=69, help="the small pool for --pool, MiB (an eighth of the "
                                                             "stall bench's 552 MiB budget)")
    args = ap.parse_args()
    if args.ops and build.HOW == "compiled":        # a tracer counts Python only: the Python modules, then
        os.execve(sys.executable, [sys.executable, "-m", "bench.reader_bench", *sys.argv[1:]],
                  {**os.environ, build.PURE_ENV: "1"})
    if args.pool_mib < 1:
        ap.error(f"--pool-mib {args.pool_mib}: must be at least 1")
    if args.ins_reads < 5:
        ap.error(f"--ins-reads {args.ins_reads}: must be at least 5 (a fifth of them is counted too)")
    if args.reads_one:                  # one --instructions count: the reads alone, on the parent's files
        if not args.paths:
            ap.error("--reads-one needs --paths")
        paths = args.paths.split(os.pathsep)
        ranges = decode_ranges(os.path.getsize(paths[0]), args.cpu_reads)
        with SplitReader(paths, [1] * len(paths), [1] * len(paths), settings=dict(PLAIN_AND_ALL)[args.reads_one],
                         cold=False) as r:
            read_in_groups(r, ranges, 8, "decode")
        return 0
    size = parse_size(args.size)
    rng = random.Random(1)
    d = tempfile.mkdtemp(prefix="reader-bench-", dir=args.dir)
    try:
        paths = make_files(d, size, args.sources)
        if args.cpu_one:
            one = {name: cpu_per_read(paths, size, settings, args.cpu_reads)[0] for name, settings in PLAIN_AND_ALL}
            print(json.dumps({"how": build.HOW, **one}))
            return 0
        if args.cpu or args.ops or args.latency or args.chunks or args.pool or args.builds or args.instructions:
            print(f"reader: {build.HOW}", flush=True)
            lines = (cpu_lines(paths, size, max(args.repeat, 1), args.cpu_reads) if args.cpu else []) + \
                (build_lines(paths, size, max(args.repeat, 1), args.cpu_reads, args.dir) if args.builds else []) + \
                (ops_lines(paths, size, 1000) if args.ops else []) + \
                (instruction_lines(paths, args.ins_reads, d, max(args.repeat, 1)) if args.instructions else []) + \
                (latency_lines(paths, size, max(args.repeat, 1)) if args.latency else []) + \
                (chunk_lines(paths, size, max(args.repeat, 1)) if args.chunks else []) + \
                (pool_lines(paths, size, max(args.repeat, 1), args.pool_mib) if args.pool else [])
            for line in lines:
                print(line, flush=True)
            return 0
        shape = engine_shapes()                    # the engine's staging chunk and component, as iobench's presets
        chunk, comp = shape.prefill_bytes, shape.decode_bytes
        chunks = [(o, chunk) for o in range(0, size - chunk + 1, chunk)] * 2
        comps = [(rng.randrange(0, (size - comp) // comp) * comp, comp)
                 for _ in range(max(60, 2 * size // comp))]
        w_pre = (2, 1, 1)[:args.sources]
        w_dec = (10, 6, 6)[:args.sources]
        shapes = [("prefill", chunks, w_pre, int(k), chunk) for k in args.inflight.split(",")]
        shapes.append(("decode", comps, w_dec, 9, comp))
        print(f"reader ceiling: {args.sources} source(s) of {size >> 20} MiB in {args.dir}, {os.cpu_count()} CPUs, "
              f"best of {args.repeat}{', balancing' if args.balance else ''}", flush=True)
        print(f"{'shape':8} {'inflight':>8} {'weights':8} {'mode':9} {'buffers':8} {'reader GB/s':>11} {'plain GB/s':>10} "
              f"{'ratio':>6}")
        for name, ranges, w, inflight, bufsize in shapes:
            nbytes = sum(ln for _, ln in ranges)
            plain_loop(paths[0], ranges[:4], bufsize)  # warm the page tables
            for cold, buffers in ((False, "staged"), (True, "staged"), (False, "pooled"), (True, "pooled"),
                                  (False, "fresh")):
                best_r, best_p, how = float("inf"), float("inf"), ""
                for _ in range(args.repeat):
                    t, how = reader_loop(paths, w, ranges, inflight, name, cold, 8, bufsize, buffers, args.balance)
                    best_r = min(best_r, t)
                    best_p = min(best_p, plain_loop(paths[0], ranges, bufsize))
                wtxt = ":".join(map(str, w))
                print(f"{name:8} {inflight:8} {wtxt:8} {how:9} {buffers:8} {nbytes / best_r / 1e9:11.2f} "
                      f"{nbytes / best_p / 1e9:10.2f} "
                      f"{best_p / best_r:6.2f}", flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
