"""Know before you copy: `planner whatif`'s prediction for a drive added (and one removed), beside
what the drives really gave once it was done, on throttled drives (bench/testbed.py).

Issue 22 (must show). Three throttled drives (default internal 30, green 15, white 20 MB/s; every
write capped at 40 MB/s). A synthesised GGUF model (ds4-argodrive's reads) lives on internal and is
synced to green: a rig of two. Then:

1. measured now: iobench on the rig, `planner solve`, the embedded engine run RUNS times with the
   plan (`engine-bridge run --plan latest`; each run's prefill and decode time and its time waiting
   for reads);
2. predicted: `planner whatif --add <white's folder>` (white measured on a scratch file, written,
   read cold, removed: no replica yet; the run's timing for the end-to-end gain), the copy's
   duration at white's measured write speed;
3. done: `replicas sync` to white (timed), iobench on three drives, `planner solve`, RUNS runs:
   the measured gain (median tok/s of three drives / of two) beside the predicted one;
4. removed: `planner whatif --remove green` on the three-drive rig, then `replicas forget green`,
   `planner solve` on the two left (the bench result of step 3), RUNS runs: measured beside predicted.

Prints one line per phase and step: predicted reads gain, predicted end-to-end gain, measured
gain (medians over RUNS runs in one session, the same model and prompt); and the copy's predicted
against its real duration. Exit 0 when it ran, 2 where there is no testbed. `--folders` runs the
flow on folders of this disk without throttles (no root; it checks the flow, not the drives).

  .venv/bin/python bench/whatif_bench.py [--drive internal:30 --drive green:15 --drive white:20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.testbed import Testbed, folder_drives, parse_drives, require_testbed, tool  # noqa: E402

PHASES = (("prefill", "prefill_tps"), ("decode", "gen_tps"))


def step(title: str, cmd: list[str], wrap: list[str]) -> tuple[str, float]:
    """Run one step inside the drives' group: (its stdout, seconds). A failed step stops the benchmark."""
    t0 = time.perf_counter()
    p = subprocess.run([*wrap, *cmd], text=True, capture_output=True, cwd=ROOT)
    dt = time.perf_counter() - t0
    print(f"  {title}: {dt:.1f}s, exit {p.returncode}", file=sys.stderr, flush=True)
    if p.returncode != 0:
        tail = [x for x in p.stderr.splitlines() if x.strip()] or [x for x in p.stdout.splitlines() if x.strip()]
        raise SystemExit(f"whatif_bench: {title} failed (exit {p.returncode}): {tail[-1] if tail else ''}")
    return p.stdout, dt


def runs(args, rig: str, w: list[str], label: str, out: str) -> tuple[dict, str]:
    """RUNS runs of the embedded engine with the rig's newest plan: ({metric: median}, the first run's result file)."""
    results = []
    for i in range(args.runs):
        text, _ = step(f"run {label} {i + 1}/{args.runs}", tool("engine-bridge") + [
            "run", "--rig", rig, "--plan", "latest", "--no-hedge", "--no-balance", "--prompt-tokens", str(args.prompt_tokens),
            "--gen-tokens", str(args.gen_tokens), "--cache-experts", str(args.cache_experts), "--json"], w)
        results.append(json.loads(text))
    path = os.path.join(out, f"run-{label}.json")
    with open(path, "w") as f:
        json.dump(results[0], f)
    med = {m: statistics.median(r[m] for r in results) for _, m in PHASES}
    med["read_share"] = {ph: statistics.median(r[ph]["read_wait_seconds"] / r[ph]["seconds"] for r in results)
                         for ph, _ in PHASES}
    return med, path


