"""engine-bridge commands: autotune (measure the planner's candidates and keep the best: with our
split reader by default, `engine_bridge.tuning.embedded`; with the real engine given --binary,
`engine_bridge.tuning.real_engine`) and tune (the planner's split tuner with a key that measures)."""

from __future__ import annotations

from typing import List, Optional

import typer

from core.cli import JsonOption, QuietOption, RigOption, err, print_result
from core.interrupt import cancel_on_interrupt
from core.errors import UsageError
from core.rig import rig_dir
from core.units import format_rate
from engine_bridge.tuning.real_engine import DEFAULT_TIMEOUT_S
from engine_bridge.tuning.embedded import REST_S, TUNER_TRIAL_S, WARMUP_S, autotune, render, tuner_measure
from engine_bridge.tuning.judge import DEFAULT_MIN_GAIN_PCT, DEFAULT_SHARE_TOLERANCE
from engines.registry import ENGINES
from planner.autotune import DEFAULT_BUDGET_S, DEFAULT_TOP, DEFAULT_TRIAL_S
from planner.rigmodel import rig_engine


def _engine_trials(root, binary, engine, args, budget, top, timeout, min_gain, tolerance, bench, rounds, prompt_tokens,
                   cache_experts, allow_unverified, quiet, json_out) -> None:
    """autotune --binary: the real engine's ABBA trials (`engine_bridge.tuning.real_engine`), progress on
    stderr, the report on stdout; Ctrl-C once stops after the running arm (complete rounds are
    kept), twice stops it at once."""
    from engine_bridge.tuning.real_engine import render as render_trials
    from engine_bridge.tuning.real_engine import tune_with_engine

    def on_event(msg: str) -> None:
        if not quiet:
            err.print(f"autotune: {msg}", highlight=False, soft_wrap=True, markup=False)

    with cancel_on_interrupt(err.print, "interrupt: stopping after this arm (again to stop it now)") as cancel:
        doc, _folder = tune_with_engine(root, binary, engine, args, budget, top, timeout, min_gain, tolerance, bench,
                                        rounds, prompt_tokens, cache_experts, allow_unverified, on_event=on_event,
                                        stop=cancel.is_set)
    if json_out:
        from engine_bridge.tuning.judge import EngineTuneReport

        print_result(EngineTuneReport({k: v for k, v in doc.items() if k != "lines"}))
    else:
        typer.echo(render_trials(doc), nl=False)


def autotune_cmd(
    rig: Optional[str] = RigOption,
    bench: Optional[str] = typer.Option(None, "--bench", metavar="RESULT", help="iobench result file (default: newest in "
                                                                                "rig/bench)."),
    engine: Optional[str] = typer.Option(None, "--engine", help=f"Engine whose reads are planned and measured: "
                                                                f"{', '.join(ENGINES)} (default: the engine that reads "
                                                                "the rig's model)."),
    budget: float = typer.Option(DEFAULT_BUDGET_S, "--budget", help="Seconds for all the measuring (a trial that would "
                                                                    "overrun it is not started; a budget below one trial is "
                                                                    "refused)."),
    seconds: float = typer.Option(DEFAULT_TRIAL_S, "--seconds", help="Seconds per measured trial."),
    warmup: float = typer.Option(WARMUP_S, "--warmup", help="Seconds each trial reads before its clock starts (a drive left "
                                                            "idle may start fast)."),
    rest: float = typer.Option(REST_S, "--rest", help="Seconds without reads before each trial, so a rate limiter forgets "
                                                      "the budget the previous trial left unused (0: none)."),
    top: int = typer.Option(DEFAULT_TOP, "--top", min=1, max=20, help="The model's best candidates measured (plus capability "
                                                                      "and equal weights)."),
    rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="At most this many rounds (default: as many as fit "
                                                                       "the budget)."),
    background: Optional[List[str]] = typer.Option(None, "--background", metavar="SOURCE:KIND", help="As `planner solve "
                                                                                                     "--background`."),
    lanes: Optional[int] = typer.Option(None, "--lanes", min=1, max=64, help="Reads in flight per drive, for an engine that "
                                                                             "keeps them per drive (default: the engine's)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, max=256, help="Reads in flight over all drives, for an "
                                                                                  "engine that shares one pool (default: "
                                                                                  "the engine's)."),
    fit_only: bool = typer.Option(False, "--fit-only", help="Solve with iobench's fitted models alone."),
    seed: int = typer.Option(0, "--seed", help="Seed of the order in which a trial walks the phase's steps."),
    cached: bool = typer.Option(False, "--cached", help="Page-cache reads instead of cold reads (not a drive measurement)."),
    binary: Optional[str] = typer.Option(None, "--binary", metavar="PATH", help="Run the real engine (or a stand-in: "
                                                                                "`engine-bridge standin`) on each "
                                                                                "candidate's profile instead of our split "
                                                                                "reader, and judge it by the engine's own "
                                                                                "counters and timing."),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", metavar="SECONDS", help="--binary: stop one run of the "
                                                                                          "engine after this long (the arm "
                                                                                          "fails; the loop goes on)."),
    min_gain: float = typer.Option(DEFAULT_MIN_GAIN_PCT, "--min-gain", metavar="PCT", help="--binary: what a non-default arm "
                                                                                           "must gain over the engine's "
                                                                                           "default, %."),
    share_tolerance: float = typer.Option(DEFAULT_SHARE_TOLERANCE, "--share-tolerance", metavar="SHARE", help="--binary: how "
                                                                                                              "far each "
                                                                                                              "drive's "
                                                                                                              "share of the "
                                                                                                              "bytes may be "
                                                                                                              "from the "
                                                                                                              "profile's "
                                                                                                              "promise "
                                                                                                              "(0.10 = 10 "
                                                                                                              "points)."),
    cache_experts: Optional[int] = typer.Option(None, "--cache-experts", metavar="N", help="--binary: the expert cache the "
                                                                                           "engine runs with (priced by the "
                                                                                           "planner; an argument of engines "
                                                                                           "whose profile takes one)."),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", metavar="N", help="--binary: the prompt the planner "
                                                                                           "prices (the engine's own run "
                                                                                           "decides what it reads)."),
    allow_unverified: bool = typer.Option(False, "--allow-unverified", help="--binary: export replicas not verified against "
                                                                            "the manifest."),
    quiet: bool = QuietOption,
    json_out: bool = JsonOption,
    engine_args: Optional[List[str]] = typer.Argument(None, metavar="-- ENGINE_ARGS", help="--binary: passed to the engine "
                                                                                           "after each profile's arguments."),
):
    """Measure the planner's candidates and write the best as a plan: with our split reader executing the engine's reads
    (default), or with the real engine itself (its path given, ABBA within --budget, docs/tuner.md)."""
    root = rig_dir(rig)
    if binary is not None:
        _engine_trials(root, binary, engine, engine_args or [], budget, top, timeout, min_gain, share_tolerance,
                       bench, rounds, prompt_tokens, cache_experts, allow_unverified, quiet, json_out)
        return
    if engine_args:
        raise UsageError(f"engine arguments ({' '.join(engine_args)}) are for --binary")
    _reader_trials(root, bench, rig_engine(root, engine), tuple(background or ()), budget, seconds, top, rounds,
                   not fit_only, seed, not cached, dict(warmup_s=warmup, rest_s=rest, lanes=lanes, threads=threads),
                   quiet, json_out)


