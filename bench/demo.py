"""`make demo`: the whole data flow on a generated model, as a user would type it.

model file -> replicas (sync, verify) -> iobench (drive ceilings) -> planner (plan) ->
engine_bridge (profile export, embedded-engine run, ladder). The three "drives" are folders on
this machine's disk (so --allow-same-device); on real drives, or on the throttled testbed
(bench/*_bench.py), the same commands measure real differences between drives.

    python -m bench.demo [--out demo-out] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time

from engines import ds4_argodrive

BIN = os.path.dirname(sys.executable)


def step(title: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = os.path.join(BIN, cmd[0]) if os.path.exists(os.path.join(BIN, cmd[0])) else cmd[0]
    print(f"\n== {title}\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    p = subprocess.run([exe, *cmd[1:]], env={**os.environ, "COLUMNS": os.environ.get("COLUMNS", "120")})
    print(f"   ({time.perf_counter() - t0:.1f}s, exit {p.returncode})", flush=True)
    if check and p.returncode != 0:
        raise SystemExit(f"demo: step '{title}' failed with exit {p.returncode}")
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo-out", help="Working folder (created; removed first unless --keep).")
    ap.add_argument("--keep", action="store_true", help="Keep an existing working folder (resume).")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    if os.path.exists(out) and not a.keep:
        if not os.path.exists(os.path.join(out, ".replica-tuner-demo")):
            raise SystemExit(f"demo: {out} exists and is not a demo folder; choose another --out")
        shutil.rmtree(out)
    drives = {n: os.path.join(out, "drives", n) for n in ("internal", "green", "white")}
    for d in drives.values():
        os.makedirs(d, exist_ok=True)
    open(os.path.join(out, ".replica-tuner-demo"), "w").close()
    rig = os.path.join(out, "rig")
    model = os.path.join(drives["internal"], "model.gguf")

    step("a small MoE model laid out like the real one (experts 4 KiB-aligned, expert-major)",
         "engine-bridge", "synth", model, "--layers", "4", "--experts", "32", "--top-k", "2", "--dim", "512", "--ff", "1024")
    step("name the model in a rig", "replicas", "init", "--rig", rig, "--model", model, "--name", "internal")
    step("copy it to two drives at once: one read, fanned out, verified, stamped",
         "replicas", "sync", "--rig", rig, model, drives["green"], drives["white"], "--piece-size", "16M", "--allow-same-device")
    step("b3sum's line, from our cold reader", "replicas", "hash", model)
    step("prove every member identical (cold re-read)", "replicas", "verify", "--rig", rig, "--full")
    step("where everything lives", "replicas", "status", "--rig", rig)
    step("drive ceilings with the engine's read shapes", "iobench", "run", "--rig", rig, "--preset", "seq,prefill,decode", "--lanes", "1,2,4", "--seconds", "0.3", "--repeat", "2")
    step("solve the prefill and decode weights", "planner", "solve", "--rig", rig)
    step("one component read, split as the engine would", "planner", "split", "--weights", "10:6:6", "--length", "6635520")
    step(f"the engine profile for {ds4_argodrive.NAME}", "engine-bridge", "export", "--rig", rig, "--plan", "latest",
         "--format", ds4_argodrive.NAME, "--profile", "demo", "--cache-experts", "48")
    step("the embedded engine, experts streamed through the split reads of the plan",
         "engine-bridge", "run", "--rig", rig, "--model", model, "--plan", "latest",
         "--prompt-tokens", "128", "--gen-tokens", "32", "--cache-experts", "48")
    step("the ladder: 1, 2, 3 drives, bracketed by the 1-drive control, same output hash on every arm",
         "engine-bridge", "ladder", "--rig", rig, "--prompt-tokens", "64", "--gen-tokens", "16", "--cache-experts", "48",
         "--max-other-cpu", "2")
    print(f"\ndemo: done; everything is in {out} (rig: {rig})")
    print("demo: the three 'drives' here are folders on one disk, so the ladder cannot show a gain; on real drives "
          "(or the throttled testbed: bench/engine_bench.py) the same commands do.")


if __name__ == "__main__":
    main()
