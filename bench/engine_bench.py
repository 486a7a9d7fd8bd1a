"""The ladder on throttled drives: does the embedded engine go faster with 1, 2, 3 drives?

Builds three throttled drives (bench/testbed.py; default 30:15:15 MB/s, ceilings 2:1:1),
writes a synthetic MoE model with `engine-bridge synth` onto the first and byte-identical copies
onto the others, then runs the harness's ladder (U S1 U S2 S2 U S1 U: one drive, plus one replica,
plus two, each arm a fresh `engine-bridge run` process inside the drives' blkio group) and prints
prefill and steady decode tok/s at 1/2/3 drives with their ratios to one drive, next to the ideal
ratio (sum of the ceilings over the primary's).

RAM: every arm runs under the testbed's RAM budget (`--ram`, default RAM below): the reference
rig's share of the model's bytes (128 GB for 518 GB) for the page cache, plus what the ladder and
one `engine-bridge run` hold of their own at the defaults (measured: 843 MiB for the run, whose 32
cached experts are dequantized in RAM, and ~70 MiB for the ladder). With another --cache-experts
or model, give --ram ref+SIZE to match (an OOM kill says so); `--ram none` runs without a budget.

Sizing: 4 layers x 32 experts, top-2, dim 1024, ff 1024 (q8_0), 64 prompt tokens: prefill reads
~420 MB of routed experts (31 of 32 experts per layer), while its numpy work takes ~1-2 s on this shared 2-core
machine: at 30:15:15 MB/s (14 s on one drive, 7 s on three) the drives, not numpy, set the pace.
Each expert component is 1,114,112 B = 4.25 split blocks, so a 2:1:1 split gives every drive a
piece of every decode read (with 2-block components the engine's rule leaves the third drive idle
in decode). It takes the testbed lock and always takes the testbed down (also on SIGINT, SIGTERM
and SIGHUP); where there is no testbed it says so in one line and exits 2.

Run it as root:

  .venv/bin/python bench/engine_bench.py [--drive a:60 ...]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.testbed import Testbed, parse_drives, require_testbed, usage_exit  # noqa: E402
from engine_bridge.harness.runner import ladder_specs, run_bench  # noqa: E402

ENGINE = [sys.executable, "-c", "from engine_bridge.cli import main; main()"]
RAM = "ref+960M"       # the page cache's share at the reference ratio + the processes' own memory at their peak


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def synth_on_drives(paths, layers, experts, top_k, dim, ff, quant) -> int:
    """Synthesise the model on the first drive and copy it byte for byte to the others (the
    replicas); flushed to the drives. Returns its size in bytes. Shared with hedge_bench."""
    sh(ENGINE + ["synth", paths[0], "--layers", str(layers), "--experts", str(experts), "--top-k", str(top_k),
                 "--dim", str(dim), "--ff", str(ff), "--seed", "7", "--quant", quant])
    for p in paths[1:]:
        shutil.copyfile(paths[0], p)
    os.sync()
    return os.path.getsize(paths[0])


def ceiling_weights(ceilings) -> tuple[int, ...]:
    """The ceilings' ratio as the smallest integer weights (30:15:15 MB/s -> 2:1:1), at most 100."""
    tenths = [max(1, round(c * 10)) for c in ceilings]
    g = math.gcd(*tenths)
    w = [x // g for x in tenths]
    if max(w) > 100:
        w = [max(1, round(x * 100 / max(w))) for x in w]
    return tuple(w)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drive", action="append", default=[], metavar="NAME:MBPS",
                    help="drive and its read ceiling in MB/s, primary first (default a:30 b:15 c:15)")
    ap.add_argument("--size", default="1G", help="size of each drive")
    ap.add_argument("--weights", default=None, help="prefill weights (default: the drives' read ceilings' ratio, "
                                                     "2:1:1 for the default drives)")
    ap.add_argument("--decode-weights", default=None, help="decode weights (default: the prefill weights)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--quant", default="q8_0", help="routed expert type passed to synth")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=24)
    ap.add_argument("--cache-experts", type=int, default=32)
    ap.add_argument("--max-other-cpu", type=float, default=2.0,
                    help="load gate, cores; this machine is shared, so by default it only records")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=None, help="run folder (default: a new folder in /var/tmp)")
    ap.add_argument("--ram", default=RAM, help=f"the testbed's RAM budget, as `iobench testbed up --ram` takes it "
                                               f"(default {RAM}; none: no budget)")
    args = ap.parse_args()

    drives = parse_drives(args.drive or ["a:30", "b:15", "c:15"], three="primary first")
    ceilings = list(drives.values())
    if sum(ceilings) > 450:
        usage_exit("keep the sum of read ceilings at or below 450 MB/s (the backing disk is shared)")
    pre = (tuple(int(x) for x in args.weights.replace(",", ":").split(":")) if args.weights
           else ceiling_weights(ceilings))
    dec = tuple(int(x) for x in args.decode_weights.replace(",", ":").split(":")) if args.decode_weights else pre
    require_testbed()

    out = args.out or tempfile.mkdtemp(prefix="engine-bench-run-", dir="/var/tmp")
    with Testbed(drives, size=args.size, ram=args.ram) as tb:
        paths = [os.path.join(m, "model.gguf") for m in tb.mounts().values()]
        t0 = time.time()
        size = synth_on_drives(paths, args.layers, args.experts, args.top_k, args.dim, args.ff, args.quant)
        tb.set_ram_for(size)
        print(f"model {size / 1e6:.0f} MB ({args.layers} layers x {args.experts} experts, top-{args.top_k}, "
              f"dim {args.dim}, ff {args.ff}, {args.quant}) on {len(paths)} drives at "
              f"{':'.join(f'{c:g}' for c in ceilings)} MB/s, synth+copy {time.time() - t0:.0f}s", flush=True)

        specs = ladder_specs(paths, pre, dec)
        settings = {"prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
                    "cache_experts": args.cache_experts, "max_other_cpu": args.max_other_cpu,
                    "wrap": tb.wrap}

        def report(ev):
            print(f"  {ev.message}", file=sys.stderr, flush=True)

        doc, files = run_bench(specs, "ladder", settings, out, repeat=args.repeat, report=report)

    print(f"ladder {' '.join(doc['sequence'])}; prompt {args.prompt_tokens}, gen {args.gen_tokens}, "
          f"cache {args.cache_experts} experts; weights prefill {':'.join(map(str, pre))} decode "
          f"{':'.join(map(str, dec))}")
    print(f"{'drives':8} {'ok':>5} {'prefill tok/s':>13} {'ratio':>6} {'ideal':>6} {'of ideal':>8} "
          f"{'steady tok/s':>12} {'ratio':>6} {'misses/tok':>10}")
    for k, spec in enumerate(specs, start=1):
        m, g = doc["medians"][spec.name], doc["gains"][spec.name]
        ideal = sum(ceilings[:k]) / ceilings[0]
        f = lambda v, nd=2: "-" if v is None else f"{v:.{nd}f}"  # noqa: E731
        of = None if g["prefill_tps"] is None else g["prefill_tps"] / ideal
        print(f"{k:<8} {m['n']:>2}/{m['n'] + m['n_failed']:<2} {f(m['prefill_tps']):>13} {f(g['prefill_tps']):>6} "
              f"{ideal:6.2f} {f(of):>8} {f(m['gen_steady_tps']):>12} {f(g['gen_steady_tps']):>6} "
              f"{f(m['misses_per_token']):>10}")
    print("per arm (seq arm prefill steady others' CPU cores gates):")
    for r in doc["rows"]:
        load = r["gates"].get("load", {}).get("detail", r["error"])
        print(f"  {r['seq']:2} {r['arm']:8} {r['metrics'].get('prefill_tps')} {r['metrics'].get('gen_steady_tps')} "
              f"{'ok' if r['ok'] else 'FAILED ' + ','.join(r['failed'])}; {load}")
    hashes = {r["output_sha256"] for r in doc["rows"] if r["output_sha256"]}
    print(f"output hashes across all arms: {len(hashes)} distinct ({', '.join(h[:12] for h in hashes)})")
    print(f"results {files['results']}  summary {files['summary']}  chart {files['chart']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
