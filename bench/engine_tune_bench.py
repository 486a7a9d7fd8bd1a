"""The real-engine tuner (`engine-bridge autotune --binary`) on throttled drives: a generated model
with two replicas, the planner's candidates (its best few, each mode — colibri's stripes on and
off —, capability-proportional, equal), the engine's default (colibri: its startup probe, no
weights; ds4-argodrive: the primary alone) and the fastest drive alone, run by the engine itself in
ABBA order within the budget and judged by its own counters and timing; the report's lines.

    COLIBRI_BIN=/path/to/colibri python -m bench.engine_tune_bench --engine colibri
    python -m bench.engine_tune_bench --engine colibri-v41        # colibri's DeepSeek V4.1 engine's stand-in
    python -m bench.engine_tune_bench --engine ds4-argodrive      # ds4-argodrive's stand-in

colibri: the real binary named by COLIBRI_BIN (its GLM engine, built from colibri's source: see
docs/engine.md) on an `engine-bridge synth --format colibri` model, in its oracle mode (REF=: fixed
prompt ids, greedy), its expert cache 2 per layer (CAP_RAISE=0: colibri would raise it).
colibri-v41 and ds4-argodrive: their stand-ins (`engine-bridge standin`: the embedded engine behind
the engine's interface); no real binary of either runs here. MB = 10**6 bytes.

RAM: each engine's steps after its model is written run under the testbed's RAM budget (`--ram`,
default per engine in RAM below): the reference rig's share of the model's bytes (128 GB for
518 GB) for the page cache, plus what the tuner and the engine hold of their own at the defaults.
`--ram SPEC` gives one budget to every engine; `--ram none` runs without a budget.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

from bench.colibri_launch_bench import require_colibri_bin
from bench.testbed import PACINGS, REPO, THROTTLE, Testbed, available, usage_exit

NAMES = ("internal", "green", "white")
KINDS = ("colibri", "colibri-v41", "ds4-argodrive")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
GEN = 6
CACHE_PER_LAYER = 2
COLIBRI_SYNTH = ("--format", "colibri", "--layers", "4", "--experts", "16", "--top-k", "4", "--shards", "1")
GGUF_SYNTH = ("--layers", "4", "--experts", "16", "--top-k", "4", "--dim", "1024", "--ff", "2048")
# The page cache's share at the reference ratio + the processes' own memory at their peak (autotune and the engine),
# measured at the defaults: colibri's peak resident 117 MB (2 experts per layer cached); ds4-argodrive's stand-in (the
# embedded engine, 16 experts dequantized) and autotune together 939 MiB; colibri-v41's stand-in and autotune 503 MiB.
RAM = {"colibri": "ref+256M", "colibri-v41": "ref+576M", "ds4-argodrive": "ref+1G"}


def run(title: str, module: str, *args: str, wrap=(), env=None, capture=False) -> subprocess.CompletedProcess:
    """A command of this checkout (python -m MODULE ...), its I/O under the testbed's throttles."""
    print(f"== {title}\n$ {module} {' '.join(args)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    e = dict(env or os.environ)
    e["PYTHONPATH"] = REPO + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    p = subprocess.run([*wrap, sys.executable, "-m", module, *args], env=e, cwd=REPO, text=True,
                       stdout=subprocess.PIPE if capture else None)
    print(f"   ({time.perf_counter() - t0:.1f}s, exit {p.returncode})", file=sys.stderr, flush=True)
    if p.returncode != 0 and not capture:
        raise SystemExit(f"engine_tune_bench: step '{title}' failed with exit {p.returncode}")
    return p


def one(tb, kind: str, limits: dict, budget: float, out: str, ram: str | None = None) -> list[str]:
    """One engine's loop on the testbed's drives, under the RAM budget `ram` (default: the
    engine's in RAM); its model and replicas are removed afterwards."""
    drives = tb.mounts()
    out = os.path.join(out, kind)
    os.makedirs(out)
    try:
        return _one(tb, drives, kind, limits, budget, out, ram or RAM[kind])
    finally:
        for d in drives.values():
            for n in os.listdir(d):
                if n.startswith("model"):
                    p = os.path.join(d, n)
                    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)


