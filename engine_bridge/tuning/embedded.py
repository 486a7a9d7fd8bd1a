"""The measured tuner with our own split reader (`engine-bridge autotune` without --binary, and the
tuner's `m` key): solve, then measure the best candidates by executing the engine's read pattern
through the split reader, and keep the measured best. (The real engine's own trials are
`engine_bridge.tuning.real_engine`.)

Why this lives here and not in `planner`: a measured candidate has to be read by the real split
reader (`engine_bridge.reader.SplitReader`, what the embedded engine reads with), and the planner
sits below engine_bridge (core <- engines <- replicas <- iobench <- planner <- engine_bridge).
iobench's trials keep each drive's lanes busy on their own and have no barrier across drives, so
they cannot measure what a split delivers. The planner keeps the logic, pure and tested
(`planner.autotune`: candidates, ABBA order, the budget, the pick, the measured plan); this
module supplies the reads (`PatternMeasure`: the target engine's own read pattern, executed as the
embedded engine executes it) and the host's clock. No engine is named here: the `Problem` carries
the engine, and the engine says its pattern, its concurrency and its modes.
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np

from core.constants import RUNS_DIR
from core.errors import Interrupted, UsageError
from core.rig import load_rig
from core.units import format_rate
from engines.pattern import PHASES, Concurrency
from engines.registry import DEFAULT_ENGINE
from planner.autotune import DEFAULT_BUDGET_S, DEFAULT_TOP, DEFAULT_TRIAL_S

TUNER_TRIAL_S = 2.0             # the tuner's measuring key: one short trial, s
WARMUP_S = 0.5                  # a trial's reads before its clock starts, s (`timed_rate`)
# No reads for this long before a trial (`PatternMeasure`), s: a rate limiter then forgets what the
# previous trial left unused. The testbed's (blk-throttle, what cgroup io.max applies) keeps up to
# two 100 ms slices of a drive's unused budget while reads keep coming; a drive the previous
# trial left partly idle then ran past its ceiling for the whole next trial (4:4:3 on the iops
# set: 594 and 592 MB/s after 4:3:3, 562 after itself or 0.3 s of rest; 0.15 s was not always
# enough). After two slices with nothing queued the limiter starts a fresh slice.
REST_S = 0.3


def reader_concurrency(conc: Concurrency, sources: int) -> tuple[int, int | None]:
    """(reader lanes per source, most reads outstanding at once or None) that keep the engine's
    reads in flight (`engines.pattern.Concurrency`): its lanes per drive; for a pool whose
    threads each take a whole read, the pool on every drive (one drive may hold every read) and
    the pool as the limit on reads; for a pool whose threads each take a piece, each drive's share
    of the pool when every drive holds as many pieces (`Concurrency.in_flight`)."""
    if conc.per_source is not None:
        return conc.per_source, (conc.shared if conc.per_read else None)
    if conc.shared is None:
        from engine_bridge.moe.constants import LANES

        return LANES, None
    if conc.per_read:
        return conc.shared, conc.shared
    return max(conc.in_flight([conc.shared] * max(1, sources))), None


class PatternMeasure:
    """Bytes/s the split reader delivers executing the target engine's read pattern of one phase,
    at some weights and mode, on these sources (each a copy of the model: a `ModelSet`, or a path,
    the model found there by `models.modelset.discover`), primary first.

    problem: the `planner.solve.Problem` the candidates were solved for: its engine (pattern,
    concurrency), the model's geometry, each phase's steps (`problem.phases[phase].steps`, the
    steps the prediction prices) and what each source's copy holds. A trial cycles through the
    phase's steps in an order shuffled once per phase by `seed` (every trial starts at the same
    place, so every candidate reads the same steps, and a short trial reads a fair sample of them
    rather than the first layers); each step's groups are issued and waited for as the embedded
    engine does (`staging.stage_reads`: a group's reads together, at most the engine's reads in
    flight, the next group once they have landed), with the engine's concurrency as reader lanes
    (`reader_concurrency`). Cold (O_DIRECT) reads unless `cold=False`, in every mode: the mode
    shapes the pattern (O_DIRECT windows, stripes), the measurement is of the drives.
    Each trial starts after `rest` seconds without reads (REST_S; `sleep` waits them) with the
    reader open, then reads `warmup` seconds uncounted (`timed_rate`, on `clock`).

    After a trial, `stats` holds the reader's counters of it (`ReaderStats`: per phase, the bytes
    and pieces each source was given and read) and `steps` the steps it executed, warm-up included.
    """

    def __init__(self, sources, problem, seed: int = 0, cold: bool = True, warmup: float = WARMUP_S,
                 rest: float = REST_S, sleep=time.sleep, clock=time.monotonic):
        from models.modelset import ModelSet, discover

        self.sources = [m if isinstance(m, ModelSet) else discover(str(m)) for m in sources]
        self.problem = problem
        self.cold, self.warmup = cold, warmup
        self.rest, self.sleep, self.clock = rest, sleep, clock
        rng = np.random.default_rng(seed)
        self.order = {ph: [int(i) for i in rng.permutation(len(problem.phases[ph].steps))]
                      for ph in PHASES if ph in problem.phases}
        self.stats = None
        self.steps: list = []

    def __call__(self, phase: str, weights, seconds: float, mode=frozenset(), sources=None) -> float:
        """Bytes/s at `weights` in `mode` over `seconds` after the rest and the warm-up
        (`timed_rate`); `sources`: a subset of the sources to read instead (one drive alone, say),
        weights to match (each must hold the whole model)."""
        from engine_bridge.moe.staging import PhaseCounters, StepReads, stage_reads
        from engine_bridge.reader.settings import ReaderSettings
        from engine_bridge.reader.split_reader import SplitReader
        from models.modelset import ModelSet

        p = self.problem
        engine = p.engine
        steps = p.phases[phase].steps if phase in p.phases else ()
        if not steps:
            raise UsageError(f"{phase}: the workload reads nothing in this phase (every expert it needs is cached); "
                             "nothing to measure")
        mode = engine.switches.check(mode, engine.name, option="mode")
        # a source given by path is the primary's model where that path keeps it
        models = self.sources if sources is None else [m if isinstance(m, ModelSet) else self.sources[0].at(str(m))
                                                        for m in sources]
        holds = p.holds if sources is None else ()
        lanes, in_flight = reader_concurrency(engine.concurrency(phase), len(models))
        # the pattern names the primary's files; a subset's first copy may call a one-file model otherwise
        rename = dict(zip(self.sources[0].files, models[0].files))
        weights = tuple(int(x) for x in weights)
        # a partial replica opens only the files it holds (the problem's holds, as the prediction prices it)
        with SplitReader(models, weights, weights, settings=ReaderSettings(lanes=lanes), engine=engine.name,
                         cold=self.cold, holds=holds) as r:
            reads_of = StepReads(engine, p.geometry, {phase: weights}, mode, holds, r.healthy)

            def submit(read, ph):
                f = rename.get(read.file, read.file)
                return r.submit_read(read if f == read.file else read._replace(file=f), ph)

            counters = PhaseCounters()
            order = self.order[phase]
            done: list = []

            def step() -> int:
                st = steps[order[len(done) % len(order)]]
                done.append(st)
                before = counters.bytes
                for _e, _bufs, release in stage_reads(submit, reads_of, p.geometry, st.layer, st.experts, phase,
                                                      counters, in_flight=in_flight):
                    release()
                return counters.bytes - before

            if self.rest > 0:
                self.sleep(self.rest)
            rate = timed_rate(step, seconds, self.warmup, self.clock)
            self.stats, self.steps = r.stats(), done
        return rate


def timed_rate(step, seconds: float, warmup: float = WARMUP_S, clock=time.monotonic) -> float:
    """Bytes/s of `step()` (one step of the engine's reads, its groups each waited for; returns its
    bytes) repeated: `warmup` seconds uncounted, then at least `seconds` measured as the
    least-squares slope of bytes done against the time each step ended (the first point: 0 bytes
    at the clock's start).

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


def reads_key(problem):
    """(phase, weights, mode) -> the engine's reads of the phase's steps (their patterns' groups):
    equal for candidates that read alike, which need measuring once."""
    from planner.solve import Pricer

    pricer = Pricer(problem)

    def key(phase, weights, mode):
        setup = pricer.setup(weights, mode)
        return tuple(problem.engine.pattern(problem.geometry, st, setup).groups for st in problem.phases[phase].steps)
    return key


def rig_sources(rig_root: str, sources) -> list:
    """Each plan source's copy of the model (`ModelSet`): where the rig member with that path keeps
    it (a split set or a directory as the rig describes it), else the file at that path."""
    from engine_bridge.moe.inputs import member_model

    rig = load_rig(rig_root, must_exist=False)
    return [member_model(s.path, rig) for s in sources]


def autotune(rig_root: str, bench: str | None = None, engine: str = DEFAULT_ENGINE, background: Sequence[str] = (),
             budget_s: float = DEFAULT_BUDGET_S, trial_s: float = DEFAULT_TRIAL_S, top: int = DEFAULT_TOP,
             rounds: int | None = None, calibrate: bool = True, seed: int = 0, cold: bool = True, measure=None,
             clock=time.monotonic, on_trial=None, stop=None, warmup_s: float = WARMUP_S, rest_s: float = REST_S,
             lanes: int | None = None, threads: int | None = None):
    """Solve for the rig's model and `engine`, measure the candidates within the budget, write the
    measured plan. Returns (the plan as written, its path).

    The problem is `planner solve`'s (`planner.rigmodel.rig_problem`: the rig's own model's reads,
    the bench result's drive models, links, what each copy holds), with the engine's concurrency
    overridden by `lanes`/`threads` (`planner.solve.with_concurrency`). The candidates come from the
    solver's `Choice` (`planner.autotune.arms_for`), each with its mode; an engine with one weight
    vector for both phases has each candidate measured on both and picked jointly.
    background: `--background` specs ('primary:engram', 'NAME:20%'); measure(phase, weights,
    seconds, mode) -> bytes/s (default: `PatternMeasure` on the rig's sources); stop() true: no
    further trial (the plan is written from what was measured); warmup_s: seconds each trial reads
    before its clock starts (`timed_rate`); rest_s: seconds without reads before each trial
    (REST_S); both are counted in the budget and in the rounds planned.

    Refused in one line (UsageError) before anything is solved or measured: a budget that fits no
    trial (less than `trial_s + warmup_s + rest_s`), and a rig whose model cannot be read (the
    measurement executes the engine's reads of that model's files). No plan is written when no
    trial was measured (Interrupted when `stop` ended the run first)."""
    from dataclasses import replace

    from planner.autotune import arms_for, measured_plan, pick, run_trials
    from planner.plans import load_inputs, load_plan, parse_background, plan_name, save_plan, utc_now, write_plan
    from planner.rigmodel import choose_workload, rig_problem
    from planner.solve import Pricer, prediction, solve_plan

    if budget_s <= 0 or trial_s <= 0 or warmup_s < 0 or rest_s < 0:
        raise UsageError(f"--budget {budget_s:g} / --seconds {trial_s:g} / --warmup {warmup_s:g} / --rest {rest_s:g}: "
                         "give positive seconds (the warm-up and the rest may be 0)")
    nominal = trial_s + warmup_s + rest_s
    if budget_s < nominal:
        raise UsageError(f"--budget {budget_s:g}: one trial takes {nominal:g} s (--seconds {trial_s:g} + --warmup "
                         f"{warmup_s:g} + --rest {rest_s:g}), so nothing would be measured; give --budget {nominal:g} "
                         "or more, or shorter trials")
    inputs = load_inputs(rig_root, bench, calibrate=calibrate)
    backgrounds = tuple(parse_background(b, [s.name for s in inputs.sources]) for b in background)
    chosen = choose_workload(rig_root, engine)
    if chosen.why is not None:
        raise UsageError(f"autotune measures {engine}'s reads of the rig's own model, and {chosen.why}; "
                         "give the rig a model its drives hold (`replicas init --model PATH`), or plan without "
                         "measuring (`planner solve`)")
    problem = rig_problem(inputs, chosen, engine, backgrounds, lanes, threads)
    plan, choice = solve_plan(inputs.sources, problem, inputs.provenance, top=max(top, 1))
    plan = replace(plan, geometry=chosen.geometry, workload=dict(chosen.workload.as_dict(), engine=engine, idle=choice.idle))
    pricer = Pricer(problem)
    joint = not problem.engine.phase_weights
    phases = tuple(ph for ph in PHASES if problem.phases[ph].steps)
    if not phases:
        raise UsageError(f"{chosen.workload.shape.name}: the workload reads nothing in either phase (every expert it "
                         "needs is cached); nothing to measure")

    def predict(ph, w, m):
        return prediction(pricer.price(ph, w, m), w, m, problem.drives)

    arms = arms_for(choice, top, joint=joint, key=reads_key(problem), predict=predict, phases=phases)
    measure = measure or PatternMeasure(rig_sources(rig_root, inputs.sources), problem, seed, cold, warmup=warmup_s,
                                        rest=rest_s)
    tally = run_trials(arms, lambda arm, s: measure(arm.phase, arm.weights, s, arm.mode), clock, budget_s, trial_s,
                       rounds, on_trial, stop, overhead_s=warmup_s + rest_s)
    if not tally.trials:
        if tally.interrupted:
            raise Interrupted("autotune: interrupted before any trial was measured; no plan written")
        raise UsageError(f"autotune: no trial fitted the budget ({budget_s:g} s); no plan written")
    settings = {"engine": engine, "budget_s": budget_s, "trial_s": trial_s, "warmup_s": warmup_s, "rest_s": rest_s,
                "top": top, "seed": seed, "cold": cold, "lanes": lanes, "threads": threads, "joint": joint,
                "reader": "engine_bridge.reader.SplitReader", "reads": "the engine's read pattern of each phase's steps"}
    out = measured_plan(plan, arms, tally, pick(arms, tally, joint), settings)
    rig = load_rig(rig_root, must_exist=False)
    if tally.interrupted:
        # Cut short: what was measured is kept for reading, but not as a plan `latest` would pick
        # up (export, run) as if the budget had been measured.
        path = write_plan(os.path.join(rig.subdir(RUNS_DIR), f"autotune-interrupted-{plan_name(utc_now())}"), out)
        raise Interrupted(f"autotune interrupted after {len(tally.trials)} trial(s); what was measured is in {path}, "
                          "not a plan in rig/plans: run it again for a plan")
    path = save_plan(rig, out)
    return load_plan(path), path


def render(plan, path: str) -> str:
    """Per phase: every candidate's prediction beside its measurement, the pick and its error (and,
    picked jointly, each candidate's objective)."""
    lines = []
    auto = plan.provenance.get("autotune", {})
    planned = auto.get("rounds_planned", 0)
    # the trials say how much of the last round the budget left out (rounds_done counts rounds begun)
    trials = f", {len(auto.get('trials', []))} of {planned * len(auto.get('arms', []))} trials"
    lines.append(f"autotune: {auto.get('rounds_done', 0)} of {planned} rounds{trials} in "
                 f"{auto.get('wall_s', 0):.0f} s (budget {auto.get('budget_s', 0):.0f} s"
                 + (", stopped by the budget)" if auto.get("stopped_by_budget") else
                    ", interrupted)" if auto.get("interrupted") else ")"))
    picked_mode = sorted(plan.switches)
    for ph in PHASES:
        m = getattr(plan, ph).measured
        if not m:
            continue
        joint = any("objective" in c for c in m["candidates"])
        lines.append(f"{ph}:")
        lines.append(f"  {'weights':>20} {'predicted':>12} {'measured':>12}" + (f" {'objective':>9}" if joint else "")
                     + "  roles")
        for c in m["candidates"]:
            mode = c.get("mode") or []
            mark = " <- picked" if c["weights"] == list(getattr(plan, ph).weights) and mode == picked_mode else ""
            meas = format_rate(c["measured_Bps"]) if c["measured_Bps"] else "-"
            obj = (f" {c['objective']:>9.4f}" if c.get("objective") is not None and c["objective"] != float("inf")
                   else f" {'-':>9}") if joint else ""
            lines.append(f"  {_label(c['weights'], mode):>20} {format_rate(c['predicted_Bps']):>12} {meas:>12}{obj}  "
                         f"{', '.join(c['roles'])}{mark}")
        here = _label(getattr(plan, ph).weights, picked_mode)
        if m["picked_by"] == "measured":
            how = ("jointly by measurement (least sum over phases of seconds / the phase's fastest)" if joint
                   else "by measurement")
            lines.append(f"  picked {here} {how}: {format_rate(m['throughput_Bps'])} (median of {m['n']}, spread "
                         f"{m['spread_pct']:.1f} %), prediction {m['error_pct']:+.1f} %")
            if m["n"] < 2:     # one trial per arm: a drive's noise decides as much as the split
                lines.append("  measured once per candidate: not confirmed by a second round; give a longer --budget "
                             "(or shorter --seconds) for a pick that a repeat backs")
        else:
            lines.append(f"  no round of {'every arm' if joint else ph} completed within the budget: kept the model's {here}")
    lines.append(f"plan written to {path}")
    return "\n".join(lines) + "\n"


def _label(weights, mode) -> str:
    return ":".join(map(str, weights)) + (f" {'+'.join(sorted(mode))}" if mode else "")


def tuner_measure(rig_root: str, seconds: float, cold: bool = True, **kw):
    """The tuner's measuring key (`engine-bridge tune`'s `m`): state -> bytes/s of one trial of
    `seconds` of the state's phase of its problem (`state.problem`, `state.phase`) at the weights
    and mode on screen (`state.weights()`, `state.mode`), on the rig's copies of the state's
    sources (`state.sources`), by `PatternMeasure` (`kw`: its other settings)."""
    def measure(state) -> float:
        m = PatternMeasure(rig_sources(rig_root, state.sources), state.problem, cold=cold, **kw)
        return m(state.phase, state.weights(), seconds, frozenset(state.mode or ()))
    return measure
