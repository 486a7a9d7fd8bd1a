"""The real llama.cpp on throttled drives under a RAM budget: one drive against its files placed
across two and three, with the plan's prediction beside each.

    LLAMA_CPP_BIN_DIR=/path/to/llama.cpp/bin .venv/bin/python -m bench.llama_cpp_drives_bench \
        [--size 240M] [--mbs 60] [--ram 33%] [--tokens 16] [--runs 3] [--modes mmap,dio]

A qwen3moe model (`engine-bridge synth --format qwen3moe`, Q8_0: not repacked on x86, so its
experts stay mapped) is re-split one tensor per file (`replicas resplit`) onto testbed drive d1
and copied byte for byte to d2 and d3 (each file compared). Each drive has the same read ceiling
(--mbs) and its read_ahead_kb set to 128 (the usual NVMe default; a fault reads 2x that after
llama.cpp's FADV_SEQUENTIAL). The arms: the model on d1 alone, and llama.cpp's profile for 1:1 over
d1, d2 and 1:1:1 over d1..d3 (engines.llamacpp: a folder of links, each to the drive that serves
the file, `-m` its first link), run in the order 1 2 3 3 2 1 1 2 3 (three runs each), the page
cache dropped before each, every run in the testbed's groups (throttled, held to the RAM budget
of --ram of the model), llama-completion greedy with one thread (-t 1, OMP_THREAD_LIMIT=1). Each
further load mode in --modes runs once per layout afterwards. Per run: rc, prompt and decode tok/s
from its own timing lines (common_perf_print), bytes each drive read (/sys/block/loopN/stat), and
the sha256 of what it generated. Beside each layout: the planner's decode prediction for those
weights (planner.solve.Pricer over the model's workload, the drives as their ceiling and a
latency measured here with 4 KiB O_DIRECT reads, the page cache priced at the budget): reads
alone, no compute. MB = 10**6 bytes.

What its ratios say: the testbed's drives are byte budgets (blk-throttle dispatches a bio at once
while its group is within `bps x throtl_slice`, block/blk-throttle.c `tg_within_bps_limit`), so
llama.cpp, whose faults follow one another, draws on each drive's budget in turn and gains from
more drives as it would from one faster drive. Measured (bench/llama_cpp_inflight_bench.py,
docs/engine-profiles.md "Measured on the testbed"): one throttled drive at 180 MB/s decodes as
three at 60 (1.63 against 1.67 tok/s), while drives modelled by their service time
(bench/service_time_fs.py: one read at a time, nothing banked while idle) gave three 1.05x of
one. The measured gain over more drives here is the testbed's; the plan's 1.00x is what drives
limited by their service time give.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.testbed import Testbed, drop_caches, require_testbed, usage_exit  # noqa: E402

PROMPT = "hello world"
READ_AHEAD_KB = 128


def sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def sectors_read(device: str) -> int:
    with open(f"/sys/block/{os.path.basename(device)}/stat") as f:
        return int(f.read().split()[2]) * 512


def latency_s(tb: Testbed, path: str) -> float:
    """Median seconds of 64 cold 4 KiB O_DIRECT reads at spread offsets of `path`, in the testbed."""
    code = ("import os,sys,time,mmap,statistics;fd=os.open(sys.argv[1],os.O_RDONLY|os.O_DIRECT);"
            "n=os.fstat(fd).st_size;b=mmap.mmap(-1,4096);t=[]\n"
            "for i in range(64):\n o=(i*7919*4096)%(n-4096)//4096*4096;t0=time.perf_counter();os.preadv(fd,[b],o);"
            "t.append(time.perf_counter()-t0)\nprint(statistics.median(t))")
    p = tb.run([sys.executable, "-c", code, path], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"llama_cpp_drives_bench: latency probe failed: {p.stderr[-300:]}")
    return float(p.stdout.strip())


def predict(rig_root: str, paths: list[str], names: list[str], mbs: float, lat: float, budget: int) -> dict:
    """The planner's decode prediction per layout (reads alone) for llama.cpp on these drives."""
    from core.rig import Member, Rig, save_rig
    from engines.registry import get_engine
    from models.modelset import discover
    from planner.drivecurves import Drive
    from planner.rigmodel import choose_workload
    from planner.solve import Pricer, Problem, prediction
    from planner.whatif import ceiling_curve

    model = discover(paths[0])
    save_rig(Rig(root=rig_root, model=Member(paths[0], names[0], "primary"),
                 replicas=tuple(Member(p, n, "replica") for p, n in zip(paths[1:], names[1:])),
                 layout=model.layout, format=model.format, files=model.files))
    chosen = choose_workload(rig_root, "llama.cpp")
    engine = get_engine("llama.cpp")
    out = {}
    for n in (1, 2, 3):
        drives = tuple(Drive(names[i], ceiling_curve(mbs * 1e6, lat)) for i in range(n))
        prob = Problem(engine, chosen.workload.geometry, drives, chosen.workload.phases, page_cache_bytes=budget)
        w = (1,) * n
        d = prediction(Pricer(prob).price("decode", w, frozenset()), w, frozenset(), drives)
        out[n] = (d["tok_s"], engine.drive_limit(chosen.workload.geometry, n, frozenset()))
    return out


