"""engine-bridge commands: bench and ladder (the harness)."""

from __future__ import annotations

import signal
import threading
from typing import List, Optional

import typer

from core.cli import JsonOption, QuietOption, RigOption, err, print_result
from engine_bridge.harness.arms import MAX_OTHER_CPU, ORDERS, BenchResults


def _execute(specs, order, settings, out, rig, repeat, json_out, quiet=False):
    """Run the arms into their run folder, Ctrl-C stopping after the running arm; print the table."""
    from engine_bridge.harness.summary import render_console, render_failures, render_idle
    from engine_bridge.harness.runner import check_hashes, run_bench, run_folder

    out_dir = run_folder(out, rig)
    cancel = threading.Event()
    old = signal.getsignal(signal.SIGINT)

    def on_int(signum, frame):  # finish the running arm's bookkeeping, then stop
        if cancel.is_set():
            signal.signal(signal.SIGINT, old)
            raise KeyboardInterrupt
        cancel.set()
        err.print("interrupt: stopping after this arm (again to abort)")

    def report(ev):
        if not quiet:
            err.print(f"bench: {ev.message}", highlight=False, markup=False, soft_wrap=True)

    signal.signal(signal.SIGINT, on_int)
    try:
        doc, paths = run_bench(specs, order, settings, out_dir, repeat=repeat, report=report, cancel=cancel)
    finally:
        signal.signal(signal.SIGINT, old)
    failures = render_failures(doc) + render_idle(doc)
    if json_out:
        print_result(BenchResults(doc))
        typer.echo(failures, err=True, nl=False)         # stdout holds only the JSON
    else:
        typer.echo(render_console(doc, paths) + failures, nl=False)
    check_hashes(doc, paths["summary"])                  # exit 1: a wrong hash, or a configuration with no passing arm
    return doc


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""

    common = dict(
        prompt_tokens=typer.Option(None, "--prompt-tokens", help="Prompt tokens per arm (default: run's)."),
        gen_tokens=typer.Option(None, "--gen-tokens", help="Generated tokens per arm (default: run's)."),
        cache_experts=typer.Option(None, "--cache-experts", help="Expert cache size, experts (default: run's)."),
        lanes=typer.Option(None, "--lanes", help="Reader lanes per source (default: run's)."),
        max_other_cpu=typer.Option(MAX_OTHER_CPU, "--max-other-cpu",
                                   help="Load gate: cores of user-mode CPU other processes may use on average during an arm."),
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
        quiet: bool = QuietOption,
        json_out: bool = JsonOption,
    ):
        """Run arms interleaved (ABBA, BAAB, ABAB or a ladder), each in a fresh process; gate, summarise."""
        from engine_bridge.harness.runner import bench_arms, bench_settings

        specs, r = bench_arms(arm, rig)
        settings = bench_settings(prompt_tokens, gen_tokens, cache_experts, lanes, max_other_cpu, run_arg, r)
        _execute(specs, order, settings, out, r, repeat, json_out, quiet)

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
        quiet: bool = QuietOption,
        json_out: bool = JsonOption,
    ):
        """One drive (primary alone), plus one replica, plus two: U S1 U S2 S2 U S1 U, ratios to one drive."""
        from engine_bridge.harness.runner import bench_settings, ladder_arms

        specs, r = ladder_arms(rig, plan, weights, decode_weights)
        settings = bench_settings(prompt_tokens, gen_tokens, cache_experts, lanes, max_other_cpu, run_arg, r)
        _execute(specs, "ladder", settings, out, r, repeat, json_out, quiet)
