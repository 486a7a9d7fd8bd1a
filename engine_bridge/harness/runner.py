"""The harness: arms run one by one, each in a fresh process, gated, summarised (docs/harness.md).

`run_bench` runs the sequence of arms with a runner (default: `engine-bridge run --json` in a
fresh Python process, so every arm starts with an empty expert cache), takes a /proc snapshot
right before and after each arm for the swap and load gates, and writes into the run folder:

    results.json   the schema-1 document of harness.arms (rows, medians, gains, pairs)
    summary.md     the same for people
    chart.svg      medians and every arm, per configuration
    runs.csv       the ds4-bench CSV columns, one line per arm, with seq/arm/ok
    plans/NAME.json, arms/NN-NAME.json, arms/NN-NAME.log   what each arm ran and said

The runner is a parameter so the ordering, gating and reporting are tested without processes.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Sequence

from core.constants import RUNS_DIR
from core.errors import Interrupted, MismatchError, MissingError, UsageError
from core.events import Notice, emit
from core.fsutil import atomic_write_text
from core.rig import Rig, load_rig, rig_dir
from core.units import plural
from engines.registry import DEFAULT_ENGINE, engine_for_model, get_engine
from engines.split import check_weights, parse_weights
from models.modelset import member_set
from planner.plan import Phase, Plan, Source, plan_to_dict
from planner.plans import load_plan, resolve_plan_path

from .arms import (
    CSV_COLUMNS,
    MAX_OTHER_CPU,
    ArmSpec,
    Row,
    Snapshot,
    arm_sequence,
    build_results,
    cpu_seconds,
    parse_arm,
    without_passing_arm,
)
from .summary import render_markdown, render_svg

Runner = Callable[[ArmSpec, dict, str, int], tuple[dict, str]]
_WEIGHTS_RE = re.compile(r"^\d+([:,]\d+)*(/\d+([:,]\d+)*)?$")


class ArmFailed(Exception):
    """The arm's process did not produce a result (its message is the reason, one line)."""


# -- arms ---------------------------------------------------------------------------------

def resolve_arm(name: str, ref: str, rig: Rig | None) -> ArmSpec:
    """NAME=PLAN: a plan file (or its name in the rig), or inline weights 'P:P:P[/D:D:D]' over
    the rig's first members (primary, then replicas), as many as there are weights."""
    if _WEIGHTS_RE.match(ref):
        pre_txt, _, dec_txt = ref.partition("/")
        prefill = parse_weights(pre_txt)
        decode = parse_weights(dec_txt) if dec_txt else prefill
        if len(decode) != len(prefill):
            raise UsageError(f"--arm {name}={ref}: {len(prefill)} prefill weights but {len(decode)} decode weights")
        if rig is None or rig.model is None:
            raise UsageError(f"--arm {name}={ref}: inline weights need a rig with a model (--rig DIR); "
                             "or give a plan file")
        members = rig.members
        if len(prefill) > len(members):
            raise UsageError(f"--arm {name}={ref}: {len(prefill)} weights but the rig at {rig.root} has "
                             f"{len(members)} member(s); add replicas with `replicas sync` or give fewer weights")
        return ArmSpec(name, tuple(m.path for m in members[:len(prefill)]), prefill, decode, engine=rig_engine(rig))
    path = resolve_plan_path(ref, rig)
    plan = load_plan(path)
    return ArmSpec(name, tuple(s.path for s in plan.sources), tuple(plan.prefill.weights),
                   tuple(plan.decode.weights), plan=path, engine=plan.engine, switches=plan_switches(plan))


def rig_engine(rig: Rig) -> str:
    """The engine whose reads inline weights perform: the one that reads the rig's model."""
    m = member_set(rig, rig.model)
    return engine_for_model(m.format, m.layout, m.files)


def plan_switches(plan) -> tuple[str, ...]:
    """The engine switches a plan turns on."""
    return tuple(k for k in get_engine(plan.engine).switches if getattr(plan, k, False))


def bench_arms(arms: Sequence[str], rig_option: str | None) -> tuple[list[ArmSpec], Rig]:
    """The arms of `bench` from its --arm NAME=PLAN options, and the rig (which must exist only
    when an arm is not a plan file: a plan name or inline weights are looked up in it)."""
    parsed = [parse_arm(a) for a in arms]
    rig = load_rig(rig_dir(rig_option), must_exist=any(not os.path.isfile(ref) for _, ref in parsed))
    return [resolve_arm(name, ref, rig) for name, ref in parsed], rig