def layout_links(folder: str, paths: list[str], files: list[tuple[str, int]]) -> str:
    """The folder of links llama.cpp's profile gives for 1:...:1 over `paths`; returns what -m names."""
    from engines.handoff import Request
    from engines.llamacpp import llamacpp_profile as prof

    n = len(paths)
    req = Request(paths=tuple(paths), prefill=(1,) * n, decode=(1,) * n, files=tuple(files), link_dir=folder)
    links = prof.links(req)
    if not links:
        return paths[0]
    os.makedirs(folder)
    for name, target in links:
        os.symlink(target, os.path.join(folder, name))
    return prof.model_arg(req)


EVAL = re.compile(r"common_perf_print:\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs.*?([\d.]+) tokens per second")
PROMPT_LINE = re.compile(r"common_perf_print: prompt eval time =.*?([\d.]+) tokens per second")


def split_on_drives(tb: Testbed, src: str, names: list[str], extra: tuple[str, ...] = (),
                    who: str = "bench") -> tuple[list[str], list[str], dict[str, str]]:
    """The testbed's drives given READ_AHEAD_KB, `src` re-split one tensor per file into the first
    drive's `model/` and copied to the others' (and to the `extra` folders), checked byte-identical:
    (the drives' model folders, the files, {drive: its block device's name})."""
    mounts = tb.mounts()
    devices = {d["name"]: os.path.basename(d["device"]) for d in tb.state["drives"]}
    for dev in devices.values():
        with open(f"/sys/block/{dev}/queue/read_ahead_kb", "w") as f:
            f.write(str(READ_AHEAD_KB))
    dirs = [os.path.join(mounts[n], "model") for n in names]
    for d in dirs:
        os.makedirs(d)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "replicas"), "resplit", src, dirs[0], "-q"],
                   check=True, capture_output=True, text=True)
    files = sorted(os.listdir(dirs[0]))
    for d in [*dirs[1:], *extra]:
        for f in files:
            shutil.copyfile(os.path.join(dirs[0], f), os.path.join(d, f))
    os.sync()
    if not all(sha(os.path.join(dirs[0], f)) == sha(os.path.join(d, f)) for d in dirs[1:] for f in files):
        raise SystemExit(f"{who}: a copy differs from {names[0]}'s file")
    return dirs, files, devices


