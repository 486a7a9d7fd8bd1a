"""Tuning with the real engine (`engine-bridge autotune --binary PATH`, docs/harness.md "Tuning with
the real engine"): the planner's candidates for the rig's model, each exported as the engine's
profile, run by the engine itself in ABBA order within a time budget, judged by the engine's own
counters and timing (`engine_bridge.tuning.judge`).

Candidates: the planner's best few (`planner.autotune.arms_for`: its pick and alternatives, each of
the engine's modes at the pick's weights — colibri's stripes on and off — capability-proportional
and equal weights), the engine's default (its profile's `default_environment`: colibri's startup
probe, no weights; an engine that takes no replicas without weights runs the primary alone) and
the fastest drive alone. Each arm is one fresh process started by `launch` (clean environment +
profile, confirmed from its log) after the model's files are dropped from the page cache, with the
engine's learned state frozen (its profile's `frozen_state`) and its model directories checked
unchanged afterwards.

Nothing here knows an engine by name: its profile reads its lines (`read_run`) and says what it
keeps and how it runs by default.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable, Mapping, Sequence

from core.constants import RUNS_DIR
from core.errors import Interrupted, MismatchError, UsageError
from core.fsutil import atomic_write_text
from core.jsonfile import write_json
from core.platform import drop_cached
from core.rig import load_rig
from engines.pattern import PHASES
from engines.registry import get_engine

from .judge import (
    DEFAULT_MIN_GAIN_PCT,
    DEFAULT_SHARE_TOLERANCE,
    EngineArm,
    EngineRun,
    TuningVerdict,
    abba,
    arm_gate,
    COARSE,
    judge,
    reference_output,
    report_dict,
    report_lines,
    too_coarse,
)

DEFAULT_BUDGET_S = 300.0
DEFAULT_TOP = 2                  # the planner's best candidates run (besides the modes, capability, equal, default, alone)
DEFAULT_TIMEOUT_S = 600.0        # one arm, s (also cut to what is left of the budget)


# ---------------------------------------------------------------------------------------------
# Candidates

def _label(weights, mode) -> str:
    return ":".join(map(str, weights)) + (f" {'+'.join(sorted(mode))}" if mode else "")


def candidates(rig_root: str, engine: str, bench: str | None = None, top: int = DEFAULT_TOP,
               prompt_tokens: int | None = None, cache_experts: int | None = None, calibrate: bool = True,
               args: Sequence[str] = (), env: Mapping[str, str] | None = None):
    """(the solved plan, the candidates): solved as `planner solve` does for the rig's model, in the
    engine's world (`planner.rigmodel.world_problem`: its cache from its arguments `args` and
    environment `env` or its last run's lines, the page cache the RAM this process runs under
    leaves it — every arm starts cold, so only re-reads within a run can hit —, the calibration's
    loads in flight and compute), the planner's arms grouped into candidates, plus the engine's
    default and the fastest drive alone. The engine's default comes first (the reference output is
    its)."""
    from planner.autotune import arms_for
    from planner.plans import load_inputs
    from planner.rigmodel import world_problem, world_provenance
    from planner.solve import Pricer, problem_prediction, solve_plan

    from .embedded import reads_key

    inputs = load_inputs(rig_root, bench, calibrate=calibrate)
    kw = {"prompt_tokens": prompt_tokens} if prompt_tokens else {}
    chosen, problem, world = world_problem(rig_root, inputs, engine, cache_experts=cache_experts, page_cache_bytes=None,
                                           engine_args=args, env=env, **kw)
    if chosen.why is not None:
        raise UsageError(f"autotune --binary runs {engine} on the rig's own model, and {chosen.why}; give the rig a model "
                         "its drives hold (`replicas init --model PATH`)")
    plan, choice = solve_plan(inputs.sources, problem, inputs.provenance, top=max(top, 1))
    plan = replace(plan, geometry=chosen.geometry, workload=dict(chosen.workload.as_dict(), engine=engine, idle=choice.idle),
                   provenance={**plan.provenance, **world_provenance(engine, chosen, world)})
    pricer = Pricer(problem)
    joint = not problem.engine.phase_weights
    phases = tuple(ph for ph in PHASES if problem.phases[ph].steps)
    n = len(inputs.sources)

    def predict(ph, w, m):
        return problem_prediction(problem, pricer.price(ph, w, m), w, m)

    arms = arms_for(choice, top, joint=joint, key=reads_key(problem), predict=predict, phases=phases)
    out = _joint_arms(arms, n) if joint else _phase_arms(arms, n, phases)
    out, left = prune_calibrated(out, prompt_tokens or chosen.workload.traffic.prompt_tokens)
    if left:
        plan = replace(plan, provenance={**plan.provenance, "arms_left_out": left})
    # the fastest drive alone, priced on its own
    caps = choice.baselines[phases[0]]["capability"]["weights"]
    fast = max(range(n), key=lambda i: (caps[i], -i))
    alone = _alone(problem, inputs.sources, fast, ("fastest drive alone",))
    if get_engine(engine).profile.default_environment(()) is not None:       # the engine probes its drives itself
        first = EngineArm("engine default (probe)", ("engine default",), None, None, (), tuple(range(n)), {}, default=True)
        return plan, [first] + out + [alone]
    if fast == 0:
        return plan, [replace(alone, roles=("engine default", "fastest drive alone"), default=True)] + out
    primary = replace(_alone(problem, inputs.sources, 0, ("engine default",)), default=True)
    return plan, [primary] + out + [alone]


PRUNE_BELOW = 0.7      # an alternative predicted under this share of the pick's tok/s end to end is not run
KEPT_ROLES = ("model #1", "equal", "capability")   # the pick and the baselines the verdict's gains are over


def prune_calibrated(arms: Sequence[EngineArm], prompt: int, gen: int = 16) -> tuple[list[EngineArm], list[dict]]:
    """With a calibrated problem (predictions end to end), the alternatives the planner predicts
    far slower than its pick (under PRUNE_BELOW of it, end to end, over `prompt` and `gen` tokens)
    are left out, so the loop runs fewer arms; the pick and the baselines always run. Without
    end-to-end predictions every arm stays. Returns (the arms, those left out with why)."""
    from .judge import predicted_tok_s

    def e2e(a):
        return predicted_tok_s(a, "run", prompt, gen, e2e=True)

    pick = next((a for a in arms if "model #1" in a.roles), None)
    best = e2e(pick) if pick is not None else None
    if not best:
        return list(arms), []
    kept, left = [], []
    for a in arms:
        p = e2e(a)
        if any(r in KEPT_ROLES for r in a.roles) or p is None or p >= PRUNE_BELOW * best:
            kept.append(a)
        else:
            left.append({"label": a.label, "roles": list(a.roles), "predicted_e2e_tok_s": p,
                         "why": f"predicted {100 * (1 - p / best):.0f} % slower than the pick end to end "
                                f"(the engine's calibration; the loop runs those within {100 * (1 - PRUNE_BELOW):.0f} %)"})
    return kept, left


def _joint_arms(arms, n: int) -> list[EngineArm]:
    """An engine with one weight vector for both phases: one candidate per (weights, switches),
    with each phase's prediction."""
    out: list[EngineArm] = []
    seen: dict = {}
    for a in arms:
        k = (a.weights, a.mode)
        if k not in seen:
            seen[k] = len(out)
            out.append(EngineArm(_label(a.weights, a.mode), a.roles, a.weights, None, tuple(sorted(a.mode)),
                                 tuple(range(n)), {a.phase: dict(a.prediction)}))
        else:
            c = out[seen[k]]
            out[seen[k]] = replace(c, predicted={**c.predicted, a.phase: dict(a.prediction)})
    return out