def _one(tb, drives, kind: str, limits: dict, budget: float, out: str, ram: str) -> list[str]:
    wrap = tb.wrap
    rig = os.path.join(out, "rig")
    gguf = kind == "ds4-argodrive"
    model = os.path.join(drives["internal"], "model.gguf" if gguf else "model")
    synth = GGUF_SYNTH if gguf else COLIBRI_SYNTH + (("--model-type", "deepseek_v41") if kind == "colibri-v41" else ())
    run("the model", "engine_bridge.cli", "synth", model, *synth, wrap=wrap)
    ram_line = tb.set_ram_for([model], ram)
    run("a rig", "replicas.cli", "init", "--rig", rig, "--model", model, "--name", "internal")
    run("two replicas", "replicas.cli", "sync", "--rig", rig, model, drives["green"], drives["white"], "--piece-size",
        "16M", "--quiet", wrap=wrap, capture=True)
    run("drive ceilings", "iobench.cli", "run", "--rig", rig, "--preset", "seq,prefill,decode", "--lanes", "1,2,4",
        "--seconds", "0.3", "--repeat", "2", "--quiet", wrap=wrap, capture=True)
    env = {**os.environ, "CAP_RAISE": "0"}
    if kind == "colibri":
        binary = os.environ["COLIBRI_BIN"]
        ref = os.path.join(out, "ref.json")
        json.dump({"prompt_ids": PROMPT, "full_ids": PROMPT + [0] * GEN}, open(ref, "w"))
        env["REF"] = ref
        engine_args = [str(CACHE_PER_LAYER)]
        cache = ["--cache-experts", str(CACHE_PER_LAYER * 4), "--prompt-tokens", str(len(PROMPT))]
    else:
        binary = os.path.join(out, "standin")
        run("the stand-in", "engine_bridge.cli", "standin", binary, "--engine",
            "ds4-argodrive" if gguf else "colibri", capture=True)
        if gguf:
            engine_args = ["--prompt-tokens", str(len(PROMPT)), "--gen-tokens", str(GEN)]
            cache = ["--cache-experts", "16", "--prompt-tokens", str(len(PROMPT))]
        else:
            ref = os.path.join(out, "ref.json")
            json.dump({"prompt_ids": PROMPT, "output_ids": [0] * GEN}, open(ref, "w"))
            # V4.1's reference mode fails on a mismatch: its own output alone is the reference
            p = subprocess.run([binary, str(CACHE_PER_LAYER), ref], env={**env, "SNAP": model}, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            json.dump({"prompt_ids": PROMPT, "output_ids": [int(x) for x in p.stdout.split()]}, open(ref, "w"))
            engine_args = [str(CACHE_PER_LAYER), ref]
            cache = ["--cache-experts", str(CACHE_PER_LAYER * 4), "--prompt-tokens", str(len(PROMPT))]
    p = run("the engine's own trials", "engine_bridge.cli", "autotune", "--rig", rig, "--binary", binary,
            "--budget", f"{budget:g}", "--top", "1", *cache, "--json", "--", *engine_args, wrap=wrap, env=env, capture=True)
    if p.returncode != 0:
        raise SystemExit(f"engine_tune_bench: autotune --binary failed with exit {p.returncode}")
    doc = json.loads(p.stdout)
    head = (f"{kind}: drives {' : '.join(f'{v:g}' for v in limits.values())} MB/s; prompt {len(PROMPT)} tokens, {GEN} "
            f"generated; budget {budget:g} s; binary {doc['binary']}")
    from engine_bridge.tuning.judge import report_lines

    engine = "ds4-argodrive" if gguf else "colibri"
    # the next solve, under the testbed's RAM budget as the tuner's own was: its page cache's room
    run("the plan with the engine's calibration", "planner.cli", "solve", "--rig", rig, "--engine", engine,
        "--prompt-tokens", str(len(PROMPT)), "--page-cache", "auto", "--quiet", *cache[:2],
        *(f"--engine-arg={x}" for x in engine_args), wrap=wrap, env=env, capture=True)
    return [head, ram_line] + report_lines(doc) + repriced(rig, engine, doc, engine_args,
                                                           int(cache[cache.index("--cache-experts") + 1]), env)


def repriced(rig: str, engine: str, doc: dict, engine_args, cache_experts: int, env) -> list[str]:
    """Each arm priced again as the next solve prices it: with the calibration the tuner recorded
    from the engine's own lines (its winner's runs) and the page cache's room that solve found
    under the testbed's RAM budget (this process runs outside it), beside what the arm measured."""
    from core.rig import load_rig
    from engine_bridge.tuning.judge import EngineArm, predicted_tok_s
    from planner.plans import latest_plan_path, load_inputs, load_plan
    from planner.rigmodel import arm_predictions, arms_compute, world_problem

    room = int(((load_plan(latest_plan_path(load_rig(rig))).provenance or {}).get("world") or {}).get("page_cache_bytes")
               or 0)
    inputs = load_inputs(rig)
    _, problem, world = world_problem(rig, inputs, engine, prompt_tokens=len(PROMPT), cache_experts=cache_experts,
                                      page_cache_bytes=room, engine_args=tuple(engine_args), env=env)
    cal = world.calibration
    if not cal:
        return ["re-priced with the engine's calibration: none recorded (its lines gave none)"]
    hits = cal.get("buffered_run") or (cal if cal.get("buffered") else {})
    lines = [f"re-priced with the engine's calibration ({cal.get('runs', '?')} runs: {cal.get('tokens')} "
             f"tokens, {cal.get('bytes_read', 0) / 1e6:.1f} MB of experts read, compute "
             f"{'%.3f s/token' % (cal['compute_s'] / cal['tokens']) if cal.get('compute_s') else 'not given'}; "
             f"page cache room {room / 1e6:.0f} MB under the budget"
             + (f", the drives served {hits['storage_bytes'] / hits['bytes_read']:.2f} of what {hits.get('runs')} buffered "
                f"run(s) fetched" if hits.get("storage_bytes") and hits.get("bytes_read") else "") + ")",
             f"{'arm':<28} {'measured':>8} {'reads':>7} {'err':>8} {'e2e':>7} {'err':>8}"
             + (f" {'e2e*':>7} {'err':>8}" if cal.get("arms") else "")]
    if world.compute_from:
        lines.insert(1, f"compute: {world.compute_from}")

    def predicted(a: dict, compute: dict) -> EngineArm:
        return EngineArm(a["label"], tuple(a["roles"]), tuple(a["weights"]), None, tuple(a["mode"]), tuple(a["sources"]),
                         arm_predictions(replace(problem, compute=compute), a["sources"], a["weights"],
                                         a["decode_weights"], a["mode"]))

    def cell(p: float | None, med: float) -> str:
        return f"{p:>7.3f} {100 * (p / med - 1):>+7.1f}%" if p else f"{'-':>7} {'-':>8}"

    for a in doc["arms"]:
        if not a.get("weights") or not a.get("median_tok_s"):
            continue              # the engine's own default (no weights of ours), or an arm that never ran
        med = a["median_tok_s"]
        arm = predicted(a, problem.compute)
        reads, both = (predicted_tok_s(arm, "run", len(PROMPT), GEN, e2e=e) for e in (False, True))
        line = f"{a['label']:<28} {med:>8.3f} {cell(reads, med)} {cell(both, med)}"
        if cal.get("arms"):
            # the compute inferred from the other arms alone: this arm's prediction out of sample
            others, _ = arms_compute(problem, cal,
                                     [x for x in cal["arms"] if x.get("label") != a["label"]], least=1)
            out = predicted_tok_s(predicted(a, others), "run", len(PROMPT), GEN, e2e=True) if others else None
            line += f" {cell(out, med)}"
        lines.append(line)
    if cal.get("arms"):
        lines.append("e2e*: with the compute inferred from the other arms alone (each arm out of sample)")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="colibri", help="colibri, colibri-v41 or ds4-argodrive; several comma-separated "
                                                        "run one after another on one testbed")
    ap.add_argument("--limits", default="60,30,30", help="Read ceilings MB/s of internal, green, white.")
    ap.add_argument("--budget", type=float, default=280.0, help="Seconds for the engine's trials (at most 300).")
    ap.add_argument("--standin-budget", type=float, default=150.0, help="Seconds for a stand-in's trials.")
    ap.add_argument("--out", default=None, help="Working folder (default: a temporary one, removed).")
    ap.add_argument("--ram", default=None, help="The testbed's RAM budget for every engine, as `iobench testbed up "
                                                "--ram` takes it (default: each engine's in RAM; none: no budget).")
    ap.add_argument("--pacing", default=THROTTLE, choices=PACINGS,
                    help="How the drives keep their ceilings (iobench testbed up --pacing): throttle (blk-throttle, "
                         "which banks credit while a drive idles) or service (each request served in bytes / rate).")
    a = ap.parse_args()
    kinds = a.engine.split(",")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        usage_exit(f"--engine {bad[0]}: use {', '.join(KINDS)}")
    if "colibri" in kinds:
        require_colibri_bin()
    ok, why = available(a.pacing)
    if not ok:
        usage_exit(f"no testbed here: {why}")
    limits = dict(zip(NAMES, (float(x) for x in a.limits.split(","))))
    with tempfile.TemporaryDirectory(prefix="engine-tune-", dir=a.out) as out, \
            Testbed(limits, size="1G", pacing=a.pacing) as tb:
        for k in kinds:
            print("\n".join(one(tb, k, limits, a.budget if k == "colibri" else a.standin_budget, out, a.ram)), flush=True)


if __name__ == "__main__":
    main()
