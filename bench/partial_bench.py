"""Partial replicas on throttled drives: how much of a full replica's gain do 25 / 50 / 75 % buy?

Issue 21 (must show): a fast primary and a slower second drive (bench/testbed.py; default a:40
b:20 MB/s), a colibri-format model of many shards (engine-bridge synth --format colibri: 8 layers
x 16 experts, one layer per shard, ~200 MB). Steps:

1. two primary-only runs of the embedded engine record each expert's cache misses in the rig
   (rig/usage: the history `replicas sync --partial` ranks shards by, one run ranked, one held out);
2. `replicas sync --partial 25% / 50% / 75%` and a full `replicas sync` put four replicas on the
   second drive (each its own folder; copies are not throttled, only the runs are);
3. `iobench run` measures both drives (prefill and decode shapes, on a 256 MiB scratch file on
   each: a shard is too small for the prefill shape), and `planner solve --engine
   colibri` plans each arm's rig (primary alone, + full, + each partial), the planner pricing
   colibri's hash placement with what each copy holds;
4. each arm is run through the embedded engine executing colibri's read pattern with its plan's
   weights (`engine-bridge run --plan`), in the order U F P25 P50 P75 P75 P50 P25 F U (each arm
   twice, mirrored), inside the drives' throttle group.

Prints per arm: GB copied, measured prefill and decode tok/s (medians of its runs) and their gain
over the primary alone, gain per GB copied, and the planner's predicted gain beside the measured
one; plus what `sync --partial` reported (coverage on the held-out history) and the size it
would choose by the drives' bandwidth share (`--dry-run` with the ceilings in the rig). Exit 2
where there is no testbed. It takes the testbed lock and always takes the testbed down. As root:

  .venv/bin/python bench/partial_bench.py [--drive a:40 --drive b:20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.testbed import Testbed, parse_drives, require_testbed, step, tool, usage_exit, wait_writeback, write_random  # noqa: E402
from core import rig as rigmod  # noqa: E402

ARMS = ("U", "F", "P25", "P50", "P75")
ORDER = ("U", "F", "P25", "P50", "P75", "P75", "P50", "P25", "F", "U")
BUDGETS = {"P25": "25%", "P50": "50%", "P75": "75%"}
SCRATCH_BYTES = 256 << 20      # iobench's prefill shape at 4 lanes reads ~201 MB apart


def arm_rig(out: str, name: str, main: rigmod.Rig, replica: str | None, holds, bench_file: str) -> str:
    """A rig of its own per arm: the primary ('a') and at most one replica ('b'), with the iobench
    result, so `planner solve` plans exactly that arm's drives."""
    root = os.path.join(out, f"rig-{name}")
    reps = (rigmod.Member(replica, "b", "replica", holds),) if replica else ()
    rigmod.save_rig(rigmod.Rig(root, rigmod.Member(main.model.path, "a", "primary"), reps, main.layout, main.format,
                               main.files))
    os.makedirs(os.path.join(root, "bench"), exist_ok=True)
    shutil.copy(bench_file, os.path.join(root, "bench", os.path.basename(bench_file)))
    return root


def newest(folder: str) -> str:
    return os.path.join(folder, sorted(f for f in os.listdir(folder) if f.endswith(".json"))[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drive", action="append", default=[], metavar="NAME:MBPS",
                    help="the primary and the second drive with their read ceilings in MB/s (default a:40 b:20)")
    ap.add_argument("--size", default="1536M", help="size of each drive")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=12)
    ap.add_argument("--cache-experts", type=int, default=16)
    ap.add_argument("--out", default=None, help="working folder (default: a new folder in /var/tmp)")
    args = ap.parse_args()
    drives = parse_drives(args.drive or ["a:40", "b:20"])
    if len(drives) != 2:
        usage_exit("give exactly two --drive NAME:MBPS (the primary first)")
    require_testbed()
    out = args.out or tempfile.mkdtemp(prefix="partial-bench-", dir="/var/tmp")
    t0 = time.perf_counter()
    with Testbed(drives, size=args.size) as tb:
        result = flow(args, out, list(tb.mounts().values()), tb.wrap)
    report(args, drives, result, time.perf_counter() - t0, out)
    return 0


