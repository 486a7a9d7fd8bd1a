"""Hedged reads on throttled drives where one replica crawls while the plan's weight says it is fast.

Builds three throttled drives (bench/testbed.py; default internal:30 green:15 white:1 MB/s read
ceilings) and runs the embedded engine over them with the plan's weights 2:1:1 — the weights of
drives at 30:15:15, so white is asked for a quarter of every read at 1/45 of the others' speed.
Three arms, each a fresh `engine-bridge run` inside the drives' blkio group, interleaved ABBA by
the harness (one output hash gate for all):

  hedge     3 drives at 2:1:1, hedging on (the engine's default)
  no-hedge  3 drives at 2:1:1, --no-hedge (every read waits for white, as the engines do today)
  healthy   internal and green alone at 2:1 (what a plan that knew about white would do)

It prints prefill and steady decode tok/s per arm with the ratios hedge / no-hedge and
hedge / healthy, the late and hedged counters per drive, and the output hashes (one expected).

Sizing: 2 layers x 16 experts, top-2, dim 1024, ff 1024 (q8_0): each expert component is
1,114,112 B = 4.25 split blocks, so 2:1:1 gives white one block (262,144 B) of every read, a
quarter of a second at 1 MB/s. 16 prompt tokens and 8 decoded tokens with an 8-expert cache keep
a no-hedge arm under a minute. It takes the testbed lock and always takes the testbed down; where
there is no testbed it says so in one line and exits 2.

Run it as root:

  .venv/bin/python bench/hedge_bench.py [--drive internal:30 --drive green:15 --drive white:1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.engine_bench import synth_on_drives  # noqa: E402
from bench.testbed import Testbed, parse_drives, require_testbed, usage_exit  # noqa: E402
from engine_bridge.harness.arms import ArmSpec  # noqa: E402
from engine_bridge.harness.runner import run_bench, subprocess_runner  # noqa: E402

def hedge_runner(spec, settings, workdir, seq):
    """The harness's runner with the arm's hedging switch added to `run`'s arguments (re-weighting
    off in every arm: this bench measures hedging alone; bench/reweigh_bench.py measures both)."""
    flag = "--no-hedge" if spec.name == "no-hedge" else "--hedge"
    return subprocess_runner(spec, {**settings, "run_args": list(settings.get("run_args") or []) + [flag, "--no-reweigh"]},
                             workdir, seq)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drive", action="append", default=[], metavar="NAME:MBPS",
                    help="drive and its read ceiling in MB/s, primary first; the last one is the slow replica "
                         "(default internal:30 green:15 white:1)")
    ap.add_argument("--weights", default="2:1:1", help="the plan's weights (default 2:1:1: white looks as fast as green)")
    ap.add_argument("--size", default="1G", help="size of each drive")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=8)
    ap.add_argument("--cache-experts", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="repeat the ABBA pattern")
    ap.add_argument("--max-other-cpu", type=float, default=2.0,
                    help="load gate, cores; this machine is shared, so by default it only records")
    ap.add_argument("--out", default=None, help="run folder (default: a new folder in /var/tmp)")
    args = ap.parse_args()

    drives = parse_drives(args.drive or ["internal:30", "green:15", "white:1"], three="primary first, the slow replica last")
    ceilings = list(drives.values())
    if sum(ceilings) > 450:
        usage_exit("keep the sum of read ceilings at or below 450 MB/s (the backing disk is shared)")
    try:
        weights = tuple(int(x) for x in args.weights.replace(",", ":").split(":"))
    except ValueError:
        usage_exit(f"--weights {args.weights!r}: give three integers like 2:1:1")
    if len(weights) != 3 or min(weights) < 1:
        usage_exit(f"--weights {args.weights!r}: give three integers 1..100 like 2:1:1")
    require_testbed()

    out = args.out or tempfile.mkdtemp(prefix="hedge-bench-run-", dir="/var/tmp")
    with Testbed(drives, size=args.size) as tb:
        paths = [os.path.join(m, "model.gguf") for m in tb.mounts().values()]
        t0 = time.time()
        size = synth_on_drives(paths, args.layers, args.experts, args.top_k, args.dim, args.ff, "q8_0")
        names = list(drives)
        print(f"model {size / 1e6:.0f} MB ({args.layers} layers x {args.experts} experts, top-{args.top_k}, dim "
              f"{args.dim}, ff {args.ff}) on {', '.join(f'{n} {c:g} MB/s' for n, c in drives.items())}; plan weights "
              f"{':'.join(map(str, weights))}; synth+copy {time.time() - t0:.0f}s", flush=True)

        specs = [ArmSpec("hedge", tuple(paths), weights, weights),
                 ArmSpec("no-hedge", tuple(paths), weights, weights),
                 ArmSpec("healthy", tuple(paths[:2]), weights[:2], weights[:2])]
        settings = {"prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
                    "cache_experts": args.cache_experts, "max_other_cpu": args.max_other_cpu, "wrap": tb.wrap}

        def report(ev):
            print(f"  {ev.message}", file=sys.stderr, flush=True)

        doc, files = run_bench(specs, "ABBA", settings, out, repeat=args.repeat, report=report,
                               runner=hedge_runner)

    # The harness's plan gate fails an arm in which a source was degraded: in the hedge arm that is
    # the point (white is degraded for lateness), so medians here keep every arm whose output hash
    # matched and whose only failed gate is 'plan', and say how many of those there were.
    med = {}
    for s in specs:
        rows = [r for r in doc["rows"] if r["arm"] == s.name]
        good = [r for r in rows if r["output_sha256"] and set(r["failed"]) <= {"plan"}]
        m = {"n": len(good), "n_all": len(rows), "n_plan": sum(1 for r in good if "plan" in r["failed"])}
        for key in ("prefill_tps", "gen_steady_tps", "gen_tps"):
            vals = [r["metrics"].get(key) for r in good if r["metrics"].get(key)]
            m[key] = statistics.median(vals) if vals else None
        med[s.name] = m
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731

    def ratio(a, b, key):
        x, y = med[a].get(key), med[b].get(key)
        return None if not x or not y else x / y

    print(f"arms {' '.join(doc['sequence'])}; prompt {args.prompt_tokens}, gen {args.gen_tokens}, cache "
          f"{args.cache_experts} experts")
    print(f"{'arm':9} {'used':>5} {'prefill tok/s':>13} {'steady tok/s':>12} {'gen tok/s':>9}  degraded arms")
    for s in specs:
        m = med[s.name]
        print(f"{s.name:9} {m['n']:>2}/{m['n_all']:<2} {f(m['prefill_tps']):>13} "
              f"{f(m['gen_steady_tps']):>12} {f(m['gen_tps']):>9}  {m['n_plan']}")
    for key, label in (("prefill_tps", "prefill"), ("gen_steady_tps", "steady decode")):
        print(f"{label}: hedge / no-hedge {f(ratio('hedge', 'no-hedge', key))}x, hedge / healthy "
              f"{f(ratio('hedge', 'healthy', key))}x, no-hedge / healthy {f(ratio('no-hedge', 'healthy', key))}x")
    print("per arm (seq arm prefill steady; late / hedged per drive; slow drives):")
    for r in doc["rows"]:
        arm_json = os.path.join(files["dir"], "arms", f"{r['seq']:02d}-{r['arm']}.json")
        counters = ""
        if os.path.exists(arm_json):
            with open(arm_json) as fh:
                res = json.load(fh)
            counters = "  ".join(f"{names[s['index']]} {s.get('late', 0)}/{s.get('hedged', 0)}" for s in res["sources"])
            slow = [names[s["index"]] for s in res["sources"] if s.get("degraded")]
            counters += f"; degraded: {', '.join(slow) or 'none'}"
        print(f"  {r['seq']:2} {r['arm']:9} {r['metrics'].get('prefill_tps')} {r['metrics'].get('gen_steady_tps')}  "
              f"{counters}{'' if r['ok'] else '  FAILED ' + ','.join(r['failed'])}")
    hashes = {r["output_sha256"] for r in doc["rows"] if r["output_sha256"]}
    print(f"output hashes across all arms: {len(hashes)} distinct ({', '.join(h[:12] for h in hashes)})")
    print(f"results {files['results']}  summary {files['summary']}")
    return 0 if len(hashes) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
