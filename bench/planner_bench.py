#!/usr/bin/env python3
"""Does the planner pick the candidate that is really fastest, and does it predict its speed, for
the engine's own reads?

On three throttled drives (different ceilings, one IOPS-limited), with a generated model the
target engine reads (`--engine`: ds4-argodrive reads a GGUF file, colibri a safetensors directory;
the model is written by `engine_bridge.moe.synth` / `synth_colibri`, the format chosen by
asking the engine which it reads) copied byte for byte onto each drive, this benchmark:

1. measures each drive with iobench's own trials on the rig's model (its expert layout and
   component from the model's header) and fits its drive model (iobench result);
2. solves the rig's model for the engine as `planner solve` does (`planner.rigmodel.rig_problem`,
   `planner.solve.solve_plan`; `--lanes`/`--threads` override the engine's concurrency);
3. builds a grid of candidates (weights, and for an engine with switches a mode): the planner's
   choice (in every mode of the engine), equal and capability-proportional weights, the solver's
   alternatives, what iobench's fitted models alone would choose (`--fit-only`), then rows of the
   engine's own weight grid nearest a lattice of shares predicted within `--keep` of the best,
   best first, up to `--grid` candidates; candidates that give the engine identical reads are
   one (`engine_bridge.tuning.embedded.reads_key`);
4. measures every candidate on each phase by executing the engine's read pattern of the phase's
   steps through the split reader (`PatternMeasure`, what `engine-bridge autotune` measures
   with: each step's groups issued and waited for as the embedded engine does), interleaved over
   `--rounds` rounds (forward, then reversed), plus each drive alone; each arm starts after
   `--rest` seconds without reads, reads `--warmup` seconds, then `--seconds` measured as the
   slope of bytes against time, the median over rounds;
5. prints, from this one run, per phase: every candidate's prediction beside its measurement and
   the error, the chosen candidate's prediction error, how far the choice is from the measured
   best of the grid (by time: predicted bytes over the measured rate, so a mode reading more bytes
   is not favoured by its rate), and the measured gain over equal weights and over the fastest
   single drive. An engine with one weight vector for both phases is judged on the solver's joint
   objective (the sum over phases of seconds / the phase's fastest) as well.

With `--sets default,bandwidth,iops --runs 3` it repeats all of that three times on each of three
ceiling sets (a fresh testbed and model per set) and closes with one table: per set, run and phase,
the prediction error of the choice and its distance from the measured best (targets: within 5 %
and within 2 % in every run; for a one-vector engine the distance is judged on the joint line).

Run it as root (it takes the testbed lock, builds the testbed and always takes it down again):

    .venv/bin/python bench/planner_bench.py
    .venv/bin/python bench/planner_bench.py --engine colibri --sets default,bandwidth,iops --runs 3

Needs root and the testbed (bench/testbed.py; where there is none it says so and exits 2);
MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.testbed import Testbed, parse_drives, wait_writeback  # noqa: E402
from engine_bridge.tuning.embedded import REST_S, WARMUP_S  # noqa: E402
from engines.registry import DEFAULT_ENGINE, ENGINES, get_engine  # noqa: E402

PHASES = ("prefill", "decode")
# What `engine-bridge synth` writes, as (format, layout, files) an engine is asked about
# (`Engine.reads_model`), and the name the model gets on each drive.
SYNTH_FORMATS = {
    "gguf": (("gguf", "file", ("model.gguf",)), "model.gguf"),
    # one shard: iobench reads the file holding most experts, and its prefill preset needs ~600 MB of it
    "colibri": (("safetensors", "dir", ("config.json", "out-00000.safetensors", "tokenizer.json")), "model"),
}


def log(msg: str) -> None:
    print(f"[planner-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def synth_format(engine: str) -> str:
    """The first format `engine-bridge synth` writes that the engine reads (asked, not assumed)."""
    e = get_engine(engine)
    for name, ((fmt, layout, files), _) in SYNTH_FORMATS.items():
        if e.reads_model is not None and not e.reads_model(fmt, layout, files):
            return name
    raise SystemExit(f"planner_bench: engine-bridge synth writes no model {engine} reads")


# ---- outer: build the testbed, write the model copies, run the inner part throttled, tear down ----

SETS = {
    # name: (read ceilings MB/s, IOPS ceilings); the first drive is the primary.
    "default": (["a:200", "b:120", "c:130"], ["c:160"]),
    "bandwidth": (["a:300", "b:150", "c:100"], []),
    "iops": (["a:220", "b:200", "c:180"], ["a:700", "b:260", "c:200"]),
}


def write_model(a, mounts: list[str]) -> list[str]:
    """The generated model on the first drive and a byte-identical copy on each other: their paths."""
    fmt = synth_format(a.engine)
    name = SYNTH_FORMATS[fmt][1]
    paths = [os.path.join(m, name) for m in mounts]
    if fmt == "gguf":
        from engine_bridge.moe.synth import SynthSpec, check_spec, synthesize

        info = synthesize(paths[0], check_spec(SynthSpec(a.layers, a.experts, a.top_k, a.dim, a.ff, 256, a.seed, "q8_0")))
        for p in paths[1:]:
            shutil.copyfile(paths[0], p)
    else:
        from engine_bridge.moe.synth_colibri import ColibriSpec, synthesize_colibri

        info = synthesize_colibri(paths[0], ColibriSpec(layers=a.layers, experts=a.experts, top_k=a.top_k, dim=a.dim,
                                                        ff=a.ff, vocab=300, shards=1, seed=a.seed))
        for p in paths[1:]:
            shutil.copytree(paths[0], p)
    log(f"model ({fmt}): {info.get('bytes', 0) / 1e9:.2f} GB, component {info.get('component_bytes', 0):,} B, on "
        f"{len(paths)} drives")
    return paths


def outer(a) -> int:
    """One testbed per ceiling set, `--runs` runs of the inner part on each; every run's figures
    are gathered into the closing table."""
    summaries = []
    for set_name in a.sets:
        drive_specs, iops_specs = (a.drive, a.iops) if set_name == "custom" else SETS[set_name]
        drives, iops = parse_drives(drive_specs), parse_drives(iops_specs, "--iops", zero_ok=True)
        with Testbed(drives, iops=iops, size=a.size, root=a.root) as tb:
            log(f"[{set_name}] testbed up at {tb.root}: drives {', '.join(drive_specs)}; iops {', '.join(iops_specs) or 'none'}")
            write_model(a, list(tb.mounts().values()))
            log(f"writeback: {wait_writeback(quiet_s=5.0, timeout_s=180.0)}")
            for run in range(1, a.runs + 1):
                out = os.path.join(tb.root, f"summary-{run}.json")
                passthrough = [x for d in drive_specs for x in ("--drive", d)] + [x for d in iops_specs for x in ("--iops", d)]
                inner_cmd = [sys.executable, os.path.abspath(__file__), "--inner",
                             "--state", os.path.join(tb.root, "testbed.json"), "--summary", out,
                             "--seed", str(a.seed + run - 1)] + passthrough + a.passthrough
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


def print_summary(summaries: list[dict], a) -> int:
    """The closing table: per set, run and phase, the chosen candidate's prediction error and how
    far it is from the measured best of the grid (targets: within 5 % and within 2 % in every run);
    for a one-vector engine a 'joint' row judges the distance on the solver's joint objective and
    the phase rows' distance is shown but not judged. Returns the misses."""
    print()
    print(f"planner benchmark summary ({a.engine}): prediction error per phase and choice vs measured best of a grid, "
          f"{a.runs} run{'s' if a.runs != 1 else ''} per set (targets: |prediction error| <= 5 %, "
          f"chosen vs measured best within 2 %)")
    print(f"{'set':>10} {'run':>4} {'phase':>8} {'chosen':>24} {'best':>24} {'pred err':>9} {'vs best':>9}  ok")
    misses = judged = 0
    for s in summaries:
        if "failed" in s:
            print(f"{s['set']:>10} {s['run']:>4}   failed (exit {s['failed']})")
            misses += 1
            judged += 1
            continue
        joint = "joint" in s
        for ph in PHASES:
            r = s[ph]
            ok = abs(r["pred_err"]) <= 0.05 and (joint or r["vs_best"] >= -0.02)
            misses += not ok
            judged += 1
            print(f"{s['set']:>10} {s['run']:>4} {ph:>8} {r['chosen']:>24} {r['best']:>24} {pct(r['pred_err']):>9} "
                  f"{pct(r['vs_best']):>9}{'*' if joint else ' '} {'ok' if ok else 'MISS'}")
        if joint:
            r = s["joint"]
            ok = r["vs_best"] >= -0.02
            misses += not ok
            judged += 1
            print(f"{s['set']:>10} {s['run']:>4} {'joint':>8} {r['chosen']:>24} {r['best']:>24} {'':>9} "
                  f"{pct(r['vs_best']):>9}  {'ok' if ok else 'MISS'}")
    if any("joint" in s for s in summaries):
        print("* one weight vector for both phases: judged on the joint row (sum over phases of seconds / the phase's fastest)")
    print(f"{misses} of {judged} rows missed a target")
    return misses


