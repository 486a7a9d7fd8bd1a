"""The real colibri end to end under a RAM budget: a grid of weights x modes (buffered, O_DIRECT,
O_DIRECT + stripes) x drive sets, run by colibri itself through `engine-bridge launch` on throttled
testbed drives, interleaved, RUNS runs per arm, at two budgets — about a quarter of the model
(the reference rig's 128/518 of its bytes for the page cache, plus the processes' own memory) and
the whole model in RAM (twice its bytes). Per arm: colibri's measured tok/s, the plan's reads-only
and end-to-end predictions and their errors; the planner's pick beside the grid's best; the order
of the modes, measured and predicted.

    COLIBRI_BIN=/path/to/colibri python -m bench.colibri_e2e_bench [--limits 120,60,60] [--runs 3]
                                                                  [--pacing service|throttle]

The drives are paced by their service time by default (`iobench testbed up --pacing service`: each
request served in bytes / rate after the one before it): blk-throttle lets a drive left idle serve
its next read at once (bench/throttle_burst_bench.py), which colibri's unstriped loads, each on
one drive, draw on and its striped loads do not, so on throttled drives (`--pacing throttle`) the
unstriped arms run faster than any real drive of that ceiling would serve them.

Per budget: CAL_RUNS calibration runs (`engine-bridge launch` of the equal-weights buffered
profile), whose lines the product reads (engines/colibri/colibri_workload.py), the median of each
figure recorded in a plan (as the real-engine tuner records its winner's); then
`planner solve` under the budget (`--page-cache auto`: the cgroup's limit less colibri's own
memory and the tool's) prices the grid with that calibration. The measured tok/s is colibri's
own: its generated tokens over its PROFILE line's seconds (the printed `%.1f tok/s` is too coarse
at these speeds). `drives/colibri`: the bytes the testbed's drives served over a run (their loop
devices' counters) per byte colibri says it fetched — below 1 where the page cache served
re-reads, above 1 where the kernel's readahead read more than was asked; `req KiB`: the drives'
mean request over a run (the same counters: bytes over requests); `cache MB`, `own MB`: the
page cache and the processes' own memory the testbed's memory group held at their peak over a
run (its memory.stat, every 20 ms). The model is `engine-bridge synth --format colibri` (4 layers x 16 experts,
top-4, int8), colibri's oracle mode (REF=: fixed prompt, greedy), its cache 2 experts per layer
(CAP_RAISE=0). MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench.colibri_launch_bench import require_colibri_bin
from bench.pattern_bench import BIN
from bench.testbed import PACINGS, Testbed, available, drop_caches, usage_exit

NAMES = ("internal", "green", "white")
SYNTH = ("--format", "colibri", "--layers", "4", "--experts", "16", "--top-k", "4", "--shards", "1")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
GEN = 16
CAP = 2
BUDGETS = (("a quarter of the model", "ref+256M"), ("the whole model in RAM", "200%"))
MODES = ((), ("direct",), ("direct", "stripe"))
CAL_RUNS = 3


def step(title: str, *cmd: str, wrap=None, capture: bool = False, env=None) -> subprocess.CompletedProcess:
    """A command of this checkout's environment (its console scripts), under the testbed's wrap."""
    exe = os.path.join(BIN, cmd[0]) if os.path.exists(os.path.join(BIN, cmd[0])) else cmd[0]
    print(f"== {title}\n$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    p = subprocess.run([*(wrap or []), exe, *cmd[1:]], stdout=subprocess.PIPE if capture else None, text=True, env=env)
    print(f"   ({time.perf_counter() - t0:.1f}s, exit {p.returncode})", file=sys.stderr, flush=True)
    if p.returncode != 0:
        raise SystemExit(f"colibri_e2e_bench: step '{title}' failed with exit {p.returncode}")
    return p


def _label(weights, mode) -> str:
    return ":".join(map(str, weights)) + " " + ("+".join(mode) if mode else "buffered")


def drive_reads(tb) -> tuple[int, int]:
    """(bytes, requests) the testbed's drives have read so far (their loop devices' /sys/block/*/stat)."""
    nbytes = requests = 0
    for d in tb.state["drives"]:
        with open(f"/sys/block/{os.path.basename(d['device'])}/stat") as f:
            fields = f.read().split()
        nbytes, requests = nbytes + int(fields[2]) * 512, requests + int(fields[0])
    return nbytes, requests


def launch(tb, rig: str, binary: str, profile: str, out: str, env: dict) -> dict:
    """One run of colibri by `engine-bridge launch` under the testbed (page cache dropped first),
    with the bytes and requests the drives served over it (`drive_reads`: what a buffered run's
    page cache and the kernel's readahead make of colibri's own fetches)."""
    drop_caches()
    before = drive_reads(tb)
    peaks, done = [0, 0], threading.Event()

    def sample():          # what the memory group holds, every 20 ms: (page cache, the processes' own) at their peak
        from iobench.testbed_spec import memory_use

        stat = os.path.join(tb.ram.cgroup, "memory.stat") if tb.ram is not None and tb.ram.cgroup else ""
        while stat and not done.wait(0.02):
            try:
                with open(stat) as f:
                    cache, anon = memory_use(tb.ram.controller, f.read())
            except OSError:
                return
            peaks[0], peaks[1] = max(peaks[0], cache), max(peaks[1], anon)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    p = subprocess.run([*tb.wrap, os.path.join(os.path.dirname(sys.executable), "engine-bridge"), "launch", "--rig", rig,
                        "--binary", binary, "--profile", profile, "--out", out, "--json", "--", str(CAP)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done.set()
    watcher.join()
    doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"ok": False, "error": p.stderr.strip()[-300:]}
    cal = doc.get("calibration") or {}
    doc["measured"] = cal["tokens"] / cal["run_s"] if cal.get("tokens") and cal.get("run_s") else None
    after = drive_reads(tb)
    doc["drive_bytes"], doc["drive_requests"] = after[0] - before[0], after[1] - before[1]
    doc["group_peak"] = tuple(peaks)
    return doc


def grid_arms(plan, problem, n: int):
    """The grid: (drive set, weights, mode) with each phase's prediction; the pick's weights and
    equal weights over all drives (2:1:1 where the pick is equal), 2:1 over the first two, each in
    every mode."""
    from engine_bridge.tuning.judge import EngineArm
    from planner.solve import Pricer, problem_prediction
    from planner.whatif import only_drives

    pick = tuple(plan.decode.weights)
    sets = [(tuple(range(n)), [pick] + [w for w in ((1,) * n, (2,) + (1,) * (n - 1)) if w != pick][:1]),
            ((0, 1), [(2, 1)])]
    arms = []
    for srcs, weights in sets:
        sub = problem if len(srcs) == n else only_drives(problem, srcs)
        pricer = Pricer(sub)
        for w in weights:
            for m in MODES:
                pred = {ph: problem_prediction(sub, pricer.price(ph, w, frozenset(m)), w, frozenset(m))
                        for ph in ("prefill", "decode")}
                names = "+".join(NAMES[i] for i in srcs)
                roles = ("pick",) if (len(srcs) == n and w == pick and frozenset(m) == plan.switches) else ()
                arms.append(EngineArm(f"{names} {_label(w, m)}", roles, w, None, m, srcs, pred))
    return arms


def one_budget(tb, binary: str, title: str, ram: str, model: str, rig: str, out: str, runs: int) -> list[str]:
    from core.rig import load_rig
    from engine_bridge.tuning.judge import EngineArm, predicted_tok_s
    from engine_bridge.tuning.real_engine import arm_plan, export_arm
    from planner.plans import latest_plan_path, load_inputs, load_plan
    from planner.rigmodel import world_problem

    ram_line = tb.set_ram_for([model], ram)
    ref = os.path.join(out, "ref.json")
    env = {**os.environ, "REF": ref, "PROF": "1", "USAGE_SAVE": "0", "CAP_RAISE": "0"}
    solve = ("planner", "solve", "--rig", rig, "--engine", "colibri", "--prompt-tokens", str(len(PROMPT)),
             "--engine-arg", str(CAP), "--page-cache", "auto", "--quiet")
    # the calibration: equal weights, buffered, one run of the engine; its lines go into a plan
    step("a first plan (no calibration of this budget yet)", *solve, wrap=tb.wrap, capture=True, env=env)
    plan0 = load_plan(latest_plan_path(load_rig(rig)))
    n = len(plan0.sources)
    eq = EngineArm("calibration", (), (1,) * n, None, (), tuple(range(n)), {})
    prof = export_arm(rig, eq, arm_plan(plan0, eq), os.path.join(out, "profiles", "calibration.env"), "calibration",
                      "colibri", allow_unverified=True)
    cal_runs = [launch(tb, rig, binary, prof, os.path.join(out, f"calibration{k}"), env) for k in range(CAL_RUNS)]
    if not all(d.get("calibration") for d in cal_runs):
        raise SystemExit(f"colibri_e2e_bench: a calibration run printed no [PROF] lines: "
                         f"{[d.get('error') for d in cal_runs]}")
    # the median of each figure over the calibration runs, as the real-engine tuner keeps it
    from engine_bridge.tuning.judge import EngineRun
    from engine_bridge.tuning.real_engine import run_calibration
    from planner.rigmodel import record_calibration

    cal = run_calibration([EngineRun(0, 0, None, 0.0, calibration=d["calibration"]) for d in cal_runs], 0)
    record_calibration(rig, "colibri", cal)
    step("the plan under the budget, with the calibration", *solve, wrap=tb.wrap, capture=True, env=env)
    path = latest_plan_path(load_rig(rig))
    plan = load_plan(path)
    world = plan.provenance.get("world") or {}
    inputs = load_inputs(rig)
    # priced as the plan was (this process runs outside the RAM budget): its room and its buffered excess
    _, problem, _ = world_problem(rig, inputs, "colibri", prompt_tokens=len(PROMPT), engine_args=(str(CAP),),
                                  page_cache_bytes=int(world.get("page_cache_bytes") or 0), env=env,
                                  buffered_excess=float(world.get("buffered_excess") or 0.0))
    arms = grid_arms(plan, problem, n)
    for k, a in enumerate(arms):
        os.makedirs(os.path.join(out, "profiles"), exist_ok=True)
        arms[k] = __import__("dataclasses").replace(
            a, profile=export_arm(rig, a, arm_plan(plan, a), os.path.join(out, "profiles", f"arm{k}.env"), f"arm{k}",
                                  "colibri", allow_unverified=True))
    measured: dict[int, list[float]] = {k: [] for k in range(len(arms))}
    served: dict[int, list[tuple[float, float]]] = {k: [] for k in range(len(arms))}   # (drives', colibri's) bytes
    held: dict[int, list[tuple[int, int]]] = {k: [] for k in range(len(arms))}        # the group's peak (cache, own)
    sizes: dict[int, list[float]] = {k: [] for k in range(len(arms))}                 # the drives' mean request, bytes
    t0 = time.monotonic()
    for r in range(runs):
        order = list(range(len(arms)))
        order = order[r % len(order):] + order[:r % len(order)]
        if r % 2:
            order.reverse()
        for k in order:
            d = launch(tb, rig, binary, arms[k].profile, os.path.join(out, f"run{r}-arm{k}"), env)
            if d.get("ok") and d.get("measured"):
                measured[k].append(d["measured"])
                served[k].append((d["drive_bytes"], (d["calibration"].get("bytes_read") or 0)))
                sizes[k].append(d["drive_bytes"] / d["drive_requests"] if d["drive_requests"] else 0.0)
                held[k].append(d["group_peak"])
            else:
                print(f"   arm {arms[k].label} run {r + 1}: FAILED {d.get('failed') or d.get('error')}", file=sys.stderr)
    seconds = time.monotonic() - t0
    lines = [f"== {title}: RAM budget {ram}", ram_line,
             f"calibration (colibri's own lines, equal weights buffered, median of {CAL_RUNS} runs): "
             f"cache {cal.get('cache_per_layer')}/layer, "
             f"{cal['lines'].get('mb_per_token')} MB/token, {cal['lines'].get('loads_per_token')} loads/token, "
             f"hit {cal['lines'].get('hit_pct')} %, avg-conc {cal['lines'].get('avg_conc', 0):.2f}, "
             f"{cal.get('in_flight')} loads in flight (omp threads, PIPE={cal['lines'].get('pipe')}), "
             f"compute {cal.get('compute_s', 0) / cal['tokens']:.3f} s/token, I/O share {cal['lines'].get('io_share_pct')} %",
             f"plan's world: page cache room {int(world.get('page_cache_bytes') or 0) / 1e6:.0f} MB "
             f"({world.get('ram')}; colibri resident {int(world.get('resident_bytes') or 0) / 1e6:.0f} MB), "
             f"cache {world.get('cache_experts')} experts ({world.get('cache_from')}); the room from "
             f"{world.get('page_cache_from')}; buffered reads priced at +{100 * float(world.get('buffered_excess') or 0):.1f} % "
             "of their bytes (what the calibration's drives read beyond its fetches: readahead)",
             f"{len(arms)} arms x {runs} runs interleaved in {seconds:.0f} s; tok/s = colibri's generated tokens over its "
             f"PROFILE seconds (prompt {len(PROMPT)}, {GEN} generated)",
             f"{'arm':<34} {'measured':>8} {'spread':>7} {'reads':>7} {'err':>8} {'e2e':>7} {'err':>8} "
             f"{'drives/colibri':>14} {'req KiB':>7} {'cache MB':>8} {'own MB':>7}"]
    rows = []
    for k, a in enumerate(arms):
        xs = measured[k]
        med = statistics.median(xs) if xs else None
        pr = predicted_tok_s(a, "run", len(PROMPT), GEN)
        pe = predicted_tok_s(a, "run", len(PROMPT), GEN, e2e=True)
        er = 100 * (pr / med - 1) if pr and med else None
        ee = 100 * (pe / med - 1) if pe and med else None
        spread = 100 * (max(xs) - min(xs)) / med if med and len(xs) > 1 else 0.0
        rows.append((a, med, pr, pe, er, ee))
        ratio = [dr / cb for dr, cb in served[k] if cb > 0]      # bytes the drives served per byte colibri fetched
        lines.append(f"{a.label:<34} {_f(med):>8} {spread:>6.1f}% {_f(pr):>7} {_p(er):>8} {_f(pe):>7} {_p(ee):>8} "
                     f"{_f(statistics.median(ratio)) if ratio else '-':>14} "
                     f"{statistics.median(sizes[k]) / 1024 if sizes[k] else 0:>7.0f} "
                     f"{statistics.median([c for c, _ in held[k]]) / 1e6 if held[k] else 0:>8.0f} "
                     f"{statistics.median([o for _, o in held[k]]) / 1e6 if held[k] else 0:>7.0f}"
                     + ("  <- planner's pick" if a.roles else ""))
    done = [x for x in rows if x[1]]
    best = max(done, key=lambda x: x[1])
    pick = next((x for x in done if x[0].roles), None)
    errs = [abs(x[5]) for x in done if x[5] is not None]
    lines.append(f"median |e2e error| {statistics.median(errs):.1f} % (target <= 10 %); median |reads-only error| "
                 f"{statistics.median([abs(x[4]) for x in done if x[4] is not None]):.1f} %")
    if pick:
        lines.append(f"planner's pick {pick[0].label}: {pick[1]:.3f} tok/s; grid's best {best[0].label}: {best[1]:.3f} "
                     f"tok/s; pick at {100 * pick[1] / best[1]:.1f} % of the best (target >= 97 %)")
    by_mode_m = {"+".join(m) or "buffered": max((x[1] for x in done if x[0].mode == m), default=0.0) for m in MODES}
    by_mode_p = {"+".join(m) or "buffered": max((x[3] or 0.0 for x in done if x[0].mode == m), default=0.0) for m in MODES}
    om = sorted(by_mode_m, key=lambda k: -by_mode_m[k])
    op = sorted(by_mode_p, key=lambda k: -by_mode_p[k])
    lines.append(f"modes, best arm each, measured: {' > '.join(f'{k} {by_mode_m[k]:.3f}' for k in om)}; predicted e2e: "
                 f"{' > '.join(f'{k} {by_mode_p[k]:.3f}' for k in op)}; order {'right' if om == op else 'WRONG'}")
    return lines


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _p(x) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def run_all(binary: str, limits: dict, out: str, runs: int, budgets, pacing: str) -> list[str]:
    with Testbed(limits, size="1G", ram=budgets[0][1], pacing=pacing) as tb:
        drives = tb.mounts()
        rig = os.path.join(out, "rig")
        model = os.path.join(drives["internal"], "model")
        os.makedirs(os.path.join(out, "profiles"), exist_ok=True)
        json.dump({"prompt_ids": PROMPT, "full_ids": PROMPT + [0] * GEN}, open(os.path.join(out, "ref.json"), "w"))
        step("the model", "engine-bridge", "synth", model, *SYNTH, wrap=tb.wrap)
        step("a rig", "replicas", "init", "--rig", rig, "--model", model, "--name", "internal")
        step("two replicas", "replicas", "sync", "--rig", rig, model, drives["green"], drives["white"], "--piece-size",
             "16M", "--quiet", wrap=tb.wrap, capture=True)
        step("drive ceilings", "iobench", "run", "--rig", rig, "--preset", "seq,prefill,decode", "--lanes", "1,2,4",
             "--seconds", "0.3", "--repeat", "2", "--quiet", wrap=tb.wrap, capture=True)
        head = (f"colibri {binary}: drives {' : '.join(f'{v:g}' for v in limits.values())} MB/s (internal, green, white), "
                f"paced by {pacing}; model 4 layers x 16 experts, its cache {CAP}/layer")
        lines = [head]
        for title, ram in budgets:
            got = one_budget(tb, binary, title, ram, model, rig, out, runs)
            print("\n".join(got), file=sys.stderr, flush=True)        # as each budget ends
            lines += got
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limits", default="120,60,60", help="Read ceilings MB/s of internal, green, white.")
    ap.add_argument("--runs", type=int, default=3, help="Runs per arm.")
    ap.add_argument("--budget", action="append", default=None, metavar="RAM",
                    help="A RAM budget as `iobench testbed up --ram` takes it (repeatable; default: ref+256M and 200%%).")
    ap.add_argument("--out", default=None, help="Working folder (default: a temporary one, removed).")
    ap.add_argument("--pacing", default="service", choices=PACINGS,
                    help="How the drives keep their ceilings (iobench testbed up --pacing): service (default: each "
                         "request served in bytes / rate, nothing banked while idle, as a real drive) or throttle "
                         "(blk-throttle, whose idle credit unstriped reads draw on).")
    a = ap.parse_args()
    binary = require_colibri_bin()
    ok, why = available(a.pacing)
    if not ok:
        usage_exit(f"no testbed here: {why}")
    limits = dict(zip(NAMES, (float(x) for x in a.limits.split(","))))
    budgets = tuple((b, b) for b in a.budget) if a.budget else BUDGETS
    with tempfile.TemporaryDirectory(prefix="colibri-e2e-", dir=a.out) as out:
        print("\n".join(run_all(binary, limits, out, a.runs, budgets, a.pacing)), flush=True)


if __name__ == "__main__":
    main()