def bench(args, rig: str, out: str, names: list[str], mounts: dict[str, str], w: list[str], allow: list[str]) -> list[str]:
    internal, green, white = names
    model = os.path.join(mounts[internal], "model.gguf")
    step("synth", tool("engine-bridge") + ["synth", model, "--layers", str(args.layers), "--experts", str(args.experts),
                                           "--top-k", "2", "--dim", "512", "--ff", "1024", "--quant", "q8_0",
                                           "--seed", "7", "--json"], w)
    step("replicas init", tool("replicas") + ["init", "--rig", rig, "--model", model, "--name", internal], [])
    step(f"replicas sync {green}", tool("replicas") + ["sync", "--rig", rig, model, mounts[green], "--piece-size", "16M",
                                                       "-q", *allow], w)
    iob = ["--preset", "prefill,decode,rand4k", "--lanes", "1,2,4", "--seconds", str(args.seconds), "--repeat", "2"]
    step("iobench run (2 drives)", tool("iobench") + ["run", "--rig", rig, *iob], w)
    step("planner solve (2 drives)", tool("planner") + ["solve", "--rig", rig, "--page-cache", "0"], [])
    two, two_run = runs(args, rig, w, "2drives", out)

    text, _ = step(f"planner whatif --add {white}", tool("planner") + [
        "whatif", "--rig", rig, "--add", mounts[white], "--name", white, "--scratch-size", args.scratch,
        "--preset", "prefill,decode,rand4k", "--scratch-lanes", "1,2,4", "--seconds", str(args.seconds), "--repeat", "2",
        "--timing", two_run, "--page-cache", "0", "--json"], w)
    add = json.loads(text)
    _, sync_s = step(f"replicas sync {white}", tool("replicas") + ["sync", "--rig", rig, model, mounts[white],
                                                                   "--piece-size", "16M", "-q", *allow], w)
    step("iobench run (3 drives)", tool("iobench") + ["run", "--rig", rig, *iob], w)
    step("planner solve (3 drives)", tool("planner") + ["solve", "--rig", rig, "--page-cache", "0"], [])
    three, three_run = runs(args, rig, w, "3drives", out)

    text, _ = step(f"planner whatif --remove {green}", tool("planner") + [
        "whatif", "--rig", rig, "--remove", green, "--timing", three_run, "--page-cache", "0", "--json"], [])
    rem = json.loads(text)
    step(f"replicas forget {green}", tool("replicas") + ["forget", "--rig", rig, green], [])
    step(f"planner solve (without {green})", tool("planner") + ["solve", "--rig", rig, "--page-cache", "0"], [])
    left, _ = runs(args, rig, w, f"without-{green}", out)

    lines = []
    for title, what, base, after in ((f"add {white}", add, two, three), (f"remove {green}", rem, three, left)):
        for p in what["phases"]:
            metric = dict(PHASES)[p["phase"]]
            measured = after[metric] / base[metric] - 1 if base[metric] else 0.0
            e2e = p["end_to_end"]
            lines.append(f"{title:<14} {p['phase']:<7} weights {':'.join(map(str, p['weights_before']))} -> "
                         f"{':'.join(map(str, p['weights_after']))}  predicted reads {p['gain']:+.1%}, end to end "
                         + (f"{e2e:+.1%}" if e2e is not None else "-")
                         + f" (reads {p['read_share']:.0%} of the time)" * (p['read_share'] is not None)
                         + f"  measured {measured:+.1%} ({base[metric]:.2f} -> {after[metric]:.2f} tok/s)")
    if add.get("copy_s"):
        lines.append(f"copy to {white}: predicted {add['copy_s']:.1f}s ({add['copy_bytes']:,} B at "
                     f"{add['write_Bps'] / 1e6:.1f} MB/s measured on the scratch file), sync took {sync_s:.1f}s "
                     f"(its read-back and stamp included)")
    lines.append(f"whatif verdicts: {add['verdict']}; {rem['verdict']}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drive", action="append", default=[], metavar="NAME:MBPS",
                    help="three drives, primary first (default internal:30 green:15 white:20)")
    ap.add_argument("--write-mbs", type=float, default=40, help="every drive's write ceiling, MB/s")
    ap.add_argument("--size", default="1G", help="size of each drive")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=8)
    ap.add_argument("--cache-experts", type=int, default=16)
    ap.add_argument("--runs", type=int, default=2, help="runs of the embedded engine per drive set (medians)")
    ap.add_argument("--seconds", type=float, default=0.3, help="iobench window")
    ap.add_argument("--scratch", default="320M", help="scratch file whatif writes on the drive to add")
    ap.add_argument("--out", default=None, help="working folder (default: a new folder in /var/tmp)")
    ap.add_argument("--folders", action="store_true", help="folders on this disk, no throttles (checks the flow)")
    args = ap.parse_args()
    drives = parse_drives(args.drive or ["internal:30", "green:15", "white:20"], three="primary first")
    if not args.folders:
        require_testbed()
    out = args.out or tempfile.mkdtemp(prefix="whatif-bench-", dir="/var/tmp")
    rig = os.path.join(out, "rig")
    names = list(drives)
    t0 = time.perf_counter()
    if args.folders:
        mounts = folder_drives(out, names)
        lines = bench(args, rig, out, names, mounts, [], ["--allow-same-device"])
    else:
        with Testbed(drives, write_mbs=args.write_mbs, size=args.size) as tb:
            lines = bench(args, rig, out, names, tb.mounts(), tb.wrap, [])
    print(("FOLDERS ON ONE DISK (no throttles)" if args.folders else
           "drives " + ", ".join(f"{n} {v:g} MB/s" for n, v in drives.items()) + f", writes {args.write_mbs:g} MB/s")
          + f"; {args.runs} runs per drive set; {time.perf_counter() - t0:.0f}s in all")
    print("\n".join(lines))
    print(f"rig, runs and plans in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