# ---- inner: runs inside the testbed's throttling group ----------------------------------------

def lattice(n: int, steps: int) -> list[tuple[int, ...]]:
    """Every vector of n positive integers summing to `steps` (a grid over the simplex)."""
    if n == 1:
        return [(steps,)]
    return [(i,) + rest for i in range(1, steps) for rest in lattice(n - 1, steps - i)]


def label(w, mode) -> str:
    return ":".join(map(str, w)) + (f" {'+'.join(sorted(mode))}" if mode else "")


def grid_for(problem, choice, fit_choice, a) -> list[tuple[tuple[int, ...], frozenset]]:
    """The candidates (weights, mode) measured on every phase of a one-vector engine, or per phase
    (a dict phase -> list) for an engine with weights per phase: see the module docstring, step 3."""
    from engine_bridge.tuning.embedded import reads_key
    from planner.solve import Pricer, nearest

    e, g, n = problem.engine, problem.geometry, len(problem.drives)
    pricer, key = Pricer(problem), reads_key(problem)
    modes = e.modes(g)
    eq = (1,) * n
    joint = not e.phase_weights

    def pick(first, scored, phases) -> list:
        out, seen = [], set()
        for w, m in first + [c for _, c in sorted(scored, key=lambda x: x[0])]:
            w = tuple(int(x) for x in w)
            k = tuple(key(ph, w, m) for ph in phases)
            if k not in seen:
                seen.add(k)
                out.append((w, m))
            if len(out) >= a.grid:
                break
        return out

    if joint:
        grid = e.grid(n, g, "decode")
        rows = sorted({nearest(grid, w) for w in lattice(n, a.steps)})
        w0, m0 = tuple(choice.weights["prefill"]), choice.mode
        first = [(w0, m0)] + [(w0, m) for m in modes if m != m0]
        first += [(eq, m0), (tuple(choice.baselines["decode"]["capability"]["weights"]), m0),
                  (tuple(fit_choice.weights["prefill"]), fit_choice.mode)]
        first += list(dict.fromkeys((tuple(x["weights"]), frozenset(k for k in ("direct", "stripe") if x.get(k)))
                                    for x in choice.alternatives))
        cands = [(tuple(int(x) for x in grid[r]), m) for r in rows for m in modes]
        secs = {c: {ph: pricer.price(ph, c[0], c[1]).seconds for ph in PHASES} for c in cands}
        fastest = {ph: min(v[ph] for v in secs.values()) for ph in PHASES}
        obj = {c: sum(v[ph] / fastest[ph] for ph in PHASES) for c, v in secs.items()}
        best = min(obj.values())
        return pick(first, [(o, c) for c, o in obj.items() if o <= best * (1 + a.keep)], PHASES)
    out = {}
    for ph in PHASES:
        grid = e.grid(n, g, ph)
        rows = sorted({nearest(grid, w) for w in lattice(n, a.steps)})
        first = [(tuple(choice.weights[ph]), choice.mode), (eq, choice.mode),
                 (tuple(choice.baselines[ph]["capability"]["weights"]), choice.mode),
                 (tuple(fit_choice.weights[ph]), fit_choice.mode)]
        first += [(tuple(x["weights"]), choice.mode) for x in choice.alternatives if x.get("phase") == ph]
        secs = {r: pricer.price(ph, grid[r], choice.mode).seconds for r in rows}
        best = min(secs.values())
        out[ph] = pick(first, [(s, (tuple(int(x) for x in grid[r]), choice.mode)) for r, s in secs.items()
                               if s <= best * (1 + a.keep)], (ph,))
    return out


