"""engine-bridge commands: autotune (solve, then measure the best candidates with the split reader
and keep the measured best) and tune (the planner's split tuner with a key that measures).

Why these live here and not in `planner`: a measured split has to be read by the real split
reader (`engine_bridge.reader.SplitReader`, the reads the embedded engine makes), and the planner
sits below engine_bridge (core <- engines <- replicas <- iobench <- planner <- engine_bridge).
iobench's trials keep each drive's lanes busy on their own and have no barrier across drives,
so they cannot measure what a split delivers. The planner keeps the logic, pure and tested
(`planner.autotune`: candidates, ABBA order, the budget, the pick, the measured plan); this
module supplies the reads (`SplitMeasure`) and the host's clock.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import List, Optional, Sequence

import numpy as np
import typer

from core.cli import JsonOption, QuietOption, RigOption, err, print_json
from core.errors import UsageError
from core.rig import load_rig, rig_dir
from core.units import format_rate
from engines.registry import DEFAULT_ENGINE, get_engine
from planner.autotune import DEFAULT_BUDGET_S, DEFAULT_TOP, DEFAULT_TRIAL_S

ALIGN = 4096                    # decode reads start on 4 KiB boundaries, as expert components do
# The split reader reads as the default engine does: its reads in flight are that engine's own.
PREFILL_LANES = get_engine(DEFAULT_ENGINE).concurrency("prefill").per_source
DECODE_THREADS = get_engine(DEFAULT_ENGINE).concurrency("decode").shared
TUNER_TRIAL_S = 2.0             # the tuner's measuring key: one short trial, s
WARMUP_S = 0.5                  # a trial's reads before its clock starts, s (`timed_rate`)
# No reads for this long before a trial (`SplitMeasure`), s: a rate limiter then forgets what the
# previous trial left unused. The testbed's (blk-throttle, what cgroup io.max applies) keeps up to
# two 100 ms slices of a drive's unused budget while reads keep coming; a drive the previous
# trial left partly idle then ran past its ceiling for the whole next trial (4:4:3 on the iops
# set: 594 and 592 MB/s after 4:3:3, 562 after itself or 0.3 s of rest; 0.15 s was not always
# enough). After two slices with nothing queued the limiter starts a fresh slice.
REST_S = 0.3


class SplitMeasure:
    """Bytes/s the split reader delivers for one phase's reads at some weights, on these sources
    (each a copy of the model: a path, or a `ModelSet` for a split set or a directory).

    prefill: `chunks` consecutive chunks of the workload's size per read_many (one barrier, like a
    layer's staging), `lanes` reader threads per source, at random chunk-aligned places.
    decode: `batch` components at random 4 KiB-aligned offsets together (one missed expert, one
    barrier), `min(batch, threads / sources)` threads per source. Reads go to the model's largest
    file. Cold reads unless `cold=False`. Each trial starts after `rest` seconds without reads
    (REST_S; `sleep` waits them), then reads `warmup` seconds uncounted (`timed_rate`).
    """

    def __init__(self, sources, workloads, seed: int = 0, cold: bool = True, chunks: int | None = None,
                 warmup: float = WARMUP_S, rest: float = REST_S, sleep=time.sleep):
        from core.coldio import aligned_buffer

        self.sources = list(sources)
        self.workloads = dict(workloads)
        self.cold = cold
        self.warmup = warmup
        self.rest, self.sleep = rest, sleep
        self.rng = np.random.default_rng(seed)
        pre, dec = self.workloads["prefill"], self.workloads["decode"]
        self.chunks = chunks or 2 * pre.in_flight
        self._bufs = {"prefill": [aligned_buffer(pre.read_bytes + ALIGN) for _ in range(self.chunks)],
                      "decode": [aligned_buffer(dec.read_bytes + ALIGN) for _ in range(dec.in_flight)]}

    def __call__(self, phase: str, weights, seconds: float, sources=None) -> float:
        """Bytes/s at `weights` over `seconds` after the rest and the warm-up (`timed_rate`);
        `sources`: a subset of the sources to read instead (one drive alone, say), weights to match."""
        from engine_bridge.reader.split_reader import SplitReader

        wl = self.workloads[phase]
        sources = self.sources if sources is None else list(sources)
        n = len(sources)
        lanes = wl.in_flight if phase == "prefill" else max(1, min(wl.in_flight, wl.threads // n))
        with SplitReader(sources, weights, weights, lanes=lanes, cold=self.cold) as r:
            file = max(r.files, key=lambda f: (r.sizes[f], f))
            size = r.sizes[file]
            if size < wl.read_bytes:
                raise UsageError(f"{r.paths[0]}: its largest file holds {size:,} bytes, less than one {phase} read "
                                 f"({wl.read_bytes:,} B); measure on the model's own files")
            bufs = self._bufs[phase]

            def barrier() -> int:
                if phase == "prefill":
                    k = max(1, min(self.chunks, size // wl.read_bytes))
                    start = int(self.rng.integers(0, size // wl.read_bytes - k + 1)) * wl.read_bytes
                    ranges = [(start + i * wl.read_bytes, wl.read_bytes) for i in range(k)]
                else:
                    top = (size - wl.read_bytes) // ALIGN
                    ranges = [(int(x) * ALIGN, wl.read_bytes) for x in self.rng.integers(0, top + 1, wl.in_flight)]
                r.read_many(ranges, phase, buffers=bufs[:len(ranges)], file=file)
                return sum(x[1] for x in ranges)

            if self.rest > 0:
                self.sleep(self.rest)
            return timed_rate(barrier, seconds, self.warmup)


def timed_rate(step, seconds: float, warmup: float = WARMUP_S, clock=time.monotonic) -> float:
    """Bytes/s of `step()` (one barrier's reads; returns its bytes) repeated: `warmup` seconds
    uncounted, then at least `seconds` measured as the least-squares slope of bytes done
    against the time each step ended (the first point: 0 bytes at the clock's start).

    The warm-up leaves the start out: a drive the previous trial left idle may begin with a
    throttle slice's budget at once (on the testbed the first trial after opening a reader ran
    462 MB/s where the same split then held 432). The slope, not bytes over the last step's end,
    because a drive or a throttle delivers in steps (the testbed's in 100 ms slices) and where
    a trial's last step falls against them moved a 2 s trial's rate: sd 1.6 % over six trials,
    0.3 % for the slope. With only two points (one step) the slope is bytes over time."""
    t0 = clock()
    while clock() - t0 < warmup:
        step()
    t0 = clock()
    t, done = [0.0], [0]
    while t[-1] < seconds:
        done.append(done[-1] + step())
        t.append(clock() - t0)
    x, y = np.array(t), np.array(done, dtype=float)
    x -= x.mean()
    den = float((x * x).sum())
    return float((x * (y - y.mean())).sum() / den) if den > 0 else 0.0


def rig_sources(rig_root: str, sources) -> list:
    """Each plan source's copy of the model (`ModelSet`): where the rig member with that path keeps
    it (a split set or a directory as the rig describes it), else the file at that path."""
    from engine_bridge.engine.sources import member_model

    rig = load_rig(rig_root, must_exist=False)
    return [member_model(s.path, rig) for s in sources]


def autotune(rig_root: str, bench: str | None, workloads, background: Sequence[str] = (),
             budget_s: float = DEFAULT_BUDGET_S, trial_s: float = DEFAULT_TRIAL_S, top: int = DEFAULT_TOP,
             rounds: int | None = None, calibrate: bool = True, seed: int = 0, cold: bool = True, measure=None,
             clock=time.monotonic, on_trial=None, stop=None, geometry: dict | None = None, warmup_s: float = WARMUP_S,
             rest_s: float = REST_S):
    """Solve, measure the candidates within the budget, write the measured plan. Returns (the plan
    as written, its path).

    workloads: phase -> `Workload`, or a `planner.workload.ModelWorkload` (`choose_workload`'s:
    the plan then records it and the geometry, as `planner solve` does); background: `--background` specs ('primary:engram', 'NAME:20%'); measure(phase, weights,
    seconds) -> bytes/s (default: `SplitMeasure` on the rig's sources); stop() true: no further
    trial (the plan is written from what was measured); geometry: the plan's `geometry` block;
    warmup_s: seconds each trial reads before its clock starts (`timed_rate`); rest_s: seconds
    without reads before each trial (REST_S); both are counted in the budget and in the rounds
    planned."""
    from dataclasses import replace

    from planner.autotune import arms_for, measured_plan, pick, run_trials
    from planner.plans import load_inputs, load_plan, parse_background, save_plan
    from planner.solve import solve_phase, solve_plan

    if budget_s <= 0 or trial_s <= 0 or warmup_s < 0 or rest_s < 0:
        raise UsageError(f"--budget {budget_s:g} / --seconds {trial_s:g} / --warmup {warmup_s:g} / --rest {rest_s:g}: "
                         "give positive seconds (the warm-up and the rest may be 0)")
    chosen = None
    if not isinstance(workloads, dict):
        chosen, workloads = workloads, {"prefill": workloads.prefill, "decode": workloads.decode}
    inputs = load_inputs(rig_root, bench, calibrate=calibrate)
    backgrounds = tuple(parse_background(b, [s.name for s in inputs.sources]) for b in background)
    plan = solve_plan(inputs.sources, inputs.drives, workloads["prefill"], workloads["decode"], backgrounds,
                      DEFAULT_ENGINE, inputs.provenance, links=inputs.links)
    if chosen is not None and geometry is not None:
        plan = replace(plan, geometry=geometry, workload=chosen.as_dict())
    arms = ()
    for ph in ("prefill", "decode"):
        arms += arms_for(solve_phase(inputs.drives, workloads[ph], backgrounds, DEFAULT_ENGINE, max(top, 1),
                                     inputs.links), top)
    measure = measure or SplitMeasure(rig_sources(rig_root, inputs.sources), workloads, seed, cold, warmup=warmup_s,
                                      rest=rest_s)
    tally = run_trials(arms, lambda arm, s: measure(arm.phase, arm.weights, s), clock, budget_s, trial_s, rounds,
                       on_trial, stop, overhead_s=warmup_s + rest_s)
    settings = {"budget_s": budget_s, "trial_s": trial_s, "warmup_s": warmup_s, "rest_s": rest_s, "top": top,
                "seed": seed, "cold": cold, "reader": "engine_bridge.reader.SplitReader"}
    path = save_plan(load_rig(rig_root, must_exist=False), measured_plan(plan, arms, tally, pick(arms, tally), settings))
    return load_plan(path), path


def render(plan, path: str) -> str:
    """Per phase: every candidate's prediction beside its measurement, the pick and its error."""
    lines = []
    auto = plan.provenance.get("autotune", {})
    planned = auto.get("rounds_planned", 0)
    # the trials say how much of the last round the budget left out (rounds_done counts rounds begun)
    trials = f", {len(auto.get('trials', []))} of {planned * len(auto.get('arms', []))} trials"
    lines.append(f"autotune: {auto.get('rounds_done', 0)} of {planned} rounds{trials} in "
                 f"{auto.get('wall_s', 0):.0f} s (budget {auto.get('budget_s', 0):.0f} s"
                 + (", stopped by the budget)" if auto.get("stopped_by_budget") else
                    ", interrupted)" if auto.get("interrupted") else ")"))
    for ph in ("prefill", "decode"):
        m = getattr(plan, ph).measured
        if not m:
            continue
        lines.append(f"{ph}:")
        lines.append(f"  {'weights':>14} {'predicted':>12} {'measured':>12}  roles")
        for c in m["candidates"]:
            mark = " <- picked" if c["weights"] == list(getattr(plan, ph).weights) else ""
            meas = format_rate(c["measured_Bps"]) if c["measured_Bps"] else "-"
            lines.append(f"  {':'.join(map(str, c['weights'])):>14} {format_rate(c['predicted_Bps']):>12} {meas:>12}  "
                         f"{', '.join(c['roles'])}{mark}")
        if m["picked_by"] == "measured":
            lines.append(f"  picked {':'.join(map(str, getattr(plan, ph).weights))} by measurement: "
                         f"{format_rate(m['throughput_Bps'])} (median of {m['n']}, spread {m['spread_pct']:.1f} %), "
                         f"prediction {m['error_pct']:+.1f} %")
        else:
            lines.append(f"  no round of {ph} completed within the budget: kept the model's "
                         f"{':'.join(map(str, getattr(plan, ph).weights))}")
    lines.append(f"plan written to {path}")
    return "\n".join(lines) + "\n"


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""

    @app.command("autotune")
    def autotune_cmd(
        rig: Optional[str] = RigOption,
        bench: Optional[str] = typer.Option(None, "--bench", metavar="RESULT", help="iobench result file (default: newest in rig/bench)."),
        budget: float = typer.Option(DEFAULT_BUDGET_S, "--budget", help="Seconds for all the measuring (a trial that would overrun it is not started)."),
        seconds: float = typer.Option(DEFAULT_TRIAL_S, "--seconds", help="Seconds per measured trial."),
        warmup: float = typer.Option(WARMUP_S, "--warmup", help="Seconds each trial reads before its clock starts (a drive left idle may start fast)."),
        rest: float = typer.Option(REST_S, "--rest", help="Seconds without reads before each trial, so a rate limiter forgets the budget the previous trial left unused (0: none)."),
        top: int = typer.Option(DEFAULT_TOP, "--top", min=1, max=20, help="The model's best splits measured per phase (plus capability and equal weights)."),
        rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="At most this many rounds (default: as many as fit the budget)."),
        background: Optional[List[str]] = typer.Option(None, "--background", metavar="SOURCE:KIND", help="As `planner solve --background`."),
        lanes: int = typer.Option(PREFILL_LANES, "--lanes", min=1, max=64, help="Prefill pieces in flight per drive."),
        batch: Optional[int] = typer.Option(None, "--batch", min=1, max=64, help="Decode component reads issued together (default: one per component of an expert)."),
        threads: int = typer.Option(DECODE_THREADS, "--threads", min=1, max=256, help="Decode read threads over all sources."),
        fit_only: bool = typer.Option(False, "--fit-only", help="Solve with iobench's fitted models alone."),
        seed: int = typer.Option(0, "--seed", help="Seed of the random read offsets."),
        cached: bool = typer.Option(False, "--cached", help="Page-cache reads instead of cold reads (not a drive measurement)."),
        quiet: bool = QuietOption,
        json_out: bool = JsonOption,
    ):
        """Solve, then measure the best candidates with the split reader (ABBA, within --budget) and write the measured best as a plan."""
        from planner.constants import PREFILL_TOKENS
        from planner.plan import plan_to_dict
        from planner.rigmodel import choose_workload

        root = rig_dir(rig)
        # the rig's own model's reads, as `planner solve` plans them (ds4-v41 with a notice otherwise)
        chosen = choose_workload(root, DEFAULT_ENGINE, None, None, PREFILL_TOKENS, None, lanes, batch, threads)
        cancel = threading.Event()
        old = signal.getsignal(signal.SIGINT)

        def on_int(signum, frame):     # finish the running trial, keep what was measured; again to abort
            if cancel.is_set():
                signal.signal(signal.SIGINT, old)
                raise KeyboardInterrupt
            cancel.set()
            err.print("interrupt: stopping after this trial (again to abort)")

        def on_trial(t, arm):
            if not quiet:
                err.print(f"autotune: round {t.round + 1} {arm.phase} {':'.join(map(str, arm.weights))} "
                          f"({', '.join(arm.roles)}): {format_rate(t.Bps)}, predicted {format_rate(arm.predicted_Bps)}",
                          highlight=False, soft_wrap=True)

        signal.signal(signal.SIGINT, on_int)
        try:
            plan, path = autotune(root, bench, chosen.workload, tuple(background or ()), budget, seconds, top, rounds,
                                  not fit_only, seed, not cached, on_trial=on_trial, stop=cancel.is_set,
                                  geometry=chosen.geometry, warmup_s=warmup, rest_s=rest)
        finally:
            signal.signal(signal.SIGINT, old)
        if chosen.notice and not quiet:     # said once the plan is written, so a failing command says one line
            err.print(f"notice: {chosen.notice}", markup=False)
        if json_out:
            d = plan_to_dict(plan)
            d["path"] = path
            print_json(d)
        else:
            typer.echo(render(plan, path), nl=False)

    @app.command("tune")
    def tune_cmd(
        rig: Optional[str] = RigOption,
        bench: Optional[str] = typer.Option(None, "--bench", metavar="RESULT", help="iobench result file (default: newest in rig/bench)."),
        plan: Optional[str] = typer.Option(None, "--plan", metavar="PLAN", help="Plan to start from and reset to (default: the newest)."),
        seconds: float = typer.Option(TUNER_TRIAL_S, "--seconds", help="Seconds of the measuring key's trial."),
        fit_only: bool = typer.Option(False, "--fit-only", help="Use iobench's fitted drive models alone."),
        cached: bool = typer.Option(False, "--cached", help="Page-cache reads instead of cold reads (not a drive measurement)."),
    ):
        """Open the planner's split tuner with `m` measuring the weights on screen through the split reader."""
        from planner.tui.app import run_tuner

        if seconds <= 0:
            raise UsageError(f"--seconds {seconds:g}: give positive seconds")

        root = rig_dir(rig)

        def measure(state) -> float:
            m = SplitMeasure(rig_sources(root, state.sources), state.workloads, cold=not cached)
            return m(state.phase, state.weights(), seconds)

        run_tuner(root, bench, plan, calibrate=not fit_only, measure=measure)