def ladder_arms(rig_option: str | None, plan: str | None = None, weights: str | None = None,
                decode_weights: str | None = None) -> tuple[list[ArmSpec], Rig]:
    """The rungs of `ladder`, and the rig: the sources and weights of `plan` (default: the newest
    in <rig>/plans), or prefill `weights` ('W:W:W') over the rig's members; `decode_weights`
    overrides the plan's decode weights (default with `weights`: the prefill weights)."""
    rig = load_rig(rig_dir(rig_option), must_exist=plan is None)
    if weights:
        if plan:
            raise UsageError("give either --plan or --weights, not both")
        if rig.model is None:
            raise UsageError(f"the rig at {rig.root} has no model; run `replicas init` / `replicas sync` first")
        prefill = parse_weights(weights)
        paths = [m.path for m in rig.members]
        engine, switches = rig_engine(rig), ()
    else:
        spec = resolve_arm("plan", resolve_plan_path(plan or "latest", rig), rig)
        paths, prefill, engine, switches = list(spec.sources), spec.prefill_weights, spec.engine, spec.switches
        if not decode_weights:
            decode_weights = ":".join(map(str, spec.decode_weights))
    decode = parse_weights(decode_weights, engine) if decode_weights else prefill
    return ladder_specs(paths, prefill, decode, plan="" if weights else spec.plan, engine=engine, switches=switches), rig


def ladder_specs(paths: Sequence[str], prefill: Sequence[int], decode: Sequence[int] | None = None,
                 plan: str = "", engine: str = DEFAULT_ENGINE, switches: Sequence[str] = ()) -> list[ArmSpec]:
    """One drive (the primary alone: the control), plus one replica, plus two (docs/harness.md),
    each performing `engine`'s reads with `switches` on. `plan`: the plan file the paths and
    weights came from, recorded on the rung that runs all of its sources."""
    prefill = check_weights(tuple(prefill), engine)
    decode = prefill if decode is None else check_weights(tuple(decode), engine)
    n = min(len(paths), len(prefill))
    if n < 2 or len(decode) < n:
        raise UsageError(f"ladder: needs a primary and at least one replica with a weight each "
                         f"(got {plural(len(paths), 'source')}, weights {':'.join(map(str, prefill))})")
    return [ArmSpec(f"{k}drive" + ("s" if k > 1 else ""), tuple(paths[:k]), prefill[:k], decode[:k],
                    plan=plan if k == len(paths) else "", engine=engine, switches=tuple(switches))
            for k in range(1, n + 1)]


def write_arm_plan(spec: ArmSpec, path: str) -> str:
    """The plan file `run --plan` reads for this arm (sources and both weight vectors). An arm that
    runs its plan's sources keeps the plan's prediction of each phase whose weights it runs, and the
    workload it was for, so `run` can flag a source the plan gave bytes that read nothing."""
    src = load_plan(spec.plan) if spec.plan and os.path.isfile(spec.plan) else None
    same = src is not None and tuple(s.path for s in src.sources) == tuple(spec.sources)

    def predicted(ph: str, weights) -> dict:
        return dict(getattr(src, ph).predicted) if same and tuple(getattr(src, ph).weights) == tuple(weights) else {}

    plan = Plan(sources=tuple(Source(f"source{i}", p) for i, p in enumerate(spec.sources)),
                prefill=Phase(tuple(spec.prefill_weights), predicted("prefill", spec.prefill_weights)),
                decode=Phase(tuple(spec.decode_weights), predicted("decode", spec.decode_weights)),
                engine=spec.engine, stripe="stripe" in spec.switches, direct="direct" in spec.switches,
                created=_now(), provenance={"by": "engine-bridge bench", "arm": spec.name, "from": spec.plan,
                                            **({"model": src.provenance["model"]} if same and "model" in src.provenance
                                               else {})},
                workload=dict(src.workload) if same else {}, geometry=dict(src.geometry) if same else {})
    atomic_write_text(path, json.dumps(plan_to_dict(plan), indent=1) + "\n")
    return path


# -- system facts -------------------------------------------------------------------------