def _reader_trials(root, bench, engine, background, budget, seconds, top, rounds, calibrate, seed, cold, reading,
                   quiet, json_out) -> None:
    """autotune (no --binary): the candidates measured by our split reader executing the engine's reads
    (`engine_bridge.tuning.embedded.autotune`), progress on stderr, the plan written and rendered;
    Ctrl-C once stops after the running trial (what was measured is kept), twice stops it at once."""
    from planner.plans import SavedPlan

    def on_trial(t, arm):
        if not quiet:
            err.print(f"autotune: round {t.round + 1} {arm.phase} {arm.label} ({', '.join(arm.roles)}): "
                      f"{format_rate(t.Bps)}, predicted {format_rate(arm.predicted_Bps)}", highlight=False, soft_wrap=True)

    with cancel_on_interrupt(err.print, "interrupt: stopping after this trial (again to abort)") as cancel:
        plan, path = autotune(root, bench, engine, background, budget, seconds, top, rounds, calibrate, seed, cold,
                              on_trial=on_trial, stop=cancel.is_set, **reading)
    if not quiet:       # said once the plan is written, so a failing command says one line
        for v in (plan.workload.get("idle") or {}).values():
            err.print(f"notice: {v['why']}", markup=False)
    if json_out:
        print_result(SavedPlan(plan, path))
    else:
        typer.echo(render(plan, path), nl=False)


def tune_cmd(
    rig: Optional[str] = RigOption,
    bench: Optional[str] = typer.Option(None, "--bench", metavar="RESULT", help="iobench result file (default: newest in "
                                                                                "rig/bench)."),
    plan: Optional[str] = typer.Option(None, "--plan", metavar="PLAN", help="Plan to start from and reset to (default: the "
                                                                            "newest)."),
    seconds: float = typer.Option(TUNER_TRIAL_S, "--seconds", help="Seconds of the measuring key's trial."),
    fit_only: bool = typer.Option(False, "--fit-only", help="Use iobench's fitted drive models alone."),
    cached: bool = typer.Option(False, "--cached", help="Page-cache reads instead of cold reads (not a drive measurement)."),
):
    """Open the planner's split tuner with `m` measuring the weights on screen: the engine's reads of the phase through
    the split reader."""
    from planner.tui.app import run_tuner

    if seconds <= 0:
        raise UsageError(f"--seconds {seconds:g}: give positive seconds")

    root = rig_dir(rig)
    run_tuner(root, bench, plan, calibrate=not fit_only, measure=tuner_measure(root, seconds, cold=not cached))


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""
    app.command("autotune")(autotune_cmd)
    app.command("tune")(tune_cmd)
