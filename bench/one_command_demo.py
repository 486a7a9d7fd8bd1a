"""`engine-bridge tune-rig` on throttled drives, three times: from a bare model to a confirmed
profile, again with nothing changed (everything reused), and after one drive's replica is deleted
(that drive alone copied again and measured again, the rest reused). Prints each run's step lines as
the command printed them, and the three runs' wall times side by side.

    COLIBRI_BIN=/path/to/colibri python -m bench.one_command_demo
    python -m bench.one_command_demo                 # colibri's stand-in (`engine-bridge standin`)

The model is `engine-bridge synth --format colibri` (a GLM-shaped safetensors folder colibri runs),
written on the testbed's `internal` drive; `green` and `white` start empty. The real-engine trials
run colibri (COLIBRI_BIN) in its oracle mode (REF=: fixed prompt ids, greedy), its expert cache 2 per
layer (CAP_RAISE=0), or, without COLIBRI_BIN, colibri's stand-in: the embedded engine behind
colibri's interface. Every command runs inside the testbed (throttled reads, the RAM budget
`--ram`). MB = 10**6 bytes.
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

from bench.testbed import REPO, Testbed, available, usage_exit

NAMES = ("internal", "green", "white")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
GEN = 6
CACHE_PER_LAYER = 2
LAYERS = 4
SYNTH = ("--format", "colibri", "--layers", str(LAYERS), "--experts", "16", "--top-k", "4", "--shards", "1")
# The page cache's share at the reference ratio + what tune-rig (copy, iobench, solver) and the engine hold at their peak.
RAM = "ref+768M"


def module(*args: str, wrap=(), env=None, capture=False) -> subprocess.CompletedProcess:
    """A command of this checkout (python -m MODULE ...), run inside the testbed when `wrap` is given."""
    e = dict(env or os.environ)
    e["PYTHONPATH"] = REPO + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return subprocess.run([*wrap, sys.executable, "-m", *args], env=e, cwd=REPO, text=True,
                          stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)


def tune_rig(title: str, tb, argv: list[str], env: dict) -> tuple[float, dict]:
    """One run of the command: its lines verbatim, its wall time, its --json result."""
    print(f"== {title}\n$ engine-bridge {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    cut = argv.index("--") if "--" in argv else len(argv)      # --json before the engine's arguments
    p = module("engine_bridge.cli", *argv[:cut], "--json", *argv[cut:], wrap=tb.wrap, env=env, capture=True)
    wall = time.perf_counter() - t0
    for line in p.stderr.splitlines():
        print(f"  {line}", flush=True)
    if p.returncode != 0:
        raise SystemExit(f"one_command_demo: '{title}' failed with exit {p.returncode}")
    doc = json.loads(p.stdout)
    print(f"  -> {wall:.1f} s wall, exit {p.returncode}; profile {doc['profile']}", flush=True)
    return wall, doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limits", default="60,30,30", help="Read ceilings MB/s of internal, green, white.")
    ap.add_argument("--budget", type=float, default=150.0, help="Seconds for the engine's trials.")
    ap.add_argument("--out", default=None, help="Working folder (default: a temporary one, removed).")
    ap.add_argument("--ram", default=RAM, help=f"The testbed's RAM budget (default {RAM}; none: no budget).")
    a = ap.parse_args()
    ok, why = available()
    if not ok:
        usage_exit(f"no testbed here: {why}")
    binary_env = os.environ.get("COLIBRI_BIN", "")
    if binary_env and not os.access(binary_env, os.X_OK):
        usage_exit(f"COLIBRI_BIN={binary_env} is not an executable")
    limits = dict(zip(NAMES, (float(x) for x in a.limits.split(","))))
    with tempfile.TemporaryDirectory(prefix="one-command-", dir=a.out) as out, \
            Testbed(limits, size="1G", ram=a.ram) as tb:
        drives = tb.mounts()
        model = os.path.join(drives["internal"], "model")
        try:
            p = module("engine_bridge.cli", "synth", model, *SYNTH, wrap=tb.wrap, capture=True)
            if p.returncode != 0:
                raise SystemExit(f"one_command_demo: synth failed: {p.stderr.strip()}")
            tb.set_ram_for([model])
            if binary_env:
                binary, what = binary_env, f"colibri {binary_env}"
            else:
                binary, what = os.path.join(out, "standin"), "colibri's stand-in (no COLIBRI_BIN)"
                module("engine_bridge.cli", "standin", binary, "--engine", "colibri", capture=True)
            ref = os.path.join(out, "ref.json")
            with open(ref, "w") as f:
                json.dump({"prompt_ids": PROMPT, "full_ids": PROMPT + [0] * GEN}, f)
            env = {**os.environ, "REF": ref, "CAP_RAISE": "0"}
            rig = os.path.join(out, "rig")
            argv = ["tune-rig", "--rig", rig, "--model", model, "--drive", drives["green"], "--drive", drives["white"],
                    "--binary", binary, "--budget", f"{a.budget:g}", "--top", "1",
                    "--cache-experts", str(CACHE_PER_LAYER * LAYERS), "--prompt-tokens", str(len(PROMPT)),
                    "--", str(CACHE_PER_LAYER)]
            print(f"engine: {what}; drives {' : '.join(f'{v:g}' for v in limits.values())} MB/s; model "
                  f"{' '.join(SYNTH)}; budget {a.budget:g} s", flush=True)
            first, d1 = tune_rig("1. a bare model and two empty drives", tb, argv, env)
            second, d2 = tune_rig("2. the same command again (nothing changed)", tb, argv, env)
            gone = os.path.join(drives["white"], "model")
            shutil.rmtree(gone)
            print(f"== white's replica deleted: {gone}", flush=True)
            third, d3 = tune_rig("3. the same command after white's replica was deleted", tb, argv, env)
        finally:
            for d in drives.values():
                for n in os.listdir(d):
                    if n.startswith("model"):
                        q = os.path.join(d, n)
                        shutil.rmtree(q) if os.path.isdir(q) else os.remove(q)
        print("run                         wall s  vs first   steps", flush=True)
        for name, wall, doc in (("1 bare model", first, d1), ("2 nothing changed", second, d2),
                                ("3 white's replica deleted", third, d3)):
            steps = ", ".join(f"{s['step']} {s['action']}" for s in doc["steps"])
            print(f"{name:<27} {wall:>6.1f} {wall / first:>9.3f}   {steps}", flush=True)
        for name, doc in (("1", d1), ("3", d3)):
            t = doc.get("engine_trials") or {}
            print(f"run {name}: engine's winner {t.get('winner')} (confirmed: {t.get('confirmed')}; {t.get('why')})",
                  flush=True)


if __name__ == "__main__":
    main()