def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def snapshot() -> Snapshot:
    """SwapFree, pswpout, busy and user CPU seconds of all CPUs, load average, and this process's
    plus its waited-for children's CPU seconds, all and user (the arm's own share)."""
    swap_free = 0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("SwapFree:"):
            swap_free = int(line.split()[1])
    pswpout = 0
    for line in _read("/proc/vmstat").splitlines():
        if line.startswith("pswpout "):
            pswpout = int(line.split()[1])
    busy, user = cpu_seconds(_read("/proc/stat"), os.sysconf("SC_CLK_TCK"))
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    own_user = me.ru_utime + kids.ru_utime
    own = own_user + me.ru_stime + kids.ru_stime
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return Snapshot(t=time.monotonic(), swap_free_kb=swap_free, pswpout=pswpout, cpu_busy_s=busy, loadavg=load,
                    own_cpu_s=own, cpu_user_s=user, own_user_s=own_user)


# -- the real runner ------------------------------------------------------------------------

def engine_command(spec: ArmSpec, settings: dict, plan_path: str) -> list[str]:
    """argv of one arm: `engine-bridge run` in a fresh interpreter, the arm's plan, --json. With a
    rig the run takes its model from it (the plan's primary is a rig member: the rig says whether
    it is a file, a split set or a directory); without one, from the primary's path on disk."""
    where = ["--rig", settings["rig"]] if settings.get("rig") else ["--model", spec.sources[0]]
    cmd = list(settings.get("wrap") or []) + [
        sys.executable, "-c", "from engine_bridge.cli import main; main()", "run",
        *where, "--plan", plan_path, "--json", "--no-balance"]   # a plan is measured as cut (run_args may say --balance)
    for key, opt in (("prompt_tokens", "--prompt-tokens"), ("gen_tokens", "--gen-tokens"),
                     ("cache_experts", "--cache-experts"), ("lanes", "--lanes")):
        if settings.get(key) is not None:
            cmd += [opt, str(settings[key])]
    return cmd + list(settings.get("run_args") or [])


def subprocess_runner(spec: ArmSpec, settings: dict, workdir: str, seq: int) -> tuple[dict, str]:
    """Run one arm as `engine-bridge run ... --json` in a fresh process; stderr goes to a log."""
    base = os.path.join(workdir, "arms", f"{seq:02d}-{spec.name}")
    plan_path = os.path.join(workdir, "plans", f"{spec.name}.json")
    if not os.path.exists(plan_path):
        write_arm_plan(spec, plan_path)
    cmd = engine_command(spec, settings, plan_path)
    log = base + ".log"
    with open(log, "w", encoding="utf-8") as errf:
        errf.write("$ " + " ".join(cmd) + "\n")
        errf.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=errf, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        tail = [line for line in _read(log).splitlines() if line.strip()]
        raise ArmFailed(f"exit {proc.returncode}: {tail[-1] if tail else 'no message'} (log {log})")
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise ArmFailed(f"run printed no JSON result ({e}); log {log}") from None
    if not isinstance(result, dict):
        raise ArmFailed(f"run printed {type(result).__name__}, not a JSON object; log {log}")
    return result, log


# -- the bench ------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_dir(runs_root: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path, i = os.path.join(runs_root, stamp), 2
    while os.path.exists(path):
        path, i = os.path.join(runs_root, f"{stamp}-{i}"), i + 1
    os.makedirs(path)
    return path


def bench_settings(prompt_tokens: int | None = None, gen_tokens: int | None = None, cache_experts: int | None = None,
                   lanes: int | None = None, max_other_cpu: float = MAX_OTHER_CPU, run_args: Sequence[str] = (),
                   rig: Rig | None = None) -> dict:
    """The settings every arm runs with (None: `run`'s default); kept in results.json."""
    return {"prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "cache_experts": cache_experts,
            "lanes": lanes, "max_other_cpu": max_other_cpu, "run_args": list(run_args or []),
            "rig": rig.root if rig else None}


def run_folder(out: str | None, rig: Rig | None) -> str:
    """Where a bench run writes: `out` (a fresh timestamped folder inside it when it already
    holds files), else a fresh <rig>/runs/<timestamp>."""
    if out:
        os.makedirs(out, exist_ok=True)
        return new_run_dir(out) if os.listdir(out) else out
    if rig is None:
        raise UsageError("no --out DIR and no rig: give --out or --rig DIR (results go to <rig>/runs/<timestamp>)")
    return new_run_dir(rig.subdir(RUNS_DIR))