def _phase_arms(arms, n: int, phases) -> list[EngineArm]:
    """An engine with weights per phase: one candidate per role the planner gave both phases (its
    pick, alternatives, capability, equal), merged where the weights of both phases are the same."""
    out: list[EngineArm] = []
    merged: dict = {}
    for role in dict.fromkeys(r for a in arms for r in a.roles):
        got = {a.phase: a for a in arms if role in a.roles}
        p, d = got.get("prefill") or got.get("decode"), got.get("decode") or got.get("prefill")
        k = (p.weights, d.weights)
        if k in merged:
            c = out[merged[k]]
            out[merged[k]] = replace(c, roles=c.roles + (role,))
            continue
        merged[k] = len(out)
        label = _label(p.weights, ()) + ("" if d.weights == p.weights else f" / {_label(d.weights, ())}")
        out.append(EngineArm(label, (role,), p.weights, d.weights, (), tuple(range(n)),
                             {ph: dict(a.prediction) for ph, a in (("prefill", p), ("decode", d)) if ph in got or
                              ph in phases}))
    return out


def _alone(problem, sources, i: int, roles: tuple[str, ...]) -> EngineArm:
    """Source `i` alone (weight 1), priced on its own."""
    from planner.rigmodel import arm_predictions

    return EngineArm(f"{sources[i].name} alone", roles, (1,), None, (), (i,),
                     arm_predictions(problem, [i], (1,)))


