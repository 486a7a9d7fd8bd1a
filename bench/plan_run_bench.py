"""A plan for the rig's own model, run on throttled drives: does the run read what the plan says?

Issue 11 (must show): on three throttled drives (bench/testbed.py; default 30:15:15 MB/s), a
synthesised model whose expert component is NOT a whole number of 256 KiB blocks (synth's
default shape, dim 512 x ff 1024 q8_0: 557,056 B = 2 blocks + 32 KiB) is named in a rig, synced
to the other two drives (`replicas sync`), measured (`iobench run`) and planned (`planner solve`:
the planner reads the rig's model from its header, planner/workload.py and planner/rigmodel.py),
then run through the embedded engine with that plan (`engine-bridge run --plan latest
--no-hedge`: ds4 does not hedge, so every piece is read by the source the split gave it). Prints

- the plan's decode pieces per source (bytes per read: the prediction's bytes over pieces per
  layer, `planner.solve.prediction`) and that they add up to the model's component;
- the run's decode bytes per read per source (its decode bytes / its decode pieces) beside the
  plan's pieces: each must match exactly (a source the plan gives 0 B must read nothing);
- the run's prefill bytes per source as shares of the phase beside the plan's prefill shares
  (the engine's prefill reads are staged runs of experts of many sizes, so shares, not bytes per
  read);
- the run's idle sources (engine_bridge/moe/idle.py), if any.

Exit 0 when the decode pieces add up and match, 1 when not, 2 where there is no testbed. Small
settings (8 layers x 16 experts, ~230 MB: iobench's prefill preset at 4 lanes needs ~200 MB;
0.3 s trials; 32+12 tokens) keep it to a few minutes. It takes the testbed lock and always takes
the testbed down (also on SIGINT, SIGTERM and SIGHUP). `--folders` runs the same flow on three
folders of this disk without throttles (no root needed; it checks the flow, not the drives).
Run it as root:

  .venv/bin/python bench/plan_run_bench.py [--drive internal:30 --drive green:15 --drive white:15]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.testbed import Testbed, folder_drives, parse_drives, require_testbed, step, tool, usage_exit  # noqa: E402,E501


def newest_plan(rig: str) -> dict:
    plans = os.path.join(rig, "plans")
    with open(os.path.join(plans, sorted(f for f in os.listdir(plans) if f.endswith(".json"))[-1])) as f:
        return json.load(f)


def shares(values) -> list[float]:
    total = sum(values)
    return [v / total if total else 0.0 for v in values]


def plan_pieces(plan: dict) -> list[float]:
    """Bytes per piece the plan predicts each source reads in decode: its bytes over its pieces per
    layer (the prediction's per-source figures; a decode read is one component, cut the same way
    every time, so this is the piece of one read), 0 for a source given nothing."""
    return [s["bytes"] / s["pieces"] if s["pieces"] else 0.0 for s in plan["decode"]["predicted"]["sources"]]


def report(plan: dict, run: dict, component: int) -> tuple[list[str], bool]:
    """The benchmark's lines and whether the decode pieces add up and match the run exactly."""
    lines = []
    names = [s["name"] for s in plan["sources"]]
    pieces = [round(x) for x in plan_pieces(plan)]
    exact = all(abs(x - round(x)) < 1e-6 * max(1.0, x) for x in plan_pieces(plan))
    adds = exact and sum(pieces) == component
    read = plan["decode"]["predicted"]["read_bytes"]
    lines.append(f"plan decode weights {':'.join(map(str, plan['decode']['weights']))}, reads of "
                 f"{read:,.0f} B: pieces " + " + ".join(f"{n} {b:,}" for n, b in zip(names, pieces))
                 + f" = {sum(pieces):,} B; the model's component is {component:,} B: "
                 + ("adds up" if adds else "DOES NOT ADD UP"))
    ok = adds and round(read) == component
    lines.append(f"{'source':10} {'plan B/read':>12} {'run B/read':>12} {'run pieces':>10} {'run bytes':>13}  match")
    for i, s in enumerate(run["decode"]["sources"]):
        per = s["bytes"] / s["reads"] if s["reads"] else 0
        match = (s["reads"] == 0 and pieces[i] == 0) or (s["reads"] > 0 and s["bytes"] == s["reads"] * pieces[i])
        ok = ok and match
        lines.append(f"{names[i]:10} {pieces[i]:>12,} {per:>12,.0f} {s['reads']:>10} {s['bytes']:>13,}  "
                     f"{'yes' if match else 'NO'}")
    lines.append(f"decode: {run['decode']['reads']} reads of at most {run['decode']['largest_read']:,} B, "
                 f"{run['decode']['bytes']:,} B")
    pre_plan = shares([s["bytes"] for s in plan["prefill"]["predicted"]["sources"]])
    pre_run = shares([s["bytes"] for s in run["prefill"]["sources"]])
    lines.append(f"prefill weights {':'.join(map(str, plan['prefill']['weights']))}: shares of the phase's bytes, "
                 f"plan (the engine's staged reads, {plan['prefill']['predicted']['read_bytes']:,.0f} B on average) vs run "
                 f"({run['prefill']['reads']} reads, largest {run['prefill']['largest_read']:,} B)")
    for i, n in enumerate(names):
        lines.append(f"  {n:10} plan {pre_plan[i]:6.1%}  run {pre_run[i]:6.1%}  "
                     f"({run['prefill']['sources'][i]['bytes']:,} B in {run['prefill']['sources'][i]['reads']} pieces)")
    for e in run.get("idle") or []:
        lines.append(f"idle ({e['kind']}): {e['message']}")
    if not run.get("idle"):
        lines.append("idle: none (every source read in both phases)")
    lines.append(f"output_sha256 {run['output_sha256'][:16]}, prefill {run['prefill_tps']} tok/s, steady decode "
                 f"{run['gen_steady_tps']} tok/s, reader events {len(run['events'])}")
    return lines, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drive", action="append", default=[], metavar="NAME:MBPS",
                    help="drive and its read ceiling in MB/s, primary first (default internal:30 green:15 white:15)")
    ap.add_argument("--size", default="1G", help="size of each drive")
    ap.add_argument("--layers", type=int, default=8, help="8 x 16 experts: ~220 MB, enough for 4 prefill lanes")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--dim", type=int, default=512, help="with --ff 1024 (q8_0): 557,056 B components")
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=12)
    ap.add_argument("--cache-experts", type=int, default=16)
    ap.add_argument("--out", default=None, help="working folder (default: a new folder in /var/tmp)")
    ap.add_argument("--folders", action="store_true",
                    help="three folders on this disk, no throttles (checks the flow where there is no testbed)")
    args = ap.parse_args()

    drives = parse_drives(args.drive or ["internal:30", "green:15", "white:15"], three="primary first")
    if sum(drives.values()) > 450:
        usage_exit("keep the sum of read ceilings at or below 450 MB/s (the backing disk is shared)")
    if not args.folders:
        require_testbed()
    out = args.out or tempfile.mkdtemp(prefix="plan-run-bench-", dir="/var/tmp")
    rig = os.path.join(out, "rig")
    names = list(drives)
    t0 = time.perf_counter()
    if args.folders:
        mounts = folder_drives(out, names)
        synth, component, plan, run = flow(args, rig, names, mounts, [], ["--allow-same-device"])
    else:
        with Testbed(drives, size=args.size) as tb:
            synth, component, plan, run = flow(args, rig, names, tb.mounts(), tb.wrap, [])
    print(f"model {synth['bytes'] / 1e6:.0f} MB: {args.layers} layers x {args.experts} experts, component "
          f"{component:,} B = {component // 262_144} blocks + {component % 262_144:,} B; "
          + ("FOLDERS ON ONE DISK (no throttles)" if args.folders else
             "drives " + ", ".join(f"{n} {v:g} MB/s" for n, v in drives.items()))
          + f"; {time.perf_counter() - t0:.0f}s in all")
    lines, ok = report(plan, run, component)
    print("\n".join(lines))
    print(f"rig and plan in {rig}")
    return 0 if ok else 1