def check_hashes(doc: dict, summary: str) -> None:
    """MismatchError (exit 1) when any arm's output hash differs from the reference (the split
    reads delivered wrong bytes or the engine is not deterministic), or when a configuration has
    no passing arm (the run measured nothing for it). Otherwise a failed gate only labels its arm."""
    # Without a reference (the control never completed) no hash can differ from it: every arm then
    # fails 'sha' and the configurations without a passing arm below say what happened.
    bad = sorted({r["arm"] for r in doc["rows"] if "sha" in r["failed"]}) if doc["reference_sha256"] else []
    if bad:
        raise MismatchError(f"output hash differs from the reference in arm(s) {', '.join(bad)}; see {summary}")
    empty = without_passing_arm(doc)
    if empty:
        gates = sorted({g for r in doc["rows"] if r["arm"] in empty for g in r["failed"]})
        raise MismatchError(f"no passing arm for {', '.join(empty)} (failed: {', '.join(gates)}); "
                            f"nothing measured for {'it' if len(empty) == 1 else 'them'}; see {summary}")


def runs_csv(doc: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("seq", "arm", "ok", "failed") + CSV_COLUMNS + ("output_sha256",))
    for r in doc["rows"]:
        w.writerow([r["seq"], r["arm"], int(r["ok"]), "+".join(r["failed"])]
                   + [r["metrics"].get(c) for c in CSV_COLUMNS] + [r["output_sha256"] or ""])
    return buf.getvalue()


def run_bench(specs: Sequence[ArmSpec], order: str, settings: dict, out_dir: str, *,
              runner: Runner | None = None, probe: Callable[[], Snapshot] | None = None, repeat: int = 1,
              report=None, cancel: threading.Event | None = None) -> tuple[dict, dict]:
    """Run every arm of the sequence (one at a time), then write the run folder.

    Returns (results document, {'results', 'summary', 'chart', 'csv', 'dir'} paths). An arm whose
    process fails is kept as a row with its error; it never stops the others.
    """
    names = [s.name for s in specs]
    sequence = arm_sequence(names, order, repeat)
    by_name = {s.name: s for s in specs}
    settings = {"max_other_cpu": MAX_OTHER_CPU, **settings}
    runner = runner or subprocess_runner
    probe = probe or snapshot
    os.makedirs(os.path.join(out_dir, "arms"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "plans"), exist_ok=True)
    for s in specs:
        write_arm_plan(s, os.path.join(out_dir, "plans", f"{s.name}.json"))
    created = _now()
    rows: list[Row] = []
    for seq, name in enumerate(sequence):
        if cancel is not None and cancel.is_set():
            raise Interrupted(f"bench interrupted after {seq} of {len(sequence)} arms; partial rows in {out_dir}")
        spec = by_name[name]
        emit(report, Notice(name, f"arm {seq + 1}/{len(sequence)} {name}: {plural(len(spec.sources), 'source')}, prefill "
                                  f"{':'.join(map(str, spec.prefill_weights))}, decode "
                                  f"{':'.join(map(str, spec.decode_weights))}"))
        before = probe()
        result, error, log = None, "", ""
        try:
            result, log = runner(spec, settings, out_dir, seq)
        except (ArmFailed, OSError, UsageError, MissingError) as e:
            error = str(e)
        after = probe()
        rows.append(Row(seq, name, result, error, before, after, log))
        if result is not None:
            atomic_write_text(os.path.join(out_dir, "arms", f"{seq:02d}-{name}.json"), json.dumps(result, indent=1) + "\n")
            emit(report, Notice(name, f"arm {seq + 1}/{len(sequence)} {name}: prefill {result.get('prefill_tps')} tok/s, "
                                      f"steady {result.get('gen_steady_tps')} tok/s, sha "
                                      f"{str(result.get('output_sha256'))[:12]}"))
        else:
            emit(report, Notice(name, f"arm {seq + 1}/{len(sequence)} {name}: FAILED: {error}"))
    doc = build_results(specs, order, sequence, rows, settings, created)
    paths = {"dir": out_dir, "results": os.path.join(out_dir, "results.json"),
             "summary": os.path.join(out_dir, "summary.md"), "chart": os.path.join(out_dir, "chart.svg"),
             "csv": os.path.join(out_dir, "runs.csv")}
    atomic_write_text(paths["results"], json.dumps(doc, indent=1) + "\n")
    atomic_write_text(paths["summary"], render_markdown(doc))
    atomic_write_text(paths["chart"], render_svg(doc))
    atomic_write_text(paths["csv"], runs_csv(doc))
    return doc, paths