def arm_plan(plan, c: EngineArm):
    """The candidate as a plan: the solved plan over the arm's sources, with its weights (the
    engine's default: 1 each) and switches. A value export takes; never written to a file."""
    from planner.plan import Phase, Source

    srcs = tuple(Source(plan.sources[i].name, plan.sources[i].path) for i in c.sources)
    w = c.weights or (1,) * len(srcs)
    dw = c.decode_weights or w
    return replace(plan, sources=srcs, prefill=Phase(tuple(w), dict(c.predicted.get("prefill") or {})),
                   decode=Phase(tuple(dw), dict(c.predicted.get("decode") or {})), switches=frozenset(c.mode))


def export_candidates(rig_root: str, plan, cands: Sequence[EngineArm], folder: str, engine: str,
                      cache_experts: int | None = None, allow_unverified: bool = False) -> list[EngineArm]:
    """Each candidate's plan (`arm_plan`) exported as the engine's profile (folder/profiles/armK.env
    + .json) by `engine-bridge export`'s own checks (`export_arm`), without the N-1 profiles: an arm
    is a trial, and only the winner's are written (each is a full re-solve of the rig's model)."""
    os.makedirs(os.path.join(folder, "profiles"), exist_ok=True)
    out = []
    for k, c in enumerate(cands):
        env_path = os.path.join(folder, "profiles", f"arm{k + 1}.env")
        json_path = export_arm(rig_root, c, arm_plan(plan, c), env_path, f"arm{k + 1}", engine, cache_experts,
                               allow_unverified)
        out.append(replace(c, profile=json_path))
    return out


def export_arm(rig_root: str, c: EngineArm, plan, env_path: str, name: str, engine: str,
               cache_experts: int | None = None, allow_unverified: bool = False, fallbacks: bool = False) -> str:
    """The candidate's plan exported as the engine's profile at `env_path` (and its .json, whose
    path is returned); with `fallbacks`, its N-1 profiles beside it. The engine's default is the
    profile over the same drives with the variables its profile's `default_environment` drops moved
    to the unset lines."""
    from engine_bridge.profiles.export import export_profile, load_profile, write_profile

    r = export_profile(rig_root=rig_root, plan=plan, fmt=engine, name=name, cache_experts=cache_experts,
                       output=env_path, allow_unverified=allow_unverified, fallbacks=fallbacks)
    json_path = r.files[-1]
    if c.weights is None:
        q = load_profile(json_path)
        env = get_engine(engine).profile.default_environment(q.environment)
        dropped = tuple(k for k, _ in q.environment if k not in dict(env))
        write_profile(replace(q, environment=tuple(env), unset=tuple(dict.fromkeys(q.unset + dropped))), engine, env_path)
    return json_path


# ---------------------------------------------------------------------------------------------
# One arm

def _dirs(paths: Sequence[str]) -> list[str]:
    return sorted({p if os.path.isdir(p) else os.path.dirname(p) for p in paths})


