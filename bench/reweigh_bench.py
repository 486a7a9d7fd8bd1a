"""Re-weighting on throttled drives that change during a run, beside hedging only and neither.

Three throttled drives (bench/testbed.py; default internal:30 green:15 white:15 MB/s read ceilings)
and the plan's weights 2:1:1, right for them at plan time. Each scenario changes the drives while
the embedded engine runs (`engine-bridge run`, a fresh process per arm inside the drives' group,
interleaved ABBA by the harness; one output hash for all):

  crawl    white drops to 1 MB/s CRAWL_AT s after the arm starts and recovers CRAWL_FOR s later
           arms: reweigh (hedging + re-weighting, the engine's default), hedge (hedging only),
           neither, alone (internal and green alone at 2:1: the healthy drives)
  half     green reads at half its ceiling for the whole run (a busy drive): the 2:1:1 plan is stale
           arms: reweigh, hedge, neither, best (the right static plan for the new speeds, 4:1:2)
  healthy  nothing changes (throttled drives deliver in bursts)
           arms: reweigh, hedge, neither, hedge-burst (hedging that trusts a rate from its first
           piece, `--hedge-min-busy 0`: how hedging judged drives before)

It prints per scenario and arm the prefill and steady-decode tok/s (median of the arm's runs), the
ratios the issue's targets name, and per run the reader's plan changes (degraded / recovered /
re-weighted, from the run's events), and the output hashes. Every arm's plan gate is reported, not
used to drop the arm: an arm that re-weighted or degraded measured another plan, which is the point.

Run it as root:

  .venv/bin/python -m bench.reweigh_bench [--scenario crawl --scenario half --scenario healthy] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.engine_bench import synth_on_drives  # noqa: E402
from bench.testbed import Testbed, parse_drives, require_testbed  # noqa: E402
from engine_bridge.harness.arms import ArmSpec, plan_changes  # noqa: E402
from engine_bridge.harness.runner import run_bench, subprocess_runner  # noqa: E402

CRAWL_MBS = 1.0
REST_S = 1.0          # between arms: a throttle's unused budget must not carry into the next arm

FLAGS = {"reweigh": ["--hedge", "--reweigh", "--balance"], "hedge": ["--hedge", "--no-reweigh", "--no-balance"],
         "neither": ["--no-hedge", "--no-reweigh", "--no-balance"], "alone": ["--no-hedge", "--no-reweigh", "--no-balance"],
         "best": ["--no-hedge", "--no-reweigh", "--no-balance"],
         "hedge-burst": ["--hedge", "--no-reweigh", "--no-balance", "--hedge-min-busy", "0"]}
ARMS = {"crawl": ("reweigh", "hedge", "neither", "alone"), "half": ("reweigh", "hedge", "neither", "best"),
        "healthy": ("reweigh", "hedge", "neither", "hedge-burst")}


def scenario_runner(tb: Testbed, drives: dict[str, float], scenario: str, args):
    """The harness's runner for one scenario: the arm's flags, the drives' limits set before the
    arm (and changed during it, for a crawl), restored after it."""
    names = list(drives)
    slow = names[2] if scenario == "crawl" else names[1]

    def runner(spec, settings, workdir, seq):
        arm = spec.name.split(":", 1)[1]
        for n, mbs in drives.items():
            tb.throttle(n, mbs)
        if scenario == "half":
            tb.throttle(slow, drives[slow] / 2)
        time.sleep(REST_S)
        timers = []
        if scenario == "crawl":
            timers = [threading.Timer(args.crawl_at, tb.throttle, (slow, CRAWL_MBS)),
                      threading.Timer(args.crawl_at + args.crawl_for, tb.throttle, (slow, drives[slow]))]
        for t in timers:
            t.start()
        try:
            return subprocess_runner(spec, {**settings, "run_args": list(settings.get("run_args") or []) + FLAGS[arm]},
                                     workdir, seq)
        finally:
            for t in timers:
                t.cancel()
            for n, mbs in drives.items():
                tb.throttle(n, mbs)
    return runner


def specs_for(scenario: str, paths: list[str], weights: tuple[int, ...], best: tuple[int, ...]) -> list[ArmSpec]:
    out = []
    for arm in ARMS[scenario]:
        name = f"{scenario}:{arm}"
        if arm == "alone":
            out.append(ArmSpec(name, tuple(paths[:2]), weights[:2], weights[:2]))
        elif arm == "best":
            out.append(ArmSpec(name, tuple(paths), best, best))
        else:
            out.append(ArmSpec(name, tuple(paths), weights, weights))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drive", action="append", default=[], metavar="NAME:MBPS",
                    help="drive and its read ceiling in MB/s, primary first (default internal:30 green:15 white:15)")
    ap.add_argument("--weights", default="2:1:1", help="the plan's weights (default 2:1:1, right at plan time)")
    ap.add_argument("--best-half", default="4:1:2", help="the right static weights with the second drive at half speed")
    ap.add_argument("--scenario", action="append", default=[], choices=sorted(ARMS))
    ap.add_argument("--crawl-at", type=float, default=4.0, help="seconds after an arm starts that the crawl begins")
    ap.add_argument("--crawl-for", type=float, default=12.0, help="seconds the crawl lasts")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--gen-tokens", type=int, default=24)
    ap.add_argument("--cache-experts", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=1, help="repeat the ABBA pattern")
    ap.add_argument("--max-other-cpu", type=float, default=2.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    drives = parse_drives(args.drive or ["internal:30", "green:15", "white:15"], three="primary first")
    weights = tuple(int(x) for x in args.weights.split(":"))
    best = tuple(int(x) for x in args.best_half.split(":"))
    scenarios = args.scenario or ["crawl", "half", "healthy"]
    require_testbed()
    out = args.out or tempfile.mkdtemp(prefix="reweigh-bench-", dir="/var/tmp")
    results = {}
    with Testbed(drives, size=args.size) as tb:
        paths = [os.path.join(m, "model.gguf") for m in tb.mounts().values()]
        size = synth_on_drives(paths, args.layers, args.experts, 2, 1024, 1024, "q8_0")
        print(f"model {size / 1e6:.0f} MB ({args.layers} layers x {args.experts} experts) on "
              f"{', '.join(f'{n} {c:g} MB/s' for n, c in drives.items())}; plan {args.weights}; prompt "
              f"{args.prompt_tokens}, gen {args.gen_tokens}; crawl: {list(drives)[2]} at {CRAWL_MBS:g} MB/s from "
              f"{args.crawl_at:g} s for {args.crawl_for:g} s; half: {list(drives)[1]} at {drives[list(drives)[1]] / 2:g} MB/s",
              flush=True)
        for sc in scenarios:
            specs = specs_for(sc, paths, weights, best)
            settings = {"prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
                        "cache_experts": args.cache_experts, "max_other_cpu": args.max_other_cpu, "wrap": tb.wrap}
            doc, files = run_bench(specs, "ABBA", settings, os.path.join(out, sc), repeat=args.repeat,
                                   report=lambda ev: print(f"  {ev.message}", file=sys.stderr, flush=True),
                                   runner=scenario_runner(tb, drives, sc, args))
            results[sc] = (specs, doc, files)
    return report(results)


def report(results: dict) -> int:
    import json

    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    hashes = set()
    for sc, (specs, doc, files) in results.items():
        med = {}
        print(f"== {sc}: arms {' '.join(s.split(':')[1] for s in doc['sequence'])}")
        print(f"   {'arm':12} {'runs':>4} {'prefill tok/s':>13} {'steady tok/s':>12}  plan changes per run")
        for s in specs:
            rows = [r for r in doc["rows"] if r["arm"] == s.name and r["output_sha256"]]
            m = {k: statistics.median([r["metrics"][k] for r in rows if r["metrics"].get(k)]) if rows else None
                 for k in ("prefill_tps", "gen_steady_tps")}
            med[s.name.split(":")[1]] = m
            changes = []
            for r in rows:
                hashes.add(r["output_sha256"])
                path = os.path.join(files["dir"], "arms", f"{r['seq']:02d}-{r['arm']}.json")
                with open(path) as fh:
                    changes.append("; ".join(plan_changes(json.load(fh))) or "none")
            print(f"   {s.name.split(':')[1]:12} {len(rows):>4} {f(m['prefill_tps']):>13} {f(m['gen_steady_tps']):>12}  "
                  + " | ".join(changes))

        def ratio(a, b, k):
            x, y = med.get(a, {}).get(k), med.get(b, {}).get(k)
            return None if not x or not y else x / y
        other = {"crawl": "alone", "half": "best", "healthy": "neither"}[sc]
        for k, label in (("prefill_tps", "prefill"), ("gen_steady_tps", "steady decode")):
            print(f"   {label}: reweigh / {other} {f(ratio('reweigh', other, k))}, hedge / {other} "
                  f"{f(ratio('hedge', other, k))}, neither / {other} {f(ratio('neither', other, k))}"
                  + (f", hedge-burst / neither {f(ratio('hedge-burst', 'neither', k))}" if sc == "healthy" else ""))
        print(f"   results {files['results']}")
    print(f"output hashes across all arms and scenarios: {len(hashes)} distinct ({', '.join(h[:12] for h in hashes)})")
    return 0 if len(hashes) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
