"""`make demo`: the whole data flow on a generated model, as a user would type it, on three
throttled drives when the machine allows it.

model file -> replicas (sync, verify) -> iobench (drive ceilings) -> planner (plan) ->
engine_bridge (profile export, embedded-engine run, ladder) -> a closing report.

Where it can (root, loop devices, a block I/O controller: `iobench testbed check`), the three
drives are the project's testbed: loop devices whose reads the kernel caps at the ratio of the
reference rig's drives, 12.9 : 7.08 : 7.08 GB/s, scaled down to 30 : 16.5 : 16.5 MB/s so that the
embedded engine (numpy, q8_0) on a 2-core machine is not what sets the pace. Every step runs
inside the testbed's group, so what iobench measures, what the planner solves and what the
ladder shows are the drives' real differences; the closing report sets the ladder's 2- and
3-drive prefill gains (same output hash on every arm) beside the ideal ratio of the throttles.
Elsewhere the drives are folders on one disk, the report says so and why, and the ladder cannot
show a gain. The testbed holds the testbed lock while it is up and is always taken down, on
success, on failure and on SIGINT, SIGTERM or SIGHUP (exit 130).

RAM: on the testbed every step after the model is written runs under a RAM budget (`--ram`,
default RAM below): the reference rig's 128 GB for its 518 GB model, the same share of this
model's bytes for the page cache, plus what the demo's own processes hold at their peak (the
ladder and one `engine-bridge run`, whose 32 cached experts are dequantized in RAM). So the
page cache keeps about a quarter of the model while the engine runs, as on the reference rig,
instead of all of it; `--ram none` runs without a budget. The header line says which.

    python -m bench.demo [--out demo-out] [--keep] [--folders] [--ram ref+768M|none]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

from bench.testbed import Testbed, available
from engines import ds4_argodrive

BIN = os.path.dirname(sys.executable)
NAMES = ("internal", "green", "white")
SEED_GBS = (12.9, 7.08, 7.08)        # the reference rig's drives (GB/s): the ratio the testbed keeps
PRIMARY_MBS = 30.0                    # the primary's ceiling on the testbed, MB/s; the others in ratio
DRIVE_SIZE = "1G"
MARKER = ".replica-tuner-demo"
RAM = "ref+768M"      # the page cache's share at the reference ratio + the processes' own memory at their peak
# 2 layers x 32 experts, top-2, dim 1024, ff 1024, q8_0: expert components of 1,114,112 B (4.25 split
# blocks, so a 2:1:1-ish split gives every drive a piece of each read), ~220 MB of experts; a 64-token
# prompt routes to nearly all of them, ~7 s at 30 MB/s on one drive against ~1 s of numpy.
MODEL = ("--layers", "2", "--experts", "32", "--top-k", "2", "--dim", "1024", "--ff", "1024", "--quant", "q8_0")


def ceilings() -> dict[str, float]:
    """{drive: read ceiling MB/s}: the seeds' ratio with the primary at PRIMARY_MBS."""
    return {n: round(PRIMARY_MBS * g / SEED_GBS[0], 1) for n, g in zip(NAMES, SEED_GBS)}