def fingerprint(dirs: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Every file at the top of the model directories: (bytes, mtime ns). An engine that learns from
    a run (colibri's .coli_usage) changes it."""
    out = {}
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            try:
                st = os.stat(os.path.join(d, n))
            except OSError:
                continue
            out[os.path.join(d, n)] = (st.st_size, st.st_mtime_ns)
    return out


def evict(paths: Sequence[str]) -> None:
    """Drop the models' files from the page cache (clean pages; no root needed): every arm starts cold."""
    for d in paths:
        files = [os.path.join(d, n) for n in os.listdir(d)] if os.path.isdir(d) else [d]
        for f in files:
            if os.path.isfile(f):
                fd = os.open(f, os.O_RDONLY)
                try:
                    drop_cached(fd)
                finally:
                    os.close(fd)


def run_arm(binary: str, c: EngineArm, args: Sequence[str], run_dir: str, timeout: float, inherited: Mapping[str, str],
            engine: str, round_: int) -> EngineRun:
    """One fresh run of the engine with the arm's profile; its verdict on the run, the engine's reading."""
    from engine_bridge.profiles.export import load_profile
    from engine_bridge.profiles.launch import launch_arm

    prof = get_engine(engine).profile
    p = load_profile(c.profile)
    paths = (p.primary,) + tuple(p.replicas)
    before = fingerprint(_dirs(paths))
    evict(paths)
    t0 = time.monotonic()
    try:
        r = launch_arm(binary, c.profile, list(args), run_dir=run_dir, timeout=timeout, inherited=inherited)
    except OSError as e:
        return EngineRun(-1, round_, None, time.monotonic() - t0, failed=f"could not start {binary}: {e.strerror or e}",
                     run_dir=run_dir)
    with open(r.stdout_path, encoding="utf-8", errors="replace") as f:
        stdout = f.read()
    with open(r.stderr_path, encoding="utf-8", errors="replace") as f:
        stderr = f.read()
    reading = prof.read_run(stdout, stderr, p.variant)
    # launch's record: the engine's lines, and what launch measured of the run (its peak memory, the
    # bytes the drives served it, whether it read through the page cache, the RAM it ran under)
    cal = dict(r.calibration)
    after = fingerprint(_dirs(paths))
    changed = tuple(sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)))
    rc = r.returncode
    failed = ""
    if rc is None:
        failed = f"hung past the arm's timeout ({timeout:.0f} s): killed"
    elif rc < 0:
        failed = f"crashed: killed by signal {-rc}" + (f" ({r.engine_said})" if r.engine_said else "")
    elif rc != 0:
        failed = f"crashed: exit code {rc}" + (f": {r.engine_said}" if r.engine_said else "")
    elif not r.ok:
        failed = "not confirmed: " + "; ".join(f"{x.name}: {x.detail}" for x in r.confirmations if not x.ok)
    elif reading.tok_s is None:
        failed = "printed nothing the tuner can read (no speed line the engine's profile knows)"
    served = {c.sources[d]: b for d, b in reading.served.items() if d < len(c.sources)}
    wall = reading.gen_tokens / r.seconds if reading.gen_tokens and r.seconds > 0 else None
    return EngineRun(-1, round_, reading.tok_s, r.seconds, reading.output, served, failed, changed, reading.prompt_tokens,
                     reading.gen_tokens, tuple(reading.lines), run_dir, reading.resolution, wall, cal)


# ---------------------------------------------------------------------------------------------
# The loop

