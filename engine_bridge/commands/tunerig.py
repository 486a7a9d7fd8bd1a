"""engine-bridge tune-rig: from a model and its drives (or an existing rig) to a tuned profile in
one command, doing only what is missing (`engine_bridge.tunerig.chain`, docs/tune-rig.md)."""

from __future__ import annotations

from typing import List, Optional

import typer

from core.cli import JsonOption, QuietOption, RigOption, err, print_result
from core.errors import UsageError
from core.events import Notice
from core.interrupt import cancel_on_interrupt
from core.rig import rig_dir
from core.units import parse_size
from engine_bridge.tuning.judge import DEFAULT_MIN_GAIN_PCT, DEFAULT_SHARE_TOLERANCE
from engine_bridge.tuning.real_engine import DEFAULT_BUDGET_S, DEFAULT_TIMEOUT_S, DEFAULT_TOP
from engine_bridge.tunerig.chain import DEFAULT_PROFILE, EngineTrials, Request, StepLine, TuneRigResult, dry_run, tune_rig
from engine_bridge.tunerig.settings import BenchSettings
from engines.registry import ENGINES


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        out = ()
    if not out or any(x < 1 for x in out):
        raise UsageError(f"{option} {text!r}: give positive whole numbers, comma-separated (1,2,4)")
    return out


def step_text(s: StepLine) -> str:
    took = f" ({s.seconds:.1f} s)" if s.seconds >= 0.05 else ""
    return f"{s.step:<8} {s.action:<6} {s.why}{took}"


def result_lines(r: TuneRigResult) -> list[str]:
    """The result as text (stdout): the profile, its N-1 profiles, the prediction, the engine's trials."""
    if r.dry_run:
        return [f"dry run: {r.rig} ({r.engine}); nothing was copied, measured, solved or written"]
    lines = [f"profile: {r.profile} ({r.engine})"]
    if r.fallbacks:
        lines.append("N-1 profiles: " + ", ".join(f"without {d}: {p}" for d, p in r.fallbacks))
    w = ", ".join(f"{n} {x['prefill']}/{x['decode']}" for n, x in r.weights.items())
    pre = "-" if r.prefill_tok_s is None else f"{r.prefill_tok_s:.2f}"
    dec = "-" if r.decode_tok_s is None else f"{r.decode_tok_s:.2f}"
    lines.append(f"plan: {r.plan}; weights prefill/decode {w}; predicted {pre} tok/s prefill, {dec} tok/s decode")
    t = r.trials
    if t:
        state = ("confirmed in reverse order" if t.get("confirmed") else
                 "not confirmed" if t.get("confirmed") is False else "no confirmation run")
        lines.append(f"engine's trials: winner {t.get('winner') or 'none'} ({state}; {t.get('why')}); its profile "
                     f"{t.get('profile')}")
    lines.append(f"{len(r.steps)} steps in {r.seconds:.1f} s: " + ", ".join(f"{s.step} {s.action}" for s in r.steps))
    return lines