def run_arm(tb: Testbed, binary: str, model: str, mode: str, tokens: int, devices: dict[str, str]) -> dict:
    drop_caches()
    before = {n: sectors_read(d) for n, d in devices.items()}
    t0 = time.perf_counter()
    p = tb.run([binary, "-m", model, "-lm", mode, "-p", PROMPT, "-n", str(tokens), "--temp", "0", "--seed", "42",
                "-t", "1", "-no-cnv", "--no-display-prompt", "--ignore-eos", "-lv", "4"],
               capture_output=True, env={**os.environ, "OMP_THREAD_LIMIT": "1"}, timeout=3600)
    wall = time.perf_counter() - t0
    read = {n: sectors_read(d) - before[n] for n, d in devices.items()}
    err = p.stderr.decode(errors="replace")
    ev, pr = EVAL.findall(err), PROMPT_LINE.findall(err)
    return {"rc": p.returncode, "wall": wall, "read": read, "out": hashlib.sha256(p.stdout).hexdigest()[:16],
            "decode": float(ev[-1][2]) if ev else None, "prompt": float(pr[-1]) if pr else None,
            "mapped": err.count("CPU_Mapped model buffer"), "lines": [ln.strip() for ln in err.splitlines()
                                                                      if "common_perf_print:        eval time" in ln]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="240M", help="The model's size (synth --size).")
    ap.add_argument("--mbs", type=float, default=60.0, help="Each drive's read ceiling, MB/s.")
    ap.add_argument("--ram", default="33%", help="The RAM budget (a share of the model, or a size).")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3, help="Runs per layout (ABBA order).")
    ap.add_argument("--modes", default="mmap,dio", help="Load modes: the first in the ABBA runs, the rest once each.")
    a = ap.parse_args()
    bins = os.environ.get("LLAMA_CPP_BIN_DIR", "")
    binary = os.path.join(bins, "llama-completion")
    if not os.access(binary, os.X_OK):
        usage_exit("set LLAMA_CPP_BIN_DIR to the folder holding llama.cpp's llama-completion (bench/build_llama_cpp.sh)")
    require_testbed()
    modes = [m for m in a.modes.split(",") if m]
    work = tempfile.mkdtemp(prefix="llama-drives-", dir="/var/tmp")
    try:
        src = os.path.join(work, "tiny.gguf")
        tool = os.path.join(os.path.dirname(sys.executable), "engine-bridge")
        subprocess.run([tool, "synth", src, "--format", "qwen3moe", "--size", a.size], check=True,
                       stdout=subprocess.DEVNULL)
        model_bytes = os.path.getsize(src)
        names = ["d1", "d2", "d3"]
        with Testbed({n: a.mbs for n in names}, size=f"{(model_bytes >> 20) + 400}M", ram=a.ram) as tb:
            dirs, files, devices = split_on_drives(tb, src, names, who="llama_cpp_drives_bench")
            sizes = [(f, os.path.getsize(os.path.join(dirs[0], f))) for f in files]
            first = [os.path.join(d, files[0]) for d in dirs]
            tb.set_ram_for(model_bytes)
            budget = tb.ram.limit or 0
            largest = max(sizes, key=lambda x: x[1])[0]
            lat = latency_s(tb, os.path.join(dirs[0], largest))
            pred = predict(os.path.join(work, "rig"), first, names, a.mbs, lat, budget)
            models = {n: layout_links(os.path.join(work, f"links{n}"), first[:n], sizes) for n in (1, 2, 3)}
            print(f"model: {model_bytes / 1e6:.1f} MB, {len(files)} files (one tensor per file), "
                  f"copies byte-identical on d1 d2 d3; read_ahead_kb {READ_AHEAD_KB}; 4 KiB read latency "
                  f"{lat * 1e3:.2f} ms; budget {budget / 1e6:.1f} MB", flush=True)
            order = [1, 2, 3, 3, 2, 1, 1, 2, 3][: 3 * a.runs]
            runs = []
            for n in order:
                r = run_arm(tb, binary, models[n], modes[0], a.tokens, devices)
                runs.append((n, modes[0], r))
                print(f"  run {len(runs)}: {n} drive(s) -lm {modes[0]} rc {r['rc']} decode {r['decode']} tok/s prompt "
                      f"{r['prompt']} tok/s, read " + " ".join(f"{k} {v / 1e6:.1f}" for k, v in r["read"].items())
                      + f" MB, output {r['out']}", flush=True)
            for mode in modes[1:]:
                for n in (1, 2, 3):
                    r = run_arm(tb, binary, models[n], mode, a.tokens, devices)
                    runs.append((n, mode, r))
                    print(f"  {n} drive(s) -lm {mode} rc {r['rc']} decode {r['decode']} tok/s, read "
                          + " ".join(f"{k} {v / 1e6:.1f}" for k, v in r["read"].items()) + f" MB, output {r['out']}",
                          flush=True)
        print("layout    mode   runs  decode tok/s (median; each)        predicted tok/s   MB read per run (d1 d2 d3)")
        for n in (1, 2, 3):
            for mode in modes:
                rr = [r for k, m, r in runs if k == n and m == mode]
                ok = [r["decode"] for r in rr if r["decode"] is not None]
                med = statistics.median(ok) if ok else float("nan")
                rd = [statistics.median(r["read"][d] for r in rr) / 1e6 for d in names]
                each = ", ".join(f"{x:.2f}" for x in ok) or "none"
                print(f"{n} drive{'s' if n > 1 else ' '}  {mode:5} {len(rr):5}  {med:8.2f} ({each})"
                      f"{'':4}{pred[n][0] if mode == modes[0] else float('nan'):10.2f}        "
                      + " ".join(f"{x:.1f}" for x in rd) + ("" if all(r["rc"] == 0 for r in rr) else
                                                             f"  rc {','.join(str(r['rc']) for r in rr)}"))
        outs = {r["out"] for _, _, r in runs if r["rc"] == 0}
        print(f"outputs: {len(outs)} distinct sha256 over the {sum(1 for *_, r in runs if r['rc'] == 0)} runs that "
              f"finished ({', '.join(sorted(outs))})")
        base = statistics.median(r["decode"] for k, m, r in runs if k == 1 and m == modes[0] and r["decode"])
        for n in (2, 3):
            x = [r["decode"] for k, m, r in runs if k == n and m == modes[0] and r["decode"]]
            if x:
                print(f"{n} drives / 1 drive, decode: {statistics.median(x) / base:.2f}x measured, "
                      f"{pred[n][0] / pred[1][0]:.2f}x predicted")
        print(f"planner: {pred[3][1]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