def tune_with_engine(rig_root: str, binary: str, engine: str | None = None, args: Sequence[str] = (),
                     budget_s: float = DEFAULT_BUDGET_S, top: int = DEFAULT_TOP, timeout_s: float = DEFAULT_TIMEOUT_S,
                     min_gain_pct: float = DEFAULT_MIN_GAIN_PCT, tolerance: float = DEFAULT_SHARE_TOLERANCE,
                     bench: str | None = None, rounds: int | None = None, prompt_tokens: int | None = None,
                     cache_experts: int | None = None, allow_unverified: bool = False,
                     inherited: Mapping[str, str] | None = None, on_event: Callable[[str], None] | None = None,
                     stop: Callable[[], bool] | None = None, clock=time.monotonic) -> tuple[dict, str]:
    """Run the candidates on the real engine in ABBA rounds within `budget_s`, then the winner
    against the runner-up in reverse order; write the report (report.json, report.md), the
    winning profile (winner.env/.json) into rig/runs/engine-tune-TIME/ and the plan with the
    engine's figures into rig/plans. Returns (the report dict, its folder).

    A trial starts only when what is left of the budget holds the longest trial so far plus two
    more (the confirmation); an arm's run is stopped after `timeout_s` or what is left of the budget.
    An arm that fails a gate is not run again. `stop()` true (Ctrl-C) ends the run before the next
    trial; a KeyboardInterrupt during a trial kills the engine and drops that trial. Refused before
    any run: a missing or non-executable binary, a budget that is not positive. No complete round:
    the report is written and the command fails (MismatchError when no arm qualified, UsageError
    when the budget ended first, Interrupted when interrupted)."""
    from engine_bridge.profiles.export import load_profile
    from engine_bridge.profiles.launch import read_binary, which

    say = on_event or (lambda msg: None)
    if budget_s <= 0 or timeout_s <= 0:
        raise UsageError(f"--budget {budget_s:g} / --timeout {timeout_s:g}: give positive seconds")
    binary = which(binary)
    read_binary(binary)                      # one line for a missing or non-executable binary
    rig = load_rig(rig_root, must_exist=False)
    engine = engine or _rig_engine(rig)
    prof = get_engine(engine).profile
    if prof is None or not hasattr(prof, "read_run"):
        raise UsageError(f"{engine} has no profile whose lines the tuner reads")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder = os.path.join(rig.root, RUNS_DIR, f"engine-tune-{stamp}")
    os.makedirs(folder, exist_ok=True)
    env = dict(os.environ if inherited is None else inherited)
    plan, cands = candidates(rig_root, engine, bench, top, prompt_tokens, cache_experts, args=args, env=env)
    cands = export_candidates(rig_root, plan, cands, folder, engine, cache_experts, allow_unverified)
    variant = load_profile(cands[0].profile).variant
    frozen, state_note = prof.frozen_state(variant)
    env.update(frozen)
    say(f"{len(cands)} arms: " + ", ".join(f"{k + 1} {c.label}" for k, c in enumerate(cands)))
    for x in plan.provenance.get("arms_left_out") or ():
        say(f"left out: {x['label']}: {x['why']}")

    runs = _ArmRuns(cands, len(plan.sources), binary, args, folder, env, engine, budget_s, timeout_s, tolerance,
                    say, stop, clock)
    runs.rounds(rounds)
    speed_kind = _speed_kind(prof, variant)
    wall = too_coarse(runs.trials)
    v = judge(cands, runs.trials, runs.n_sources, speed_kind, runs.counters_seen, min_gain_pct, tolerance, wall)
    if runs.confirm(v):
        v = judge(cands, runs.trials, runs.n_sources, speed_kind, runs.counters_seen, min_gain_pct, tolerance, wall)

    settings = {"engine": engine, "binary": os.path.abspath(binary), "args": list(args), "budget_s": budget_s,
                "timeout_s": timeout_s, "min_gain_pct": min_gain_pct, "share_tolerance": tolerance, "top": top,
                "wall_s": clock() - runs.start, "interrupted": runs.interrupted, "stopped_by_budget": runs.stopped,
                "frozen_env": frozen, "state": state_note, "speed_kind": speed_kind, "speed_from_wall": wall,
                "speed": ("generated tokens over the engine process's wall seconds (its printed tok/s is too coarse "
                          f"for these runs: a step over {100 * COARSE:g} % of it)" if wall else
                          "the engine's own tok/s line"),
                "measured_by": ("the engine's tok/s and its per-drive byte counters" if runs.counters_seen else
                                "the engine's tok/s alone: it printed no per-drive counters"),
                "plan_sources": [{"name": s.name, "path": s.path} for s in plan.sources],
                "arms_left_out": list(plan.provenance.get("arms_left_out") or ())}
    cal = run_calibration(runs.trials, v.winner if v.winner is not None else v.default)
    if cal and not cal.get("compute_s"):
        cal = {**cal, "arms": arm_speeds(cands, runs.trials, [a.qualified for a in v.arms])}
    if cal:
        settings["engine_calibration"] = cal
    doc = _write_report(folder, report_dict(cands, runs.trials, v, settings))
    if v.winner is not None:
        win = cands[v.winner]
        # the winner's profile again, beside the report, now with its N-1 profiles (winner.without-DRIVE),
        # which its provenance names relative to it
        doc["winner_profile"] = export_arm(rig_root, win, arm_plan(plan, win),
                                           os.path.join(folder, "winner.env"), f"arm{v.winner + 1}", engine,
                                           cache_experts, allow_unverified, fallbacks=True)
        doc["plan"] = _save_winner(rig, plan, win, _summary(folder, engine, win, v, settings, doc), engine, cal)
    if not v.complete_rounds or v.winner is None:
        raise _no_winner(runs, v, folder, budget_s)
    return doc, folder


