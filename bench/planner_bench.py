#!/usr/bin/env python3
"""Does the planner pick the split that is really fastest, and does it predict its speed?

On three throttled drives (different ceilings, one IOPS-limited) with a byte-identical replica
file on each, this benchmark:

1. measures each drive with iobench's own trials and fits its drive model (iobench result);
2. solves both phases with the planner (prefill: 32 MiB chunks, `--lanes` pieces in flight per
   drive; decode: 6,635,520 B components at random offsets, `--batch` reads together over a
   pool of `--threads`);
3. measures a grid of weight vectors with the real split reader (engine_bridge SplitReader) —
   the planner's choice, equal weights, capability-proportional weights and a lattice of splits
   around the best — interleaved over `--rounds` rounds (forward, then reversed), plus each
   drive alone; each arm starts after `--rest` seconds without reads (so a drive the previous
   arm left partly idle cannot begin on the throttle budget it saved), reads `--warmup` seconds,
   then `--seconds` measured as the slope of bytes against time (`SplitMeasure` and
   `timed_rate` of engine_bridge.commands.autotune, what the tuner measures with), the median
   over rounds;
4. prints, from this one run, per phase: the prediction error of the chosen weights and over the
   grid, how far the chosen weights are from the measured best of the grid, and the measured
   gain of the chosen weights over equal weights and over the fastest single drive.

With `--sets default,bandwidth,iops --runs 3` it repeats all of that three times on each of three
ceiling sets (a fresh testbed per set) and closes with one table: per set, run and phase, the
chosen weights' prediction error and their distance from the measured best (targets: within 5 %
and within 2 % in every run). `--component BYTES` plans and measures decode for another model's
expert component (the default is DeepSeek V4.1's 6,635,520 B).

Run it as root (it takes the testbed lock, builds the testbed and always takes it down again):

    .venv/bin/python bench/planner_bench.py
    .venv/bin/python bench/planner_bench.py --sets default,bandwidth,iops --runs 3

Needs root and the testbed (bench/testbed.py; where there is none it says so and exits 2);
MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.testbed import Testbed, parse_drives, wait_writeback, write_random  # noqa: E402
from engine_bridge.commands.autotune import REST_S, WARMUP_S  # noqa: E402
from engines.ds4_argodrive import COMPONENT_BYTES  # noqa: E402
from engines.registry import DEFAULT_ENGINE  # noqa: E402

FILE_NAME = "model.bin"


def log(msg: str) -> None:
    print(f"[planner-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- outer: build the testbed, write the replicas, run the inner part throttled, tear down ----

SETS = {
    # name: (read ceilings MB/s, IOPS ceilings); the first drive is the primary.
    "default": (["a:200", "b:120", "c:130"], ["c:160"]),
    "bandwidth": (["a:300", "b:150", "c:100"], []),
    "iops": (["a:220", "b:200", "c:180"], ["a:700", "b:260", "c:200"]),
}


def outer(a) -> int:
    """One testbed per ceiling set, `--runs` runs of the inner part on each; every run's figures
    are gathered into the closing table."""
    summaries = []
    for set_name in a.sets:
        drive_specs, iops_specs = (a.drive, a.iops) if set_name == "custom" else SETS[set_name]
        drives, iops = parse_drives(drive_specs), parse_drives(iops_specs, "--iops", zero_ok=True)
        with Testbed(drives, iops=iops, size=a.size, root=a.root) as tb:
            log(f"[{set_name}] testbed up at {tb.root}: drives {', '.join(drive_specs)}; iops {', '.join(iops_specs) or 'none'}")
            names = list(tb.mounts())
            paths = [os.path.join(m, FILE_NAME) for m in tb.mounts().values()]
            log(f"writing a {a.file_size} B replica on {', '.join(names)}")
            write_random(paths, a.file_size, a.seed)
            log(f"writeback: {wait_writeback(quiet_s=5.0, timeout_s=120.0)}")
            for run in range(1, a.runs + 1):
                out = os.path.join(tb.root, f"summary-{run}.json")
                passthrough = [x for d in drive_specs for x in ("--drive", d)] + [x for d in iops_specs for x in ("--iops", d)]
                inner_cmd = [sys.executable, os.path.abspath(__file__), "--inner", "--state", os.path.join(tb.root, "testbed.json"),
                             "--summary", out, "--seed", str(a.seed + run - 1)] + passthrough + a.passthrough
                log(f"[{set_name}] run {run} of {a.runs}")
                rc = tb.run(inner_cmd).returncode
                if rc != 0:
                    log(f"[{set_name}] run {run} failed (exit {rc})")
                    summaries.append({"set": set_name, "run": run, "failed": rc})
                    continue
                with open(out) as f:
                    summaries.append({"set": set_name, "run": run, **json.load(f)})
    print_summary(summaries, a)
    return 0 if all("failed" not in s for s in summaries) else 1


def print_summary(summaries: list[dict], a) -> None:
    """The closing table: per set, run and phase, the chosen weights' prediction error and how far
    they are from the measured best (targets: within 5 % and within 2 % in every run)."""
    print()
    print(f"planner benchmark summary: decode read {a.component} B; {a.runs} runs per set; "
          f"targets: |prediction error| <= 5 %, chosen vs measured best >= -2 %")
    print(f"{'set':>10} {'run':>4} {'phase':>8} {'chosen':>10} {'best':>10} {'pred err':>9} {'vs best':>9}  ok")
    misses = 0
    for s in summaries:
        if "failed" in s:
            print(f"{s['set']:>10} {s['run']:>4}   failed (exit {s['failed']})")
            misses += 1
            continue
        for ph in ("prefill", "decode"):
            r = s[ph]
            ok = abs(r["pred_err"]) <= 0.05 and r["vs_best"] >= -0.02
            misses += not ok
            print(f"{s['set']:>10} {s['run']:>4} {ph:>8} {r['chosen']:>10} {r['best']:>10} {pct(r['pred_err']):>9} "
                  f"{pct(r['vs_best']):>9}  {'ok' if ok else 'MISS'}")
    print(f"{misses} of {2 * len(summaries)} phase-runs missed a target")


# ---- inner: runs inside the testbed's throttling group ----------------------------------------

def lattice(n: int, steps: int) -> list[tuple[int, ...]]:
    """Every vector of n positive integers summing to `steps` (a grid over the simplex)."""
    if n == 1:
        return [(steps,)]
    return [(i,) + rest for i in range(1, steps) for rest in lattice(n - 1, steps - i)]


def neighbours(counts, step: int):
    """Splits that move `step` blocks from one source to another."""
    n = len(counts)
    out = []
    for i in range(n):
        for j in range(n):
            if i != j and counts[i] >= step:
                c = list(counts)
                c[i] -= step
                c[j] += step
                out.append(tuple(c))
    return out


def grid_for(drives, workload, solution, steps: int, keep: float, limit: int):
    """Weight vectors to measure, one per distinct split at the phase's read size, in
    smallest-weight form: the planner's choice, equal, capability-proportional, the splits one
    step away from the choice (1 block for decode, 4 for prefill's 128), then lattice points
    predicted within `keep` of the best, best first, up to `limit` in all."""
    from planner.solve import predict, smallest_equivalent, split_classes

    counts, smallest = split_classes(len(drives), workload.read_bytes)
    by_counts = {tuple(int(x) for x in c): tuple(int(x) for x in w) for c, w in zip(counts, smallest)}
    best = solution.prediction.throughput_Bps
    chosen_counts = tuple(s.blocks for s in solution.prediction.shares)
    step = 1 if workload.phase == "decode" else 4
    near = [by_counts[c] for c in neighbours(chosen_counts, step) if c in by_counts]
    cands = []
    for w in lattice(len(drives), steps):
        w = smallest_equivalent(w, workload.read_bytes)
        p = predict(drives, w, workload).throughput_Bps
        if p >= (1 - keep) * best:
            cands.append((p, w))
    cands.sort(reverse=True)
    first = [solution.weights, (1,) * len(drives), solution.capability.weights] + near
    seen, out = set(), []
    for w in first + [w for _, w in cands]:
        key = tuple(smallest_equivalent(w, workload.read_bytes))
        if key not in seen:
            seen.add(key)
            out.append(key)
        if len(out) >= limit:
            break
    return out


def pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def inner(a) -> int:
    from core.rig import Member, Rig, save_rig
    from engine_bridge.commands.autotune import SplitMeasure
    from iobench.result import save_result
    from planner.model import decode_workload, prefill_workload
    from planner.plans import load_inputs, save_plan
    from planner.solve import block_counts_many, predict, solve_phase, solve_plan

    with open(a.state) as f:
        state = json.load(f)
    names = [d["name"] for d in state["drives"]]
    paths = [os.path.join(d["mount"], FILE_NAME) for d in state["drives"]]
    rig_root = tempfile.mkdtemp(prefix="planner-bench-rig-")
    rig = Rig(root=rig_root, model=Member(paths[0], names[0], "primary"),
              replicas=tuple(Member(p, n, "replica") for p, n in zip(paths[1:], names[1:])))
    save_rig(rig)

    # 1. iobench's trials -> drive results with fitted models.
    t0 = time.monotonic()
    result = run_iobench(rig, a)
    bench_path = save_result(rig, result)
    log(f"iobench: {bench_path} in {time.monotonic() - t0:.0f}s")
    for d in result.drives:
        m = d.model
        log(f"  {d.name}: bw_max {m.bw_max / 1e6:.1f} MB/s, lat {m.lat_s * 1e3:.2f} ms, stream {m.stream_bw / 1e6:.0f} MB/s, "
            f"iops_max {m.iops_max or 0:.0f}, fit error {m.fit_err_pct:.1f} %")

    # 2. solve.
    inputs = load_inputs(rig_root, bench_path)
    wl = {"prefill": prefill_workload(a.lanes), "decode": decode_workload(a.batch, a.threads, a.component)}
    plan = solve_plan(inputs.sources, inputs.drives, wl["prefill"], wl["decode"], (), DEFAULT_ENGINE, inputs.provenance)
    plan_path = save_plan(rig, plan)
    sols = {ph: solve_phase(inputs.drives, wl[ph]) for ph in wl}
    fit_only = load_inputs(rig_root, bench_path, calibrate=False)
    sols_fit = {ph: solve_phase(fit_only.drives, wl[ph]) for ph in wl}
    log(f"plan {plan_path}: prefill {':'.join(map(str, plan.prefill.weights))}, decode {':'.join(map(str, plan.decode.weights))}")

    # 3. measure the grids, interleaved over rounds (forward, then reversed), and each drive alone.
    # the tuner's own measurement (what `engine-bridge autotune` reads with): the real split reader,
    # one barrier per layer (prefill) or missed expert (decode), a warm-up, then the slope
    measure = SplitMeasure(paths, wl, seed=a.seed, chunks=a.chunks, warmup=a.warmup, rest=a.rest)
    report = {}
    for ph in ("prefill", "decode"):
        grid = grid_for(inputs.drives, wl[ph], sols[ph], a.steps, a.keep, a.grid)
        if sols_fit[ph].weights not in grid:
            grid.append(sols_fit[ph].weights)
        arms = [("split", w) for w in grid] + [("alone", i) for i in range(len(paths))]
        log(f"{ph}: measuring {len(grid)} weight vectors and {len(paths)} single drives, {a.rounds} rounds of {a.seconds}s")
        meas = {arm: [] for arm in arms}
        for rnd in range(a.rounds):
            for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                kind, x = arm
                if kind == "split":
                    v = measure(ph, x, a.seconds)
                else:
                    v = measure(ph, (1,), a.seconds, sources=[paths[x]])
                meas[arm].append(v)
        med = {arm: float(np.median(v)) for arm, v in meas.items()}
        pred = {w: predict(inputs.drives, w, wl[ph]).throughput_Bps for w in grid}
        report[ph] = (grid, med, pred, sols[ph], sols_fit[ph])

    # 4. print the figures.
    print()
    print(f"planner benchmark: drives {', '.join(a.drive)}; iops {', '.join(a.iops) or 'none'}; "
          f"file {a.file_size / 1e9:.2f} GB per drive; {a.rounds} rounds x {a.seconds}s per arm after {a.rest}s rest and "
          f"{a.warmup}s warm-up")
    for ph, (grid, med, pred, sol, sol_fit) in report.items():
        chosen = sol.weights
        m_chosen = med[("split", chosen)]
        best_w = max(grid, key=lambda w: med[("split", w)])
        m_best = med[("split", best_w)]
        m_equal = med[("split", (1,) * len(paths))]
        alone = {names[i]: med[("alone", i)] for i in range(len(paths))}
        fastest = max(alone, key=alone.get)
        errs = [pred[w] / med[("split", w)] - 1 for w in grid]
        print()
        print(f"== {ph} ==")
        print(f"{'weights':>12} {'blocks':>12} {'predicted MB/s':>15} {'measured MB/s':>14} {'error':>9}")
        for w in grid:
            counts = block_counts_many(wl[ph].blocks, np.array([w]))[0]
            tag = " <- planner" if w == chosen else (" <- equal" if w == (1,) * len(paths) else "")
            tag += " (measured best)" if w == best_w else ""
            print(f"{':'.join(map(str, w)):>12} {'/'.join(map(str, counts)):>12} {pred[w] / 1e6:15.1f} "
                  f"{med[('split', w)] / 1e6:14.1f} {pct(pred[w] / med[('split', w)] - 1):>9}{tag}")
        for n, v in alone.items():
            print(f"{'alone ' + n:>25} {'':>15} {v / 1e6:14.1f}")
        print(f"planner chose {':'.join(map(str, chosen))}: predicted {pred[chosen] / 1e6:.1f} MB/s, measured {m_chosen / 1e6:.1f} MB/s")
        print(f"  prediction error (chosen weights): {pct(pred[chosen] / m_chosen - 1)}   (target within 5 %)")
        print(f"  prediction error over the grid: mean |error| {100 * np.mean(np.abs(errs)):.1f} %, max {100 * np.max(np.abs(errs)):.1f} %")
        print(f"  chosen vs measured best of the grid ({':'.join(map(str, best_w))}): {pct(m_chosen / m_best - 1)}   (target within 2 %)")
        fw = sol_fit.weights
        print(f"  iobench's fitted models alone (--fit-only) would choose {':'.join(map(str, fw))}: measured "
              f"{med[('split', fw)] / 1e6:.1f} MB/s ({pct(med[('split', fw)] / m_best - 1)} vs the best)")
        print(f"  gain over equal weights: x{m_chosen / m_equal:.3f};  over the fastest single drive ({fastest}): x{m_chosen / alone[fastest]:.3f}")
    print()
    print(f"plan file: {plan_path} (rig {rig_root}, kept for inspection)")
    if a.summary:
        doc = {}
        for ph, (grid, med, pred, sol, _) in report.items():
            best_w = max(grid, key=lambda w: med[("split", w)])
            doc[ph] = {"chosen": ":".join(map(str, sol.weights)), "best": ":".join(map(str, best_w)),
                       "pred_err": pred[sol.weights] / med[("split", sol.weights)] - 1,
                       "vs_best": med[("split", sol.weights)] / med[("split", best_w)] - 1}
        with open(a.summary, "w") as f:
            json.dump(doc, f)
    return 0


def run_iobench(rig, a):
    """iobench's own trials (every preset, each drive alone) -> a BenchResult with fitted models.
    The decode preset reads `--component` bytes, as the model planned for would."""
    from iobench.bench import RunOptions, make_target, run_bench
    from iobench.layout import ExpertLayout

    layout = ExpertLayout(a.component, ((0, a.file_size),), a.file_size // a.component)
    targets = [make_target(m.path, m.name, layout, [f"decode: {a.component:,} B components (--component)"])
               for m in rig.members]
    opts = RunOptions(seconds=a.iobench_seconds, repeat=a.iobench_repeat, together=False, seed=a.seed)
    return run_bench(targets, opts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--state", help=argparse.SUPPRESS)
    p.add_argument("--root", help="testbed folder (default: a fresh one, deleted afterwards)")
    p.add_argument("--drive", action="append", help="NAME:MBPS read ceiling (repeat; first = primary)")
    p.add_argument("--iops", action="append", help="NAME:IOPS read-operation ceiling (repeat)")
    p.add_argument("--size", default="2G", help="testbed image size per drive")
    p.add_argument("--file-size", type=int, default=1536 << 20, help="replica bytes per drive")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per measured arm")
    p.add_argument("--warmup", type=float, default=WARMUP_S, help="seconds each arm reads before its clock starts")
    p.add_argument("--rest", type=float, default=REST_S, help="seconds without reads before each arm")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all arms (forward, reversed, ...)")
    p.add_argument("--lanes", type=int, default=8, help="prefill pieces in flight per drive")
    p.add_argument("--chunks", type=int, default=16, help="prefill chunks per layer (one barrier)")
    p.add_argument("--batch", type=int, default=3, help="decode component reads issued together")
    p.add_argument("--threads", type=int, default=9, help="decode read threads over all drives")
    p.add_argument("--steps", type=int, default=12, help="lattice resolution of the measured grid")
    p.add_argument("--keep", type=float, default=0.25, help="grid: lattice points predicted within this of the best")
    p.add_argument("--grid", type=int, default=12, help="most weight vectors measured per phase")
    p.add_argument("--iobench-seconds", type=float, default=2.0, help="seconds per iobench trial")
    p.add_argument("--iobench-repeat", type=int, default=3, help="windows per iobench trial (spread)")
    p.add_argument("--component", type=int, default=COMPONENT_BYTES,
                   help="decode read size, bytes (default: DeepSeek V4.1's expert component; e.g. 557056 for a small model)")
    p.add_argument("--sets", default="default",
                   help=f"ceiling sets to run, comma-separated: {', '.join(SETS)}, or custom (--drive/--iops)")
    p.add_argument("--runs", type=int, default=1, help="runs per ceiling set (each: iobench, solve, measure)")
    p.add_argument("--summary", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    a.drive = a.drive or SETS["default"][0]
    a.iops = a.iops if a.iops is not None else SETS["default"][1]
    if a.inner:
        return inner(a)
    a.sets = [x.strip() for x in a.sets.split(",") if x.strip()]
    unknown = [x for x in a.sets if x not in SETS and x != "custom"]
    if unknown:
        p.error(f"--sets: unknown set {unknown[0]!r}; known: {', '.join(SETS)}, custom")
    a.passthrough = []
    for opt in ("file_size", "seconds", "warmup", "rest", "rounds", "lanes", "chunks", "batch", "threads", "steps", "keep", "grid",
                "iobench_seconds", "iobench_repeat", "component"):
        a.passthrough += ["--" + opt.replace("_", "-"), str(getattr(a, opt))]
    return outer(a)


if __name__ == "__main__":
    sys.exit(main())