def step(title: str, *cmd: str, wrap: list[str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    exe = os.path.join(BIN, cmd[0]) if os.path.exists(os.path.join(BIN, cmd[0])) else cmd[0]
    print(f"\n== {title}\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    p = subprocess.run([*(wrap or []), exe, *cmd[1:]], env={**os.environ, "COLUMNS": os.environ.get("COLUMNS", "120")})
    print(f"   ({time.perf_counter() - t0:.1f}s, exit {p.returncode})", flush=True)
    if check and p.returncode != 0:
        raise SystemExit(f"demo: step '{title}' failed with exit {p.returncode}")
    return p


def newest_plan(rig: str) -> dict:
    plans = os.path.join(rig, "plans")
    with open(os.path.join(plans, sorted(f for f in os.listdir(plans) if f.endswith(".json"))[-1])) as f:
        return json.load(f)


def flow(out: str, drives: dict[str, str], wrap: list[str] | None, same_device: bool, on_model=None) -> str:
    """Every step, from the model to the ladder; returns the ladder's run folder. `on_model` is
    told the model's path once it is written (the testbed's RAM budget is a share of it)."""
    rig = os.path.join(out, "rig")
    model = os.path.join(drives["internal"], "model.gguf")
    ladder_out = os.path.join(out, "ladder")
    allow = ["--allow-same-device"] if same_device else []
    step("a small MoE model laid out like the real one (experts 4 KiB-aligned, expert-major)",
         "engine-bridge", "synth", model, *MODEL, wrap=wrap)
    if on_model:
        on_model([model])
    step("name the model in a rig", "replicas", "init", "--rig", rig, "--model", model, "--name", "internal")
    step("copy it to two drives at once: one read, fanned out, verified, stamped",
         "replicas", "sync", "--rig", rig, model, drives["green"], drives["white"], "--piece-size", "16M", *allow, wrap=wrap)
    step("b3sum's line, from our cold reader", "replicas", "hash", model, wrap=wrap)
    step("prove every member identical (cold re-read)", "replicas", "verify", "--rig", rig, "--full", wrap=wrap)
    step("where everything lives", "replicas", "status", "--rig", rig)
    step("drive ceilings with the engine's read shapes", "iobench", "run", "--rig", rig, "--preset", "seq,prefill,decode",
         "--lanes", "1,2,4", "--seconds", "0.3", "--repeat", "2", wrap=wrap)
    step("solve the prefill and decode weights", "planner", "solve", "--rig", rig)
    weights = ":".join(map(str, newest_plan(rig)["prefill"]["weights"]))
    step("one expert component read (1,114,112 B), split by the plan's prefill weights as the engine would",
         "planner", "split", "--weights", weights, "--length", "1114112")
    step(f"the engine profile for {ds4_argodrive.NAME}", "engine-bridge", "export", "--rig", rig, "--plan", "latest",
         "--format", ds4_argodrive.NAME, "--profile", "demo", "--cache-experts", "32")
    step("the embedded engine, experts streamed through the split reads of the plan",
         "engine-bridge", "run", "--rig", rig, "--model", model, "--plan", "latest",
         "--prompt-tokens", "64", "--gen-tokens", "8", "--cache-experts", "32", wrap=wrap)
    step("the ladder: 1, 2, 3 drives, bracketed by the 1-drive control, same output hash on every arm",
         "engine-bridge", "ladder", "--rig", rig, "--prompt-tokens", "64", "--gen-tokens", "8", "--cache-experts", "32",
         "--max-other-cpu", "2", "--out", ladder_out, wrap=wrap)
    return ladder_out


def report(ladder_out: str, limits: dict[str, float] | None, fallback: str | None) -> list[str]:
    """The closing report: each rung's prefill gain over one drive beside the throttles' ideal."""
    with open(os.path.join(ladder_out, "results.json")) as f:
        doc = json.load(f)
    lines = ["", "== what the demo showed"]
    if limits:
        lines.append(f"drives: the testbed's loop devices, reads capped at "
                     f"{' : '.join(f'{v:g}' for v in limits.values())} MB/s ({', '.join(limits)}), the reference "
                     f"rig's {' : '.join(f'{g:g}' for g in SEED_GBS)} GB/s scaled down")
    else:
        lines.append(f"drives: FOLDERS ON ONE DISK, not a testbed ({fallback}); the ladder cannot show a gain here")
    caps = list(limits.values()) if limits else None
    lines.append(f"{'drives':8} {'prefill tok/s':>13} {'gain':>6} {'ideal':>6} {'of ideal':>8} {'steady tok/s':>12} "
                 f"{'gain':>6}")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for k, arm in enumerate(doc["arms"], start=1):
        m, g = doc["medians"][arm], doc["gains"][arm]
        ideal = sum(caps[:k]) / caps[0] if caps else None
        of = g["prefill_tps"] / ideal if ideal and g["prefill_tps"] is not None else None
        lines.append(f"{k:<8} {fmt(m['prefill_tps']):>13} {fmt(g['prefill_tps']):>6} {fmt(ideal):>6} "
                     f"{'-' if of is None else f'{of:.0%}':>8} {fmt(m['gen_steady_tps']):>12} {fmt(g['gen_steady_tps']):>6}")
    hashes = {r["output_sha256"] for r in doc["rows"] if r["output_sha256"]}
    lines.append(f"output hash: {'identical on every arm' if len(hashes) == 1 else f'{len(hashes)} DIFFERENT'} "
                 f"({', '.join(h[:16] for h in sorted(hashes))}); {len(doc['rows'])} arms in order "
                 f"{' '.join(doc['sequence'])}")
    for r in doc["rows"]:
        if not r["ok"]:     # a failed arm is left out of the medians; say which and why
            why = "; ".join(r["gates"][g]["detail"] for g in r["failed"] if g in r["gates"]) or r["error"]
            lines.append(f"arm {r['seq'] + 1} ({r['arm']}) left out of the medians: {why}")
    lines.append(f"ladder results: {os.path.join(ladder_out, 'summary.md')}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo-out", help="Working folder (created; removed first unless --keep).")
    ap.add_argument("--keep", action="store_true", help="Keep an existing working folder (resume).")
    ap.add_argument("--folders", action="store_true", help="Use folders on this disk even where a testbed could run.")
    ap.add_argument("--ram", default=RAM, help=f"The testbed's RAM budget, as `iobench testbed up --ram` takes it "
                                               f"(default {RAM}; none: no budget).")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    if os.path.exists(out) and not a.keep:
        if not os.path.exists(os.path.join(out, MARKER)):
            raise SystemExit(f"demo: {out} exists and is not a demo folder; choose another --out")
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, MARKER), "w").close()

    ok, why = (False, "--folders was given") if a.folders else available()
    t0 = time.perf_counter()
    if ok:
        limits = ceilings()
        print(f"demo: three throttled drives ({why}): "
              f"{', '.join(f'{n} {v:g} MB/s' for n, v in limits.items())}", flush=True)
        with Testbed(limits, size=DRIVE_SIZE, ram=a.ram) as tb:
            ladder_out = flow(out, tb.mounts(), tb.wrap, same_device=False, on_model=tb.set_ram_for)
        print("\ndemo: the testbed is down (drives unmounted, loop devices detached, group removed)", flush=True)
        lines = report(ladder_out, limits, None)
    else:
        print(f"demo: falling back to three folders on one disk: no testbed here ({why})", flush=True)
        drives = {n: os.path.join(out, "drives", n) for n in NAMES}
        for d in drives.values():
            os.makedirs(d, exist_ok=True)
        lines = report(flow(out, drives, None, same_device=True), None, why)
    lines.append(f"demo: done in {time.perf_counter() - t0:.0f}s; everything is in {out}")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