def _rig_engine(rig) -> str:
    """The engine that reads the rig's model (the tuner's default)."""
    from engine_bridge.moe.inputs import member_model
    from engines.registry import engine_for_model

    if not rig.model:
        raise UsageError("the rig has no model; give it one (`replicas init --model PATH`) or --engine")
    m = member_model(rig.model.path, rig)
    return engine_for_model(m.format, m.layout, m.files)


class _ArmRuns:
    """The arms' runs in ABBA rounds within the budget, then the confirmation: every trial kept in
    order, which arms are still in, and why the runs ended (`interrupted`: Ctrl-C; `stopped`: the
    budget). A trial starts only when what is left of the budget holds the longest trial so far
    plus `reserve` more (two during the rounds: the confirmation's)."""

    def __init__(self, cands: Sequence[EngineArm], n_sources: int, binary: str, args: Sequence[str], folder: str,
                 env: Mapping[str, str], engine: str, budget_s: float, timeout_s: float, tolerance: float,
                 say: Callable[[str], None], stop: Callable[[], bool] | None, clock):
        self.cands, self.n_sources, self.binary, self.args, self.folder = cands, n_sources, binary, args, folder
        self.env, self.engine, self.budget_s, self.timeout_s, self.tolerance = env, engine, budget_s, timeout_s, tolerance
        self.say, self.stop, self.clock = say, stop or (lambda: False), clock
        self.trials: list[EngineRun] = []
        self.active = [True] * len(cands)
        self.start = clock()
        self.longest = 0.0
        self.interrupted = self.stopped = self.counters_seen = False

    def fits(self, reserve: int) -> bool:
        return self.clock() - self.start + self.longest * (1 + reserve) <= self.budget_s

    def run(self, i: int, rnd: int) -> EngineRun | None:
        """One fresh run of arm `i` (round `rnd`, -1: the confirmation); None when Ctrl-C stopped it."""
        left = self.budget_s - (self.clock() - self.start)
        where = f"round {rnd + 1}" if rnd >= 0 else "confirmation"
        self.say(f"arm {i + 1} of {len(self.cands)} ({self.cands[i].label}), {where}; "
                 f"{self.clock() - self.start:.0f}/{self.budget_s:.0f} s")
        run_dir = os.path.join(self.folder, f"{len(self.trials) + 1:03d}-arm{i + 1}")
        try:
            t = run_arm(self.binary, self.cands[i], self.args, run_dir, max(1.0, min(self.timeout_s, left)), self.env,
                        self.engine, rnd)
        except KeyboardInterrupt:
            self.interrupted = True
            self.say("interrupted: the running arm was stopped and dropped")
            return None
        t = replace(t, arm=i)
        self.trials.append(t)
        self.longest = max(self.longest, t.seconds)
        self.counters_seen = self.counters_seen or bool(t.served)
        self.say(f"  arm {i + 1}: " + (f"FAILED: {t.failed}" if t.failed else f"{t.tok_s:g} tok/s (its line; "
                                       f"{t.wall_tok_s or 0:.3f} by its wall time) in {t.seconds:.1f} s"))
        return t

    def rounds(self, rounds: int | None) -> None:
        """ABBA rounds over the arms still in (an arm that fails a gate is not run again) until
        `rounds` are done, the budget would be overrun, or Ctrl-C."""
        rnd = 0
        while not self.interrupted and not self.stopped and (rounds is None or rnd < rounds):
            order = abba(len(self.cands), rnd, self.active)
            if not order:
                break
            for i in order:
                if self.stop():
                    self.interrupted = True
                    break
                if self.trials and not self.fits(2):
                    self.stopped = True
                    break
                if self.run(i, rnd) is None:
                    break
                ref = reference_output(self.cands, self.trials)
                why = arm_gate(self.cands[i], [t for t in self.trials if t.arm == i], ref, self.n_sources,
                               self.tolerance, self.counters_seen)
                if why:
                    self.active[i] = False
                    self.say(f"  arm {i + 1} is out: {why}")
            rnd += 1

    def confirm(self, v: TuningVerdict) -> bool:
        """The winner against the runner-up in reverse order (the runner-up first), as far as the
        budget goes; whether it ran (the verdict is then to be judged again)."""
        if self.interrupted or v.winner is None or v.runner_up is None:
            return False
        w, r = v.winner, v.runner_up
        for i in (r, w, w, r):
            if self.stop() or not self.fits(0) or self.run(i, -1) is None:
                break
        return True