def flow(args, rig: str, names: list[str], mounts: dict[str, str], w: list[str], allow: list[str]):
    """synth, rig, sync, iobench, solve, run: (synth summary, component bytes, plan, run result)."""
    model = os.path.join(mounts[names[0]], "model.gguf")
    synth = json.loads(step("synth", tool("engine-bridge") + [
        "synth", model, "--layers", str(args.layers), "--experts", str(args.experts), "--top-k", "2",
        "--dim", str(args.dim), "--ff", str(args.ff), "--quant", "q8_0", "--seed", "7", "--json"], w))
    component = synth["component_bytes"]
    step("replicas init", tool("replicas") + ["init", "--rig", rig, "--model", model, "--name", names[0]], [])
    step("replicas sync", tool("replicas") + ["sync", "--rig", rig, model, mounts[names[1]], mounts[names[2]],
                                              "--piece-size", "16M", "-q", *allow], w)
    step("iobench run", tool("iobench") + ["run", "--rig", rig, "--preset", "prefill,decode", "--lanes", "1,2,4",
                                           "--seconds", "0.3", "--repeat", "2"], w)
    step("planner solve", tool("planner") + ["solve", "--rig", rig], [])
    plan = newest_plan(rig)
    run = json.loads(step("engine-bridge run --plan", tool("engine-bridge") + [
        "run", "--rig", rig, "--plan", "latest", "--no-hedge", "--no-reweigh", "--no-balance",
        "--prompt-tokens", str(args.prompt_tokens),
        "--gen-tokens", str(args.gen_tokens), "--cache-experts", str(args.cache_experts), "--json"], w))
    return synth, component, plan, run


if __name__ == "__main__":
    raise SystemExit(main())