def flow(args, out: str, mounts: list[str], w: list[str]) -> dict:
    a, b = mounts
    model = os.path.join(a, "moe")
    rig = os.path.join(out, "rig")
    step("synth", tool("engine-bridge") + ["synth", model, "--format", "colibri", "--layers", str(args.layers),
                                          "--experts", str(args.experts), "--dim", str(args.dim), "--ff", str(args.ff),
                                          "--shards", str(args.layers), "--seed", "7"], [])
    os.sync()
    step("replicas init", tool("replicas") + ["init", "--rig", rig, "--model", model, "--name", "a"], [])
    run_args = ["--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
                "--cache-experts", str(args.cache_experts), "--no-hedge", "--no-balance", "--json"]
    for i in range(2):      # the usage history: one run ranks the shards, the other is held out
        step(f"history run {i + 1}", tool("engine-bridge") + ["run", "--rig", rig, "--model", model,
                                                              "--engine", "colibri", "--prompt-seed", str(100 + i),
                                                              *run_args], w)
    copies, partial = {}, {}
    for arm, budget in BUDGETS.items():
        dest = os.path.join(b, arm.lower())
        os.makedirs(dest)
        doc = json.loads(step(f"sync --partial {budget}", tool("replicas") + [
            "sync", "--rig", rig, "--piece-size", "16M", "--partial", budget, "--json", "-q", "--allow-same-device", model,
            dest], []))
        partial[arm] = doc["partial"][0]
        copies[arm] = (os.path.join(dest, "moe"), tuple(doc["partial"][0]["holds"]), doc["partial"][0]["bytes"])
    dest = os.path.join(b, "full")
    os.makedirs(dest)
    doc = json.loads(step("sync (full)", tool("replicas") + ["sync", "--rig", rig, "--piece-size", "16M", "--json", "-q",
                                                             "--allow-same-device", model, dest], []))
    copies["F"] = (os.path.join(dest, "moe"), None, doc["size"])
    main_rig = rigmod.load_rig(rig)
    # the drives' ceilings, measured on a scratch file on each drive (a shard is too small for the
    # prefill shape's 32 MiB chunks at 4 lanes), named as the arms' rigs name the drives
    mini = os.path.join(out, "rig-iobench")
    scratch = [os.path.join(a, "scratch.bin"), os.path.join(b, "scratch.bin")]
    write_random(scratch, SCRATCH_BYTES, seed=3)
    wait_writeback()
    rigmod.save_rig(rigmod.Rig(mini, rigmod.Member(scratch[0], "a", "primary"),
                               (rigmod.Member(scratch[1], "b", "replica"),)))
    step("iobench run", tool("iobench") + ["run", "--rig", mini, "--preset", "prefill,decode", "--lanes", "1,2,4",
                                           "--seconds", "0.3", "--repeat", "2", "-q"], w)
    bench_file = newest(os.path.join(mini, "bench"))
    # what sync would choose by the bandwidth share, now that the rig has the drives' ceilings
    os.makedirs(os.path.join(rig, "bench"), exist_ok=True)
    shutil.copy(bench_file, os.path.join(rig, "bench", os.path.basename(bench_file)))
    share_dest = os.path.join(b, "share")
    os.makedirs(share_dest)
    sized = json.loads(step("sync --partial 100% --dry-run", tool("replicas") + [
        "sync", "--rig", rig, "--partial", "100%", "--dry-run", "--json", "-q", "--allow-same-device", model,
        share_dest], []))["partial"][0]
    plans, rigs = {}, {}
    for arm in ARMS:
        replica, holds, _ = copies.get(arm, (None, None, 0))
        rigs[arm] = arm_rig(out, arm, main_rig, replica, holds, bench_file)
        # priced for the runs' own workload: the planner's default prompt (512) and cache (30 % of the
        # routed experts) give another miss rate, and whole-expert decode gains from a slower second
        # drive only when a layer misses several experts (docs/planner.md)
        step(f"planner solve {arm}", tool("planner") + ["solve", "--rig", rigs[arm], "--engine", "colibri",
                                                        "--page-cache", "0", "--prompt-tokens", str(args.prompt_tokens),
                                                        "--cache-experts", str(args.cache_experts), "--json"], [])
        with open(newest(os.path.join(rigs[arm], "plans"))) as f:
            plans[arm] = json.load(f)
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    hashes = set()
    for k, arm in enumerate(ORDER, 1):
        r = json.loads(step(f"run {k}/{len(ORDER)} {arm}", tool("engine-bridge") + [
            "run", "--rig", rigs[arm], "--plan", "latest", "--prompt-seed", "11", *run_args], w))
        runs[arm].append(r)
        hashes.add(r["output_sha256"])
    return {"copies": copies, "partial": partial, "sized": sized, "plans": plans, "runs": runs, "hashes": hashes}