def _write_report(folder: str, doc: dict) -> dict:
    """report.json and report.md in the run folder; the report with its folder and lines."""
    lines = report_lines(doc)
    write_json(os.path.join(folder, "report.json"), doc, indent=2)
    atomic_write_text(os.path.join(folder, "report.md"), "# engine-tune report\n\n```\n" + "\n".join(lines) + "\n```\n")
    return {**doc, "folder": folder, "lines": lines}


def _summary(folder: str, engine: str, win: EngineArm, v: TuningVerdict, settings: Mapping, doc: Mapping) -> dict:
    """What the saved plan's provenance keeps of the trials (`engine_trials`)."""
    return {"report": os.path.join(folder, "report.json"), "engine": engine, "winner": win.label,
            "why": v.why, "gain_over_default_pct": v.gain_over_default_pct,
            "gain_over_equal_pct": v.gain_over_equal_pct, "confirmed": v.confirmed, "measured_by": settings["measured_by"],
            "arms": [{"label": a["label"], "roles": a["roles"], "predicted_tok_s": a["predicted_tok_s"],
                      "median_tok_s": a["median_tok_s"], "spread_pct": a["spread_pct"],
                      "error_pct": a["error_pct"], "predicted_e2e_tok_s": a.get("predicted_e2e_tok_s"),
                      "error_e2e_pct": a.get("error_e2e_pct"), "qualified": a["qualified"], "why": a["why"]}
                     for a in doc["arms"]]}


def run_calibration(trials, arm: int | None) -> dict:
    """The calibration the next solve uses (docs/planner.md "Calibrated by the engine's own
    lines"): the arm's runs' records (the winner's, else the default's; else any arm's), each
    figure the median over them. {} when no run printed lines the engine's module reads."""
    ok = [t for t in trials if t.calibration and not t.failed]
    mine = [t for t in ok if t.arm == arm] or ok
    if not mine:
        return {}
    out = _median_record(mine)
    if not out.get("buffered"):
        # what the page cache served the buffered arms under the same RAM: the share the next solve
        # may count on for a buffered mode (planner.world.measured_hits), which a winner reading with
        # O_DIRECT cannot tell
        buffered = [t for t in ok if t.calibration.get("buffered") and isinstance(t.calibration.get("storage_bytes"), int)]
        if buffered:
            out["buffered_run"] = {k: v for k, v in _median_record(buffered).items()
                                   if k in ("buffered", "bytes_read", "storage_bytes", "ram_bytes", "runs", "window",
                                            "tokens", "prompt_tokens", "cache_per_layer")}
    return out


