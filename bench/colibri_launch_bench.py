"""The real colibri, run by `engine-bridge launch` on a rig of a generated colibri-format model with
two replicas on throttled drives: the launch confirmed from colibri's own log, token ids identical
with and without mirrors, and the bytes per drive of its `MIRROR:` line beside the shares the plan
predicts.

    COLIBRI_BIN=/path/to/colibri python -m bench.colibri_launch_bench [--limits 60,30,30] [--runs 1]

colibri is not shipped: build its engine binary from colibri's public source (its GLM engine builds
on Linux CPU with `make colibri` in c/; see docs/engine.md) and name it with COLIBRI_BIN. The model
is `engine-bridge synth --format colibri` (a GLM-shaped safetensors directory, int8 experts); the
prompt is fixed and decoding greedy (colibri's oracle mode, REF=), its expert cache 2 per layer
(CAP_RAISE=0: colibri would raise it) so experts keep coming from the drives. Arms: the plan's
profile (mirrors) and the primary alone, page cache dropped before each, in the order A B B A.
Every step after the model is written runs under the testbed's RAM budget (`--ram`, default RAM
below): the reference rig's share of the model's bytes for the page cache (128 GB for 518 GB),
plus what `engine-bridge launch` and colibri hold of their own (measured: colibri's peak resident
117 MB on this model with 2 experts per layer cached). `--ram none` runs without a budget.
MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from bench.pattern_bench import step
from bench.testbed import Testbed, available, drop_caches, usage_exit

NAMES = ("internal", "green", "white")
SYNTH = ("--format", "colibri", "--layers", "4", "--experts", "16", "--top-k", "4", "--shards", "1")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
GEN = 16
CACHE_PER_LAYER = 2
TOKENS = re.compile(r"^GLM C engine\s*:\s*([\d ]+)$", re.M)
RAM = "ref+256M"       # the page cache's share at the reference ratio + the launcher's and colibri's own memory


def launch(tb, rig: str, binary: str, profile: str, out: str, ref: str) -> dict:
    env = {**os.environ, "REF": ref, "PROF": "1", "USAGE_SAVE": "0", "CAP_RAISE": "0"}
    drop_caches()
    p = subprocess.run([*tb.wrap, os.path.join(os.path.dirname(sys.executable), "engine-bridge"), "launch", "--rig", rig,
                        "--binary", binary, "--profile", profile, "--out", out, "--json", "--", str(CACHE_PER_LAYER)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"ok": False, "error": p.stderr.strip()}
    text = "".join(open(os.path.join(out, f), errors="replace").read() for f in sorted(os.listdir(out))
                   if f.endswith((".out", ".err", ".log", ".txt")))
    m = TOKENS.findall(text)
    doc["tokens"] = m[-1].split() if m else None
    doc["mirror_line"] = next((ln for ln in text.splitlines() if ln.startswith("MIRROR:")), "")
    return doc


def one(binary: str, limits: dict, out: str, ram: str = RAM) -> list[str]:
    from engines.colibri import member_for
    from models.tensortable import inspect_model

    with Testbed(limits, size="1G", ram=ram) as tb:
        drives, wrap = tb.mounts(), tb.wrap
        rig, rig1 = os.path.join(out, "rig"), os.path.join(out, "rig1")
        model = os.path.join(drives["internal"], "model")
        ref = os.path.join(out, "ref.json")
        json.dump({"prompt_ids": PROMPT, "full_ids": PROMPT + [0] * GEN}, open(ref, "w"))
        step("the model", "engine-bridge", "synth", model, *SYNTH, wrap=wrap)
        tb.set_ram_for([model])
        step("a rig", "replicas", "init", "--rig", rig, "--model", model, "--name", "internal")
        step("two replicas", "replicas", "sync", "--rig", rig, model, drives["green"], drives["white"], "--piece-size", "16M",
             "--quiet", wrap=wrap, capture=True)
        step("drive ceilings", "iobench", "run", "--rig", rig, "--preset", "seq,prefill,decode", "--lanes", "1,2,4",
             "--seconds", "0.3", "--repeat", "2", "--quiet", wrap=wrap, capture=True)
        g = inspect_model(model)
        cache = CACHE_PER_LAYER * g.layers
        step("the plan (drives priced cold: the page cache dropped before each arm)", "planner", "solve", "--rig", rig,
             "--engine", "colibri", "--page-cache", "0", "--prompt-tokens", str(len(PROMPT)),
             "--cache-experts", str(cache), capture=True)
        plans = os.path.join(rig, "plans")
        plan = json.load(open(os.path.join(plans, sorted(os.listdir(plans))[-1])))
        step("its profile", "engine-bridge", "export", "--rig", rig, "--plan", "latest", "--format", "colibri",
             "--profile", "mirrors", capture=True)
        bench = os.path.join(rig, "bench", sorted(os.listdir(os.path.join(rig, "bench")))[-1])
        step("a rig of the primary alone", "replicas", "init", "--rig", rig1, "--model", model, "--name", "internal")
        step("its plan", "planner", "solve", "--rig", rig1, "--bench", bench, "--engine", "colibri", capture=True)
        step("its profile", "engine-bridge", "export", "--rig", rig1, "--plan", "latest", "--format", "colibri",
             "--profile", "alone", "--allow-unverified", capture=True)
        arms = {"mirrors": (rig, os.path.join(rig, "profiles", "mirrors.json")),
                "alone": (rig1, os.path.join(rig1, "profiles", "alone.json"))}
        runs = []
        for k, name in enumerate(("mirrors", "alone", "alone", "mirrors")):
            r, prof = arms[name]
            runs.append((name, launch(tb, r, binary, prof, os.path.join(out, f"launch-{k}-{name}"), ref)))
    member = member_for(g.arch)
    lines = [f"colibri's {member.name} engine ({member.source}), plan {':'.join(map(str, plan['prefill']['weights']))}"
             + "".join(f", {k} on" for k in ("direct", "stripe") if plan.get(k))
             + f"; drives {' : '.join(f'{v:g}' for v in limits.values())} MB/s; prompt {len(PROMPT)} tokens, {GEN} generated"]
    pred = {ph: [s["share"] for s in plan[ph]["predicted"]["sources"]] for ph in ("prefill", "decode")}
    lines.append(f"plan predicts shares: prefill {'/'.join(f'{x:.2f}' for x in pred['prefill'])}, "
                 f"decode {'/'.join(f'{x:.2f}' for x in pred['decode'])}")
    tokens = set()
    for name, d in runs:
        conf = ", ".join(f"{c['name']} {'ok' if c['ok'] else 'FAILED'}" for c in d.get("confirmations", []))
        lines.append(f"{name:8} launch "
                     f"{'confirmed' if d.get('ok') else 'NOT confirmed ' + str(d.get('failed') or d.get('error'))}"
                     f" ({conf}); tokens {' '.join(d['tokens'] or ['none'])}")
        if d["mirror_line"]:
            served = member.read_stats(d["mirror_line"])
            tot = sum(s.bytes for s in served.values()) or 1
            lines.append(f"         {d['mirror_line']}")
            lines.append(f"         shares served: {'/'.join(f'{served[i].bytes / tot:.2f}' for i in sorted(served))}")
        tokens.add(tuple(d["tokens"] or ()))
    lines.append(f"token ids identical with and without mirrors on every arm: {'yes' if len(tokens) == 1 else 'NO'}")
    return lines


def require_colibri_bin() -> str:
    """COLIBRI_BIN, once it names an executable; else one line, exit 2."""
    binary = os.environ.get("COLIBRI_BIN", "")
    if not binary or not os.access(binary, os.X_OK):
        usage_exit("set COLIBRI_BIN to colibri's engine binary (built from its source: see docs/engine.md)")
    return binary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limits", default="60,30,30", help="Read ceilings MB/s of internal, green, white.")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", default=None, help="Working folder (default: a temporary one, removed).")
    ap.add_argument("--ram", default=RAM, help=f"The testbed's RAM budget, as `iobench testbed up --ram` takes it "
                                               f"(default {RAM}; none: no budget).")
    a = ap.parse_args()
    binary = require_colibri_bin()
    ok, why = available()
    if not ok:
        usage_exit(f"no testbed here: {why}")
    limits = dict(zip(NAMES, (float(x) for x in a.limits.split(","))))
    for k in range(a.runs):
        with tempfile.TemporaryDirectory(prefix="colibri-launch-", dir=a.out) as out:
            lines = one(binary, limits, out, a.ram)
        print(f"-- run {k + 1} of {a.runs}")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