def report(args, drives, res: dict, seconds: float, out: str) -> None:
    copies, plans, runs = res["copies"], res["plans"], res["runs"]
    model_bytes = copies["F"][2]
    print(f"model {model_bytes / 1e6:.0f} MB colibri-format ({args.layers} layers x {args.experts} experts, "
          f"{args.layers} shards); drives " + ", ".join(f"{n} {v:g} MB/s" for n, v in drives.items())
          + f"; prompt {args.prompt_tokens}, gen {args.gen_tokens}, cache {args.cache_experts} experts; "
          f"order {' '.join(ORDER)}; {seconds:.0f}s in all")
    for arm in BUDGETS:
        p = res["partial"][arm]
        print(f"sync --partial {BUDGETS[arm]}: {len(p['holds'])} shards, {p['bytes'] / 1e6:.0f} MB, held-out miss "
              f"coverage {100 * p['coverage_held']:.1f} % ({p['history']})")
    s = res["sized"]
    print(f"sized by bandwidth share: share {100 * (s['share'] or 0):.1f} %, {len(s['holds'])} shards, "
          f"{s['bytes'] / 1e6:.0f} MB ({100 * s['bytes'] / model_bytes:.0f} % of the model), held-out coverage "
          f"{100 * s['coverage_held']:.1f} %, stopped: {s['stop']}; sync's own prediction +"
          f"{100 * (s['gain'] or 0):.1f} % (full +{100 * (s['gain_full'] or 0):.1f} %)")

    def med(arm, key):
        return statistics.median(r[key] for r in runs[arm])

    def pred(arm, ph):
        return plans[arm][ph]["predicted"]["seconds"]

    print(f"{'arm':5} {'copied':>8} {'weights':>8} {'prefill tok/s':>13} {'gain':>7} {'pred':>7} {'steady tok/s':>12} "
          f"{'gain':>7} {'pred':>7} {'gain/GB':>13} {'runs':>5}")
    for arm in ARMS:
        gb = (copies[arm][2] if arm in copies else 0) / 1e9
        gp = med(arm, "prefill_tps") / med("U", "prefill_tps") - 1
        gd = med(arm, "gen_steady_tps") / med("U", "gen_steady_tps") - 1
        pp = pred("U", "prefill") / pred(arm, "prefill") - 1
        pd = pred("U", "decode") / pred(arm, "decode") - 1
        per = f"{100 * gp / gb:+.0f}/{100 * gd / gb:+.0f} %" if gb else "-"
        w = ":".join(map(str, plans[arm]["prefill"]["weights"]))
        print(f"{arm:5} {gb:7.3f}G {w:>8} {med(arm, 'prefill_tps'):13.2f} {100 * gp:+6.1f}% {100 * pp:+6.1f}% "
              f"{med(arm, 'gen_steady_tps'):12.2f} {100 * gd:+6.1f}% {100 * pd:+6.1f}% {per:>13} {len(runs[arm]):>5}")
    print("per run (arm prefill steady bytes per source):")
    for arm in ARMS:
        for r in runs[arm]:
            print(f"  {arm:4} {r['prefill_tps']:.2f} {r['gen_steady_tps']:.2f} "
                  + " ".join(f"[{s['index']}] {s['bytes'] / 1e6:.0f}MB" for s in r["sources"]))
    print(f"output hashes across all runs: {len(res['hashes'])} distinct ({', '.join(h[:12] for h in res['hashes'])})")
    print(f"gain/GB: prefill/decode gain in % per GB copied; pred: the planner's predicted gain (its priced seconds "
          f"of the primary alone over the arm's); rigs and plans in {out}")


if __name__ == "__main__":
    raise SystemExit(main())