def arm_speeds(cands, trials, qualified) -> list[dict]:
    """Each qualified arm with weights of ours, as the planner prices it, and its median tok/s by
    the engine's own line: what the next solve infers the engine's compute from when its lines
    give none (`planner.rigmodel.arms_compute`)."""
    out = []
    for i, (c, ok) in enumerate(zip(cands, qualified)):
        speeds = [t.tok_s for t in trials if t.arm == i and not t.failed and t.tok_s]
        if ok and c.weights is not None and speeds:
            out.append({"label": c.label, "weights": list(c.weights),
                        "decode_weights": list(c.decode_weights) if c.decode_weights else None,
                        "mode": list(c.mode), "sources": list(c.sources), "tok_s": _mid(speeds), "runs": len(speeds)})
    return out


def _median_record(runs) -> dict:
    """The last run's record with each number the median over `runs`, and how many they were."""
    out = dict(runs[-1].calibration)
    for k, v in out.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [t.calibration[k] for t in runs if isinstance(t.calibration.get(k), (int, float))]
            med = _mid(vals)
            out[k] = round(med) if isinstance(v, int) else med
    out["runs"] = len(runs)
    return out


def _mid(xs):
    from statistics import median

    return median(xs) if xs else None


def _save_winner(rig, plan, win: EngineArm, summary: dict, engine: str = "", cal: dict | None = None) -> str:
    """The solved plan at the winner's weights and switches (when it ran every source with weights;
    else the solved plan as it was), with the trials in its provenance and the engine's calibration
    from its own lines (`engine_calibration`, which the next solve uses), saved into rig/plans."""
    from planner.plan import Phase
    from planner.plans import load_plan, save_plan
    from planner.rigmodel import calibration_entry

    out = plan
    if win.weights is not None and len(win.sources) == len(plan.sources):
        out = replace(plan, prefill=Phase(tuple(win.weights), dict(win.predicted.get("prefill") or {})),
                      decode=Phase(tuple(win.decode_weights or win.weights), dict(win.predicted.get("decode") or {})),
                      switches=frozenset(win.mode))
    prov = {**out.provenance, "engine_trials": summary}
    if cal:
        prov["engine_calibration"] = calibration_entry(engine, (plan.geometry or {}).get("path") or "", cal)
    path = save_plan(rig, replace(out, provenance=prov))
    load_plan(path)
    return path


def _no_winner(runs: _ArmRuns, v: TuningVerdict, folder: str, budget_s: float) -> Exception:
    """Why the tuner has no result: interrupted before a complete round, no arm qualified, or the
    budget ended first (the report is written either way)."""
    where = f"; report in {folder}"
    if runs.interrupted:
        return Interrupted("autotune --binary: interrupted before a complete round" + where)
    if runs.trials and not any(a.qualified for a in v.arms) and all(not a for a in runs.active):
        return MismatchError("autotune --binary: no arm qualified: "
                             + "; ".join(f"{c.label}: {a.why}" for c, a in zip(runs.cands, v.arms)) + where)
    return UsageError(f"autotune --binary: no complete round of the arms within --budget {budget_s:g} s (a round "
                      f"is {len(runs.cands)} runs; the longest took {runs.longest:.0f} s); give a larger --budget" + where)


def _speed_kind(prof, variant: str) -> str:
    """What the engine's speed counts, as its profile reads it (from any run's lines)."""
    return prof.read_run("", "", variant).speed_kind


def render(doc: Mapping) -> str:
    lines = list(doc.get("lines") or report_lines(doc))
    lines.append(f"report: {doc.get('folder')}/report.md (and report.json)")
    if doc.get("winner_profile"):
        lines.append(f"winning profile: {doc['winner_profile']}; plan: {doc.get('plan')}")
    return "\n".join(lines) + "\n"