def inner(a) -> int:
    from core.rig import Member, Rig, save_rig
    from engine_bridge.tuning.embedded import PatternMeasure
    from iobench.bench import RunOptions, run_bench, targets_from_rig
    from iobench.result import save_result
    from models.modelset import discover
    from planner.autotune import Arm, Tally, Trial, joint_pick
    from planner.plans import load_inputs, save_plan
    from planner.rigmodel import choose_workload, rig_problem
    from planner.solve import Pricer, prediction, solve, solve_plan

    with open(a.state) as f:
        state = json.load(f)
    names = [d["name"] for d in state["drives"]]
    name = SYNTH_FORMATS[synth_format(a.engine)][1]
    paths = [os.path.join(d["mount"], name) for d in state["drives"]]
    model = discover(paths[0])
    rig_root = tempfile.mkdtemp(prefix="planner-bench-rig-")
    rig = Rig(root=rig_root, model=Member(paths[0], names[0], "primary"),
              replicas=tuple(Member(p, n, "replica") for p, n in zip(paths[1:], names[1:])),
              layout=model.layout, format=model.format, files=model.files)
    save_rig(rig)

    # 1. iobench's trials on the rig's model -> drive results with fitted models.
    t0 = time.monotonic()
    lanes = tuple(int(x) for x in a.iobench_lanes.split(",")) if a.iobench_lanes else None
    result = run_bench(targets_from_rig(rig), RunOptions(seconds=a.iobench_seconds, repeat=a.iobench_repeat,
                                                         together=False, seed=a.seed, lanes=lanes))
    bench_path = save_result(rig, result)
    log(f"iobench: {bench_path} in {time.monotonic() - t0:.0f}s")
    for d in result.drives:
        m = d.model
        log(f"  {d.name}: bw_max {m.bw_max / 1e6:.1f} MB/s, lat {m.lat_s * 1e3:.2f} ms, stream {m.stream_bw / 1e6:.0f} MB/s, "
            f"iops_max {m.iops_max or 0:.0f}, fit error {m.fit_err_pct:.1f} %")

    # 2. solve, as `planner solve` does (and with the fitted models alone).
    inputs = load_inputs(rig_root, bench_path)
    chosen = choose_workload(rig_root, a.engine)
    if chosen.why is not None:
        raise SystemExit(f"planner_bench: the rig's model was not read: {chosen.why}")
    problem = rig_problem(inputs, chosen, a.engine, (), a.lanes, a.threads)
    plan, choice = solve_plan(inputs.sources, problem, inputs.provenance)
    plan_path = save_plan(rig, plan)
    fit_choice = solve(rig_problem(load_inputs(rig_root, bench_path, calibrate=False), chosen, a.engine, (), a.lanes,
                                   a.threads))
    joint = not problem.engine.phase_weights
    log(f"plan {plan_path}: prefill {label(choice.weights['prefill'], choice.mode)}, "
        f"decode {label(choice.weights['decode'], choice.mode)}")

    # 3. the grid; 4. measure it, interleaved over rounds (forward, then reversed), and each drive alone.
    grids = grid_for(problem, choice, fit_choice, a)
    if joint:
        grids = {ph: grids for ph in PHASES}
    pricer = Pricer(problem)
    measure = PatternMeasure(paths, problem, seed=a.seed, warmup=a.warmup, rest=a.rest)
    meas: dict = {}
    for ph in PHASES:
        arms = [("split", c) for c in grids[ph]] + [("alone", i) for i in range(len(paths))]
        log(f"{ph}: measuring {len(grids[ph])} candidates and {len(paths)} single drives, {a.rounds} rounds of {a.seconds}s")
        for rnd in range(a.rounds):
            for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                kind, x = arm
                if kind == "split":
                    v = measure(ph, x[0], a.seconds, x[1])
                else:
                    v = measure(ph, (1,), a.seconds, choice.mode, sources=[paths[x]])
                meas.setdefault((ph,) + arm, []).append(v)
    med = {k: float(np.median(v)) for k, v in meas.items()}
    pred = {(ph, c): prediction(pricer.price(ph, c[0], c[1]), c[0], c[1], problem.drives) for ph in PHASES for c in grids[ph]}

    def seconds(ph, c):      # the phase's predicted bytes at the measured rate
        p = pred[(ph, c)]
        return p["throughput_Bps"] * p["seconds"] / med[(ph, "split", c)]

    # 5. print the figures.
    print()
    print(f"planner benchmark ({a.engine}, {synth_format(a.engine)} model {a.layers} layers x {a.experts} experts, "
          f"dim {a.dim} ff {a.ff}): drives {', '.join(a.drive)}; iops {', '.join(a.iops) or 'none'}; {a.rounds} rounds x "
          f"{a.seconds}s per arm after {a.rest}s rest and {a.warmup}s warm-up; the engine's reads of each phase's steps")
    doc = {}
    for ph in PHASES:
        grid = grids[ph]
        c0 = (tuple(choice.weights[ph]), choice.mode)
        best = min(grid, key=lambda c: seconds(ph, c))
        eqc = next((c for c in grid if c[0] == (1,) * len(paths) and c[1] == choice.mode), None)
        alone = {names[i]: med[(ph, "alone", i)] for i in range(len(paths))}
        fastest = max(alone, key=alone.get)
        errs = [pred[(ph, c)]["throughput_Bps"] / med[(ph, "split", c)] - 1 for c in grid]
        print()
        print(f"== {ph} ==")
        print(f"{'candidate':>24} {'predicted MB/s':>15} {'measured MB/s':>14} {'error':>9} {'time vs best':>13}")
        for c in grid:
            p, m = pred[(ph, c)]["throughput_Bps"], med[(ph, "split", c)]
            tag = " <- planner" if c == c0 else (" <- equal" if c == eqc else "")
            tag += " (measured best)" if c == best else ""
            print(f"{label(*c):>24} {p / 1e6:15.1f} {m / 1e6:14.1f} {pct(p / m - 1):>9} "
                  f"{pct(seconds(ph, best) / seconds(ph, c) - 1):>13}{tag}")
        for n, v in alone.items():
            print(f"{'alone ' + n:>40} {v / 1e6:14.1f}")
        p0, m0 = pred[(ph, c0)]["throughput_Bps"], med[(ph, "split", c0)]
        vs_best = seconds(ph, best) / seconds(ph, c0) - 1
        print(f"planner chose {label(*c0)}: predicted {p0 / 1e6:.1f} MB/s, measured {m0 / 1e6:.1f} MB/s")
        print(f"  prediction error per phase (chosen): {pct(p0 / m0 - 1)}   (target within 5 %)")
        print(f"  prediction error over the grid: mean |error| {100 * np.mean(np.abs(errs)):.1f} %, max "
              f"{100 * np.max(np.abs(errs)):.1f} %")
        print(f"  choice vs measured best of the grid ({label(*best)}): {pct(vs_best)} in time"
              + ("   (target within 2 %)" if not joint else "   (one vector for both phases: judged jointly below)"))
        fc = (tuple(fit_choice.weights[ph]), fit_choice.mode)
        if (ph, "split", fc) in med:
            print(f"  iobench's fitted models alone (--fit-only) would choose {label(*fc)}: measured "
                  f"{med[(ph, 'split', fc)] / 1e6:.1f} MB/s ({pct(seconds(ph, best) / seconds(ph, fc) - 1)} vs the best)")
        gain_eq = f"x{seconds(ph, eqc) / seconds(ph, c0):.3f}" if eqc else "-"
        print(f"  gain over equal weights: {gain_eq};  over the fastest single drive ({fastest}): x{m0 / alone[fastest]:.3f}")
        doc[ph] = {"chosen": label(*c0), "best": label(*best), "pred_err": p0 / m0 - 1, "vs_best": vs_best}
    if joint:
        # the solver's objective on the measurements, by the function `engine-bridge autotune` picks with
        cands = grids["prefill"]
        arms = tuple(Arm(ph, c[0], (label(*c),), pred[(ph, c)]["throughput_Bps"], pred[(ph, c)], c[1])
                     for ph in PHASES for c in cands)
        trials = tuple(Trial(i, 0, med[(x.phase, "split", (x.weights, x.mode))], 0.0, 0.0) for i, x in enumerate(arms))
        picks = joint_pick(arms, Tally(trials, 1, False, 0.0))
        obj = picks["prefill"].objective
        best_i = picks["prefill"].arm
        c0 = (tuple(choice.weights["prefill"]), choice.mode)
        chosen_i = next(i for i, x in enumerate(arms) if x.phase == "prefill" and (x.weights, x.mode) == c0)
        print()
        print("== both phases (one weight vector): the solver's objective, sum over phases of seconds / the phase's fastest ==")
        for i, x in enumerate(arms[:len(cands)]):
            tag = (" <- planner" if i == chosen_i else "") + (" (measured best)" if i == best_i else "")
            print(f"{x.label:>24} {obj[i]:10.4f}{tag}")
        vs = obj[best_i] / obj[chosen_i] - 1
        print(f"  choice vs measured best of the grid ({arms[best_i].label}): {pct(vs)} on the objective   (target within 2 %)")
        doc["joint"] = {"chosen": label(*c0), "best": arms[best_i].label, "vs_best": vs}
    print()
    print(f"plan file: {plan_path} (rig {rig_root}, kept for inspection)")
    if a.summary:
        with open(a.summary, "w") as f:
            json.dump(doc, f)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--state", help=argparse.SUPPRESS)
    p.add_argument("--engine", default=DEFAULT_ENGINE, choices=list(ENGINES), help="the engine whose reads are planned and "
                                                                                   "measured")
    p.add_argument("--root", help="testbed folder (default: a fresh one, deleted afterwards)")
    p.add_argument("--drive", action="append", help="NAME:MBPS read ceiling (repeat; first = primary)")
    p.add_argument("--iops", action="append", help="NAME:IOPS read-operation ceiling (repeat)")
    p.add_argument("--size", default="2G", help="testbed image size per drive")
    p.add_argument("--layers", type=int, default=4, help="the generated model's layers with routed experts")
    p.add_argument("--experts", type=int, default=16, help="routed experts per layer")
    p.add_argument("--top-k", type=int, default=2, help="experts per token")
    p.add_argument("--dim", type=int, default=2048, help="model width (a GGUF's components are dim x ff in q8_0: "
                                                          "6,684,672 B at 2048 x 3072, about DeepSeek V4.1's 6,635,520)")
    p.add_argument("--ff", type=int, default=None, help="expert width (default: 3072 for a GGUF, 2048 for a colibri "
                                                         "directory, whose int8 experts are then 12 MiB: striped)")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per measured arm")
    p.add_argument("--warmup", type=float, default=WARMUP_S, help="seconds each arm reads before its clock starts")
    p.add_argument("--rest", type=float, default=REST_S, help="seconds without reads before each arm")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all arms (forward, reversed, ...)")
    p.add_argument("--lanes", type=int, default=None, help="reads in flight per drive (an engine that keeps them per drive; "
                                                           "default: the engine's)")
    p.add_argument("--threads", type=int, default=None, help="reads in flight over all drives (an engine with one pool; "
                                                             "default: the engine's)")
    p.add_argument("--steps", type=int, default=12, help="lattice resolution of the measured grid")
    p.add_argument("--keep", type=float, default=0.25, help="grid: lattice points predicted within this of the best")
    p.add_argument("--grid", type=int, default=12, help="most candidates measured per phase")
    p.add_argument("--iobench-seconds", type=float, default=2.0, help="seconds per iobench trial")
    p.add_argument("--iobench-repeat", type=int, default=3, help="windows per iobench trial (spread)")
    p.add_argument("--iobench-lanes", default=None, help="iobench's lane counts, e.g. 1,2,4 (default: each preset's own; "
                                                           "its prefill preset at 16 lanes needs ~600 MB of the model's "
                                                           "largest file)")
    p.add_argument("--sets", default=None,
                   help=f"ceiling sets to run, comma-separated: {', '.join(SETS)}, or custom (--drive/--iops; "
                        "the default when --drive or --iops is given, else default)")
    p.add_argument("--runs", type=int, default=1, help="runs per ceiling set (each: iobench, solve, measure)")
    p.add_argument("--summary", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    own = a.drive is not None or a.iops is not None
    if a.sets is None:
        a.sets = "custom" if own else "default"          # --drive alone means: measure these drives
    elif own and "custom" not in a.sets.split(",") and not a.inner:
        p.error(f"--drive/--iops are the 'custom' set, which --sets {a.sets} does not run: add custom to --sets, "
                "or drop --drive/--iops")
    a.drive = a.drive or SETS["default"][0]
    a.iops = a.iops if a.iops is not None else SETS["default"][1]
    if a.ff is None:
        a.ff = 3072 if synth_format(a.engine) == "gguf" else 2048
    if a.inner:
        return inner(a)
    a.sets = [x.strip() for x in a.sets.split(",") if x.strip()]
    unknown = [x for x in a.sets if x not in SETS and x != "custom"]
    if unknown:
        p.error(f"--sets: unknown set {unknown[0]!r}; known: {', '.join(SETS)}, custom")
    a.passthrough = []
    for opt in ("engine", "layers", "experts", "top_k", "dim", "ff", "seconds", "warmup", "rest", "rounds", "lanes",
                "threads", "steps", "keep", "grid", "iobench_seconds", "iobench_repeat", "iobench_lanes"):
        if getattr(a, opt) is not None:
            a.passthrough += ["--" + opt.replace("_", "-"), str(getattr(a, opt))]
    return outer(a)


if __name__ == "__main__":
    sys.exit(main())
