"""An engine's read pattern, executed and measured: the ladder of a plan on throttled drives, and
each arm's bytes per drive beside what the engine's pattern gives for the experts the run loaded.

    python -m bench.pattern_bench [--engine colibri] [--limits 60,30,30] [--runs 1] [--out DIR]

On three throttled drives (`iobench testbed`), for the engine's model format (colibri: a generated
safetensors directory, `engine-bridge synth --format colibri`; ds4-argodrive: a GGUF file):
replicas sync, iobench, `planner solve --engine E`, then `engine-bridge ladder` on that plan
(1, 2, 3 drives bracketed by the one-drive control, hedging off so no piece moves). The routing and
the cache are deterministic, so every arm loads the same experts in the same steps: one run's
routing trace, walked through the engine's pattern at each arm's weights (no reads), gives the
bytes each drive must read. The report prints per arm and phase the bytes read and expected (they
must be equal to the byte), the shares beside the plan's predicted shares, tok/s and gain over one
drive, and whether the output hash is identical on every arm. MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

from bench.testbed import Testbed, available, usage_exit

BIN = os.path.dirname(sys.executable)
NAMES = ("internal", "green", "white")
PROMPT, GEN, CACHE = 64, 8, 8
MODELS = {
    # 4 layers x 16 experts, top-4, 4.5 MiB expert reads (striped by colibri's GLM engine with DIRECT=1)
    "colibri": ("model", ("--format", "colibri", "--layers", "4", "--experts", "16", "--top-k", "4", "--shards", "1")),
    # 2 layers x 32 experts, top-2, 1,114,112 B components: each ds4 read splits over three drives
    "ds4-argodrive": ("model.gguf", ("--layers", "2", "--experts", "32", "--top-k", "2", "--dim", "1024", "--ff", "1024")),
}


def step(title: str, *cmd: str, wrap: list[str] | None = None, capture: bool = False) -> subprocess.CompletedProcess:
    exe = os.path.join(BIN, cmd[0]) if os.path.exists(os.path.join(BIN, cmd[0])) else cmd[0]
    print(f"== {title}\n$ {shlex.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    p = subprocess.run([*(wrap or []), exe, *cmd[1:]], stdout=subprocess.PIPE if capture else None, text=True)
    print(f"   ({time.perf_counter() - t0:.1f}s, exit {p.returncode})", file=sys.stderr, flush=True)
    if p.returncode != 0:
        raise SystemExit(f"pattern_bench: step '{title}' failed with exit {p.returncode}")
    return p


def expected(model: str, trace: str, engine: str, weights, switches) -> dict:
    """Per phase, the bytes each source reads when `engine` performs the traced steps at `weights`."""
    from engine_bridge.moe.replay import load_trace, pattern_bytes, trace_steps
    from engine_bridge.moe.inputs import SourceSet
    from models.tensortable import inspect_model

    g = inspect_model(model)
    s = SourceSet((model,) * len(weights), tuple(weights), tuple(weights), engine=engine, switches=tuple(switches))
    return pattern_bytes(g, trace_steps(load_trace(trace), trace), CACHE, s.step_reads(g), s.in_flight())


def report(engine: str, model: str, trace: str, plan: dict, ladder: str, limits: dict) -> list[str]:
    doc = json.load(open(os.path.join(ladder, "results.json")))
    lines = [f"engine {engine}: plan {':'.join(map(str, plan['prefill']['weights']))} / "
             f"{':'.join(map(str, plan['decode']['weights']))}"
             + "".join(f", {k} on" for k in ("direct", "stripe") if plan.get(k))
             + f"; drives {' : '.join(f'{v:g}' for v in limits.values())} MB/s"]
    exact = True
    lines.append(f"{'arm':8} {'phase':7} {'bytes read per drive':>34} {'pattern gives':>34} {'equal':>5} "
                 f"{'shares read':>18} {'plan predicts':>18}")
    for r in doc["rows"]:
        arm_file = os.path.join(ladder, "arms", f"{r['seq']:02d}-{r['arm']}.json")
        if not os.path.isfile(arm_file):
            lines.append(f"{r['arm']}: no result ({r.get('error')})")
            exact = False
            continue
        res = json.load(open(arm_file))
        w = res["weights"]
        want = expected(model, trace, engine, w["prefill"], res.get("switches", ()))
        for ph in ("prefill", "decode"):
            got = [s["bytes"] for s in res[ph]["sources"]]
            same = got == want[ph]
            exact &= same
            tot = sum(got) or 1
            pred = ""
            if len(got) == len(plan["sources"]):
                ps = [s.get("share", 0.0) for s in plan[ph]["predicted"].get("sources", [])]
                pred = "/".join(f"{x:.2f}" for x in ps)
            lines.append(f"{r['arm']:8} {ph:7} {'/'.join(map(str, got)):>34} {'/'.join(map(str, want[ph])):>34} "
                         f"{'yes' if same else 'NO':>5} {'/'.join(f'{b / tot:.2f}' for b in got):>18} {pred:>18}")
    lines.append(f"{'drives':8} {'prefill tok/s':>13} {'gain':>6} {'ideal':>6} {'steady tok/s':>12} {'gain':>6}")
    caps = list(limits.values())
    for k, arm in enumerate(doc["arms"], start=1):
        m, g = doc["medians"][arm], doc["gains"][arm]
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append(f"{k:<8} {fmt(m['prefill_tps']):>13} {fmt(g['prefill_tps']):>6} {sum(caps[:k]) / caps[0]:>6.2f} "
                     f"{fmt(m['gen_steady_tps']):>12} {fmt(g['gen_steady_tps']):>6}")
    hashes = {r["output_sha256"] for r in doc["rows"] if r["output_sha256"]}
    lines.append(f"bytes per drive equal to the pattern's on every arm and phase: {'yes' if exact else 'NO'}; output hash "
                 f"{'identical on every arm' if len(hashes) == 1 else f'{len(hashes)} DIFFERENT'} "
                 f"({', '.join(h[:16] for h in sorted(hashes))}); arms {' '.join(doc['sequence'])}")
    return lines


def one(engine: str, limits: dict, out: str) -> list[str]:
    fname, synth = MODELS[engine]
    with Testbed(limits, size="1G") as tb:
        drives, wrap = tb.mounts(), tb.wrap
        rig = os.path.join(out, "rig")
        model = os.path.join(drives["internal"], fname)
        step("the model", "engine-bridge", "synth", model, *synth, wrap=wrap)
        step("a rig", "replicas", "init", "--rig", rig, "--model", model, "--name", "internal")
        step("two replicas", "replicas", "sync", "--rig", rig, model, drives["green"], drives["white"], "--piece-size", "16M",
             "--quiet", wrap=wrap)
        step("drive ceilings", "iobench", "run", "--rig", rig, "--preset", "seq,prefill,decode", "--lanes", "1,2,4",
             "--seconds", "0.3", "--repeat", "2", "--quiet", wrap=wrap)
        step("the plan (drives priced cold, as the embedded engine reads)", "planner", "solve", "--rig", rig, "--engine", engine,
             "--page-cache", "0", "--prompt-tokens", str(PROMPT),
             "--cache-experts", str(CACHE), capture=True)
        plans = os.path.join(rig, "plans")
        plan = json.load(open(os.path.join(plans, sorted(os.listdir(plans))[-1])))
        trace = os.path.join(out, "trace.json")
        step("the routing of one run (every arm loads the same experts)", "engine-bridge", "run", "--model", model,
             "--engine", engine, "--prompt-tokens", str(PROMPT), "--gen-tokens", str(GEN), "--cache-experts", str(CACHE),
             "--trace-out", trace, "--json", wrap=wrap, capture=True)
        ladder = os.path.join(out, "ladder")
        step("the ladder", "engine-bridge", "ladder", "--rig", rig, "--plan", "latest", "--prompt-tokens", str(PROMPT),
             "--gen-tokens", str(GEN), "--cache-experts", str(CACHE), "--max-other-cpu", "2", "--run-arg", "--no-hedge",
             "--run-arg", "--no-reweigh",
             "--out", ladder, "--quiet", wrap=wrap, capture=True)
        return report(engine, model, trace, plan, ladder, limits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="colibri", choices=sorted(MODELS))
    ap.add_argument("--limits", default="60,30,30", help="Read ceilings MB/s of internal, green, white.")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", default=None, help="Working folder (default: a temporary one, removed).")
    a = ap.parse_args()
    ok, why = available()
    if not ok:
        usage_exit(f"no testbed here: {why}")
    limits = dict(zip(NAMES, (float(x) for x in a.limits.split(","))))
    for k in range(a.runs):
        with tempfile.TemporaryDirectory(prefix="pattern-bench-", dir=a.out) as out:
            lines = one(a.engine, limits, out)
        print(f"-- run {k + 1} of {a.runs}")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