def tune_rig_cmd(
    rig: Optional[str] = RigOption,
    model: Optional[str] = typer.Option(None, "--model", metavar="PATH", help="The model (its file, any file of its split "
                                                                              "set, or its folder): the rig's primary. "
                                                                              "Default: the rig's model."),
    drives: Optional[List[str]] = typer.Option(None, "--drive", metavar="DIR", help="A folder on a drive to hold a replica "
                                                                                    "(repeat per drive); one that holds "
                                                                                    "none yet is copied to."),
    engine: Optional[str] = typer.Option(None, "--engine", help=f"The engine to plan and export for: {', '.join(ENGINES)} "
                                                                "(default: the engine that reads the model)."),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", metavar="NAME", help="The exported profile's name "
                                                                                   "(rig/profiles/NAME.env, .json and its "
                                                                                   "N-1 profiles)."),
    cache_experts: Optional[int] = typer.Option(None, "--cache-experts", metavar="N", help="The expert cache planned and "
                                                                                           "exported (default: the "
                                                                                           "planner's)."),
    full: bool = typer.Option(False, "--full", help="Verify every byte of every member (default: quick, a live stamp is "
                                                    "trusted)."),
    measure: bool = typer.Option(False, "--measure", help="Measure every drive again, even if a result covers them."),
    bench_seconds: float = typer.Option(BenchSettings().seconds, "--bench-seconds", metavar="S", help="Seconds per "
                                                                                                      "measured trial."),
    bench_presets: str = typer.Option(",".join(BenchSettings().presets), "--bench-presets", metavar="P,P",
                                      help="iobench presets measured."),
    bench_lanes: str = typer.Option(",".join(map(str, BenchSettings().lanes)), "--bench-lanes", metavar="N,N",
                                    help="Lane counts measured."),
    bench_repeat: int = typer.Option(BenchSettings().repeat, "--bench-repeat", min=1, metavar="N",
                                     help="Repeats per measured trial."),
    piece_size: str = typer.Option("64M", "--piece-size", help="Manifest piece size of a first copy (binary units)."),
    allow_same_device: bool = typer.Option(False, "--allow-same-device", help="Allow a copy on the same physical drive as "
                                                                              "another member."),
    allow_unverified: bool = typer.Option(False, "--allow-unverified", help="Export replicas not verified against the "
                                                                            "manifest (the profile is marked)."),
    redo: bool = typer.Option(False, "--redo", help="Solve, export and run the engine's trials again even when nothing "
                                                    "they depend on changed."),
    binary: Optional[str] = typer.Option(None, "--binary", metavar="PATH", help="The real engine (or `engine-bridge "
                                                                                "standin`): run its trials on the "
                                                                                "candidates' profiles within --budget."),
    budget: float = typer.Option(DEFAULT_BUDGET_S, "--budget", metavar="SECONDS", help="--binary: seconds for the engine's "
                                                                                       "trials."),
    top: int = typer.Option(DEFAULT_TOP, "--top", min=1, max=20, help="--binary: the planner's best candidates run."),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", metavar="SECONDS", help="--binary: stop one run of the "
                                                                                          "engine after this long."),
    min_gain: float = typer.Option(DEFAULT_MIN_GAIN_PCT, "--min-gain", metavar="PCT", help="--binary: what a non-default "
                                                                                           "arm must gain over the "
                                                                                           "engine's default, %."),
    share_tolerance: float = typer.Option(DEFAULT_SHARE_TOLERANCE, "--share-tolerance", metavar="SHARE",
                                          help="--binary: how far each drive's share of the bytes may be from the "
                                               "profile's promise."),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", metavar="N", help="--binary: the prompt the "
                                                                                           "planner prices."),
    dry: bool = typer.Option(False, "--dry-run", help="List the steps, what each would do or reuse and why; change "
                                                      "nothing."),
    quiet: bool = QuietOption,
    json_out: bool = JsonOption,
    engine_args: Optional[List[str]] = typer.Argument(None, metavar="-- ENGINE_ARGS", help="--binary: passed to the engine "
                                                                                           "after each profile's "
                                                                                           "arguments."),
):
    """From a model and its drives (or an existing rig) to a tuned profile: copy or verify the replicas, measure the
    drives (or reuse a result that still covers them), solve, export the profile and its N-1 profiles, and run the
    real engine's trials when given its path. Each step says what it reused and why; run it again after Ctrl-C to
    resume."""
    if engine_args and binary is None:
        raise UsageError(f"engine arguments ({' '.join(engine_args)}) are for --binary")
    if bench_seconds <= 0:
        raise UsageError(f"--bench-seconds {bench_seconds:g}: give positive seconds")
    from iobench.schedule import parse_presets

    trials = None
    if binary is not None:
        trials = EngineTrials(binary, tuple(engine_args or ()), budget, top, timeout, min_gain, share_tolerance,
                              prompt_tokens)
    req = Request(rig_dir(rig), model, tuple(drives or ()), engine, profile, cache_experts, "full" if full else "quick",
                  "always" if measure else "auto",
                  BenchSettings(parse_presets(bench_presets, "--bench-presets"), _ints(bench_lanes, "--bench-lanes"),
                                bench_seconds, bench_repeat),
                  parse_size(piece_size, "--piece-size"), allow_same_device, allow_unverified, redo, trials)

    def say(s: StepLine) -> None:
        err.print(f"tune-rig: {step_text(s)}", highlight=False, soft_wrap=True, markup=False)

    def say_line(text: str) -> None:
        if not quiet:
            err.print(f"tune-rig:   {text}", highlight=False, soft_wrap=True, markup=False)

    def report(ev) -> None:
        if isinstance(ev, Notice) and (not quiet or ev.warning):
            err.print(f"tune-rig:   {ev.task}: {ev.message}", highlight=False, soft_wrap=True, markup=False)

    if dry:
        res = dry_run(req)
        for s in res.steps:
            say(s)
    else:
        with cancel_on_interrupt(err.print, "interrupt: stopping after this step's durable work (again to stop at once)") \
                as cancel:
            res = tune_rig(req, say=say, say_line=say_line, report=report, cancel=cancel)
    if json_out:
        print_result(res)
    else:
        typer.echo("\n".join(result_lines(res)))


def register(app) -> None:
    """Add this module's command to the engine-bridge app."""
    app.command("tune-rig")(tune_rig_cmd)
