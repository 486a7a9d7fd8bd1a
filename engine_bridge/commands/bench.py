"""engine-bridge commands: bench and ladder (the harness)."""

from __future__ import annotations

import os
import signal
import threading
from typing import List, Optional

import typer

from core.cli import JsonOption, RigOption, err, print_json
from core.errors import MismatchError, UsageError
from engine_bridge.harness.arms import MAX_OTHER_CPU, ORDERS


def _load_rig(rig_opt: Optional[str], required: bool):
    from core.rig import load_rig, rig_dir

    root = rig_dir(rig_opt)
    return load_rig(root, must_exist=required)


def _settings(prompt_tokens, gen_tokens, cache_experts, lanes, max_other_cpu, run_args, rig) -> dict:
    return {"prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "cache_experts": cache_experts,
            "lanes": lanes, "max_other_cpu": max_other_cpu, "run_args": list(run_args or []),
            "rig": rig.root if rig else None}


def _execute(specs, order, settings, out, rig, repeat, json_out):
    from engine_bridge.harness.runner import new_run_dir, run_bench

    if out:
        os.makedirs(out, exist_ok=True)
        out_dir = new_run_dir(out) if os.listdir(out) else out
    else:
        if rig is None:
            raise UsageError("no --out DIR and no rig: give --out or --rig DIR (results go to <rig>/runs/<timestamp>)")
        out_dir = new_run_dir(rig.subdir("runs"))
    cancel = threading.Event()
    old = signal.getsignal(signal.SIGINT)

    def on_int(signum, frame):  # finish the running arm's bookkeeping, then stop
        if cancel.is_set():
            signal.signal(signal.SIGINT, old)
            raise KeyboardInterrupt
        cancel.set()
        err.print("interrupt: stopping after this arm (again to abort)")

    def report(ev):
        err.print(f"bench: {ev.message}", highlight=False, markup=False, soft_wrap=True)

    signal.signal(signal.SIGINT, on_int)
    try:
        doc, paths = run_bench(specs, order, settings, out_dir, repeat=repeat, report=report, cancel=cancel)
    finally:
        signal.signal(signal.SIGINT, old)
    if json_out:
        print_json(doc)
    else:
        ctl = doc["control"]
        typer.echo(f"{'arm':10} {'ok':>5} {'prefill tok/s':>13} {'x':>6} {'gen tok/s':>10} {'x':>6} "
                   f"{'steady tok/s':>12} {'x':>6}")
        for a in doc["arms"]:
            m, g = doc["medians"][a], doc["gains"][a]
            f = lambda v, nd=2: "-" if v is None else f"{v:.{nd}f}"  # noqa: E731
            typer.echo(f"{a:10} {m['n']:>2}/{m['n'] + m['n_failed']:<2} {f(m['prefill_tps']):>13} "
                       f"{f(g['prefill_tps']):>6} {f(m['gen_tps']):>10} {f(g['gen_tps']):>6} "
                       f"{f(m['gen_steady_tps']):>12} {f(g['gen_steady_tps']):>6}")
        typer.echo(f"ratios vs control {ctl}; results {paths['results']}; summary {paths['summary']}; "
                   f"chart {paths['chart']}")
    bad = [r for r in doc["rows"] if "sha" in r["failed"]]
    if bad:
        raise MismatchError(f"output hash differs from the reference in arm(s) "
                            f"{', '.join(sorted({r['arm'] for r in bad}))}; see {paths['summary']}")
    return doc


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""

    common = dict(
        prompt_tokens=typer.Option(None, "--prompt-tokens", help="Prompt tokens per arm (default: run's)."),
        gen_tokens=typer.Option(None, "--gen-tokens", help="Generated tokens per arm (default: run's)."),
        cache_experts=typer.Option(None, "--cache-experts", help="Expert cache size, experts (default: run's)."),
        lanes=typer.Option(None, "--lanes", help="Reader lanes per source (default: run's)."),
        max_other_cpu=typer.Option(MAX_OTHER_CPU, "--max-other-cpu",
                                   help="Load gate: cores other processes may use during an arm."),
        run_arg=typer.Option([], "--run-arg", help="Extra argument passed to every `run` (repeatable)."),
        out=typer.Option(None, "--out", metavar="DIR", help="Run folder (default <rig>/runs/<timestamp>)."),
    )

    @app.command("bench")
    def bench_cmd(
        rig: Optional[str] = RigOption,
        arm: List[str] = typer.Option(..., "--arm", metavar="NAME=PLAN",
                                      help="An arm: a plan file / name in <rig>/plans, or inline weights "
                                           "P:P[:P][/D:D[:D]] over the rig's first members. Repeatable; the "
                                           "first is the control and the reference."),
        order: str = typer.Option("ABBA", "--order", help=f"Run order: {', '.join(ORDERS)}."),
        repeat: int = typer.Option(1, "--repeat", help="Repeat the whole order this many times."),
        prompt_tokens: Optional[int] = common["prompt_tokens"],
        gen_tokens: Optional[int] = common["gen_tokens"],
        cache_experts: Optional[int] = common["cache_experts"],
        lanes: Optional[int] = common["lanes"],
        max_other_cpu: float = common["max_other_cpu"],
        run_arg: List[str] = common["run_arg"],
        out: Optional[str] = common["out"],
        json_out: bool = JsonOption,
    ):
        """Run arms interleaved (ABBA, BAAB, ABAB or a ladder), each in a fresh process; gate, summarise."""
        from engine_bridge.harness.arms import parse_arm
        from engine_bridge.harness.runner import resolve_arm

        parsed = [parse_arm(a) for a in arm]
        needs_rig = any(not os.path.isfile(ref) for _, ref in parsed)
        r = _load_rig(rig, required=needs_rig)
        specs = [resolve_arm(n, ref, r) for n, ref in parsed]
        settings = _settings(prompt_tokens, gen_tokens, cache_experts, lanes, max_other_cpu, run_arg, r)
        _execute(specs, order, settings, out, r, repeat, json_out)

    @app.command("ladder")
    def ladder_cmd(
        rig: Optional[str] = RigOption,
        plan: Optional[str] = typer.Option(None, "--plan", metavar="PLAN",
                                           help="Weights (and sources) from this plan (default: the newest in <rig>/plans)."),
        weights: Optional[str] = typer.Option(None, "--weights", metavar="W:W:W",
                                              help="Prefill weights over the rig's members instead of a plan."),
        decode_weights: Optional[str] = typer.Option(None, "--decode-weights", metavar="W:W:W",
                                                     help="Decode weights (default: the prefill weights)."),
        repeat: int = typer.Option(1, "--repeat", help="Repeat the whole ladder this many times."),
        prompt_tokens: Optional[int] = common["prompt_tokens"],
        gen_tokens: Optional[int] = common["gen_tokens"],
        cache_experts: Optional[int] = common["cache_experts"],
        lanes: Optional[int] = common["lanes"],
        max_other_cpu: float = common["max_other_cpu"],
        run_arg: List[str] = common["run_arg"],
        out: Optional[str] = common["out"],
        json_out: bool = JsonOption,
    ):
        """One drive (primary alone), plus one replica, plus two: U S1 U S2 S2 U S1 U, ratios to one drive."""
        from engine_bridge.harness.runner import ladder_specs, resolve_arm
        from engines.split import parse_weights

        r = _load_rig(rig, required=plan is None)
        if weights:
            if plan:
                raise UsageError("give either --plan or --weights, not both")
            if r.model is None:
                raise UsageError(f"the rig at {r.root} has no model; run `replicas init` / `replicas sync` first")
            pre = parse_weights(weights)
            paths = [m.path for m in r.members]
        else:
            from planner.plans import resolve_plan_path

            spec = resolve_arm("plan", resolve_plan_path(plan or "latest", r), r)
            paths, pre = list(spec.sources), spec.prefill_weights
            if not decode_weights:
                decode_weights = ":".join(map(str, spec.decode_weights))
        dec = parse_weights(decode_weights) if decode_weights else pre
        specs = ladder_specs(paths, pre, dec)
        settings = _settings(prompt_tokens, gen_tokens, cache_experts, lanes, max_other_cpu, run_arg, r)
        _execute(specs, "ladder", settings, out, r, repeat, json_out)
