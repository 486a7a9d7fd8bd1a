"""The real-engine tuner's judgement (pure): candidates and trials in, the verdict out — medians over
the complete rounds, each arm's gates, the winner, its gains and the report (docs/harness.md, "Tuning
with the real engine"). `engine_bridge.tuning.real_engine` runs the engine and calls these.

Gates, per arm (a failed gate disqualifies the arm; it is kept in the report with the reason):
- the run: it exited cleanly within its timeout, `launch`'s confirmations passed (the profile was
  applied) and it printed a speed the engine's profile reads;
- output: every trial's output equal to the reference (the engine's default arm's first output, or
  the first arm's that printed one); a drift is shown beside the reference;
- state: nothing the engine keeps (its model directories) changed during the arm's trials;
- bytes: `launch`'s confirmation of the per-drive counters (every drive the profile gives bytes
  served some), and each drive's share of the bytes the engine's own counters report within
  `tolerance` of what the profile promised: between the shares the planner predicts for the
  candidate's two phases (a run mixes them in its own proportions); an engine without per-drive
  counters is judged on its speed alone, and the report says so.
The winner: the qualified arm with the best median tok/s; a non-default arm must beat the engine's
default by `min_gain_pct` or the default stays; the winner must then beat the runner-up again in a
confirmation run in reverse order (runner-up first), or no gain is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import ClassVar, Mapping, Sequence

from core.results import Document
from planner.autotune import round_order, spread_pct

PHASES = ("prefill", "decode")
DEFAULT_MIN_GAIN_PCT = 3.0
DEFAULT_SHARE_TOLERANCE = 0.15      # absolute share of the bytes per drive (0.15 = 15 points)
REPORT_SCHEMA = 1
REPORT_KIND = "engine-tune"


@dataclass(frozen=True)
class EngineArm:
    """One arm: what the engine is run with. weights None: the engine's default (no weights: it
    probes, or reads one drive). sources: the plan's sources it reads (indexes, primary first)."""
    label: str
    roles: tuple[str, ...]
    weights: tuple[int, ...] | None
    decode_weights: tuple[int, ...] | None = None
    mode: tuple[str, ...] = ()
    sources: tuple[int, ...] = ()
    predicted: Mapping[str, Mapping] = field(default_factory=dict)   # phase -> the planner's prediction
    default: bool = False                                             # the engine's own default arm
    profile: str = ""                                                 # the exported profile (.json)

    def phase_shares(self, n_sources: int) -> list[tuple[float, ...]]:
        """Each phase's predicted share of the bytes per plan source."""
        out = []
        for p in self.predicted.values():
            sh = [0.0] * n_sources
            for i, s in enumerate(p.get("sources") or ()):
                if i < len(self.sources):
                    sh[self.sources[i]] = float(s.get("share") or 0.0)
            if sum(sh) > 0:
                out.append(tuple(sh))
        return out

    def promise(self, n_sources: int, prompt: int | None = None, gen: int | None = None) -> tuple[float, ...] | None:
        """Each plan source's predicted share of the bytes over both phases; None when the planner
        predicts nothing for it (the engine's probe). The phases weigh by the bytes the prediction
        reads per token times the run's own tokens (`prompt`, `gen`; unknown: the prediction's)."""
        if not self.predicted:
            return None
        tot = [0.0] * n_sources
        run = {"prefill": prompt, "decode": gen}
        for ph, p in self.predicted.items():
            phase_bytes = float(p.get("throughput_Bps") or 0.0) * float(p.get("seconds") or 0.0)
            if run.get(ph) and p.get("tokens"):
                phase_bytes *= run[ph] / float(p["tokens"])
            for i, s in enumerate(p.get("sources") or ()):
                if i < len(self.sources):
                    tot[self.sources[i]] += float(s.get("share") or 0.0) * phase_bytes
        whole = sum(tot)
        return tuple(x / whole for x in tot) if whole > 0 else None


@dataclass(frozen=True)
class EngineRun:
    """One run of one arm. failed: '' or why the run does not count (timeout, crash, a confirmation,
    nothing readable); served: bytes per plan source from the engine's counters ({} none)."""
    arm: int
    round: int                      # -1: the confirmation
    tok_s: float | None
    seconds: float
    output: str | None = None
    served: Mapping[int, int] = field(default_factory=dict)
    failed: str = ""
    state_changed: tuple[str, ...] = ()
    prompt_tokens: int | None = None
    gen_tokens: int | None = None
    lines: tuple[str, ...] = ()
    run_dir: str = ""
    resolution: float | None = None     # tok/s: the step of the engine's printed speed
    wall_tok_s: float | None = None     # generated tokens over the engine process's wall seconds
    calibration: Mapping = field(default_factory=dict)   # what its own lines say it did (Engine.calibrate)

    def speed(self, wall: bool = False) -> float | None:
        return self.wall_tok_s if wall else self.tok_s


COARSE = 0.005       # a printed speed whose step is above this share of it cannot resolve the minimum gain


def too_coarse(trials: Sequence[EngineRun]) -> bool:
    """The engine prints its speed too coarsely for these runs (colibri's one decimal at 0.7 tok/s is
    7 %): the tuner then times the engine's process instead (generated tokens over its wall seconds)."""
    return any(t.resolution and t.tok_s and t.resolution / t.tok_s > COARSE for t in trials if not t.failed)


def abba(n: int, rnd: int, active: Sequence[bool]) -> list[int]:
    """Round `rnd`'s order over the arms still in the running: forward on even rounds, backward on odd
    (the embedded tuner's order, planner.autotune.round_order)."""
    return [i for i in round_order(n, rnd) if active[i]]


def shares(served: Mapping[int, int], n: int) -> tuple[float, ...] | None:
    tot = sum(served.get(i, 0) for i in range(n))
    return tuple(served.get(i, 0) / tot for i in range(n)) if tot > 0 else None


def predicted_tok_s(c: EngineArm, kind: str, prompt: int | None, gen: int | None, e2e: bool = False) -> float | None:
    """The planner's prediction in the engine's own figure: reads alone (the priced read time), or
    with `e2e` end to end (reads and the engine's compute, `planner.world.e2e`; None when the
    prediction has no compute): 'decode', a decoded token's seconds; 'run', the generated tokens
    over the prompt's and their seconds, each phase's seconds per token from its prediction."""
    from planner.world import run_seconds

    key = "e2e_seconds" if e2e else "seconds"
    if e2e and any(key not in (c.predicted.get(ph) or {}) for ph in PHASES):
        return None
    if kind == "decode":
        seconds = run_seconds({"decode": c.predicted.get("decode") or {}}, 0, 1, key)
        return 1.0 / seconds if seconds else None
    seconds = run_seconds(c.predicted, prompt or 0, gen or 0, key)
    return gen / seconds if seconds else None


def arm_gate(c: EngineArm, trials: Sequence[EngineRun], reference: str | None, n_sources: int,
             tolerance: float, counters: bool) -> str:
    """'' when every trial of the arm passes the gates, else the first reason it does not."""
    for t in trials:
        if t.failed:
            return t.failed
        if t.state_changed:
            return f"engine state changed during the run: {', '.join(t.state_changed[:3])}"
        if reference is not None and t.output is not None and t.output != reference:
            return f"output drifted: {_short(t.output)} where the reference is {_short(reference)}"
        if reference is not None and t.output is None:
            return "printed no output to compare with the reference"
        if counters and len(c.sources) > 1:
            if not t.served:
                return "no per-drive counters from the engine in this run"
            hull, seen = c.phase_shares(n_sources), shares(t.served, n_sources)
            promise = c.promise(n_sources, t.prompt_tokens, t.gen_tokens)
            if hull and seen is not None:     # None: counters too coarse for the bytes read
                # the run's bytes mix the phases in proportions of its own: each drive's share lies
                # between the phases' predicted shares
                bad = [i for i in range(n_sources) if seen[i] < min(h[i] for h in hull) - tolerance
                       or seen[i] > max(h[i] for h in hull) + tolerance]
                if bad:
                    return (f"per-drive bytes contradict the profile: shares {_fmt(seen)} where it promised "
                            f"{_fmt(promise)} (tolerance {tolerance:.2f})")
    return ""


def _fmt(xs) -> str:
    return "/".join(f"{x:.2f}" for x in xs)


def _short(s: str, n: int = 48) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[:n] + "..."


@dataclass(frozen=True)
class ArmResult:
    label: str
    roles: tuple[str, ...]
    runs: tuple[float, ...]             # tok/s of the arm's trials in the complete rounds
    median: float | None
    spread_pct: float
    qualified: bool
    why: str                            # '' or why the arm is out
    predicted: float | None             # tok/s the planner's prediction gives in the engine's figure
    error_pct: float | None             # predicted over measured - 1, %
    promise: tuple[float, ...] | None
    measured_shares: tuple[float, ...] | None
    predicted_e2e: float | None = None  # tok/s end to end: the reads and the engine's compute
    error_e2e_pct: float | None = None  # predicted_e2e over measured - 1, %


@dataclass(frozen=True)
class TuningVerdict:
    arms: tuple[ArmResult, ...]
    complete_rounds: tuple[int, ...]
    reference: str | None
    winner: int | None                  # the arm picked (None: nothing qualified)
    runner_up: int | None
    default: int | None
    equal: int | None
    best: int | None                    # the best median, before the minimum gain and the confirmation
    why: str                            # how the winner was picked
    gain_over_default_pct: float | None
    gain_over_equal_pct: float | None
    confirmation: tuple[float | None, float | None]   # (challenger, runner-up) medians in the confirmation
    confirmed: bool | None              # None: no confirmation was run
    challenger: int | None = None       # the arm the confirmation ran against the runner-up (the winner before it)


def reference_output(cands: Sequence[EngineArm], trials: Sequence[EngineRun]) -> str | None:
    """The output every arm must print: the engine default's first, else the first arm's that printed one."""
    ok = [t for t in trials if not t.failed and t.output is not None]
    for t in ok:
        if cands[t.arm].default:
            return t.output
    return ok[0].output if ok else None


def judge(cands: Sequence[EngineArm], trials: Sequence[EngineRun], n_sources: int, speed_kind: str, counters: bool,
          min_gain_pct: float = DEFAULT_MIN_GAIN_PCT, tolerance: float = DEFAULT_SHARE_TOLERANCE,
          wall: bool = False) -> TuningVerdict:
    """The verdict on every trial so far (the confirmation's trials have round -1); `wall`: speeds
    from the engine process's wall time rather than its printed tok/s."""
    reference = reference_output(cands, trials)
    rounds = [t for t in trials if t.round >= 0]
    gates = {i: arm_gate(c, [t for t in trials if t.arm == i], reference, n_sources, tolerance, counters)
             for i, c in enumerate(cands)}
    ran = {i for i in gates if any(t.arm == i for t in rounds)}
    # an arm no gate failed counts, run or not: a round that did not reach it (the budget) is not complete
    qualified = [i for i in range(len(cands)) if not gates[i]]
    by_round: dict[int, dict[int, float]] = {}
    for t in rounds:
        if t.arm in qualified and t.speed(wall) is not None:
            by_round.setdefault(t.round, {})[t.arm] = t.speed(wall)
    complete = tuple(sorted(r for r, got in by_round.items() if all(i in got for i in qualified)))
    prompt = _mid([t.prompt_tokens for t in rounds if t.prompt_tokens])
    gen = _mid([t.gen_tokens for t in rounds if t.gen_tokens])
    results = []
    for i, c in enumerate(cands):
        runs = tuple(by_round[r][i] for r in complete if i in by_round.get(r, {}))
        med = float(median(runs)) if runs else None
        pred = predicted_tok_s(c, speed_kind, prompt, gen)
        pe2e = predicted_tok_s(c, speed_kind, prompt, gen, e2e=True)
        mine = [t for t in rounds if t.arm == i and t.served]
        seen = shares({k: sum(t.served.get(k, 0) for t in mine) for k in range(n_sources)}, n_sources) if mine else None
        why = gates[i] if i in ran else "not run (the budget ended first)"
        results.append(ArmResult(c.label, c.roles, runs, med, spread_pct(runs), i in qualified and med is not None, why,
                                 pred, 100.0 * (pred / med - 1.0) if pred and med else None,
                                 c.promise(n_sources, prompt, gen), seen,
                                 pe2e, 100.0 * (pe2e / med - 1.0) if pe2e and med else None))
    default = next((i for i, c in enumerate(cands) if c.default), None)
    equal = next((i for i, c in enumerate(cands) if "equal" in c.roles), None)
    ok = [i for i, a in enumerate(results) if a.qualified]
    ranked = sorted(ok, key=lambda i: (-results[i].median, i))
    best = ranked[0] if ranked else None
    winner, why = best, ""
    if best is None:
        why = "no arm qualified in a complete round"
    elif default is not None and results[default].qualified and best != default:
        gain = 100.0 * (results[best].median / results[default].median - 1.0)
        if gain < min_gain_pct:
            winner, why = default, (f"the best, {results[best].label}, gains {gain:+.1f} % over the engine's default, "
                                    f"below the {min_gain_pct:g} % a non-default arm must gain")
        else:
            why = f"gains {gain:+.1f} % over the engine's default (at least {min_gain_pct:g} %)"
    elif best == default:
        why = "the engine's default measured best"
    else:
        why = "the best median (the engine's default did not qualify)"
    runner = None
    if winner is not None:
        rest = [i for i in ranked if i != winner]
        runner = rest[0] if rest else None
    conf = [t for t in trials if t.round < 0 and not t.failed and t.speed(wall) is not None]
    cw = _mid([t.speed(wall) for t in conf if t.arm == winner])
    cr = _mid([t.speed(wall) for t in conf if t.arm == runner])
    confirmed, challenger = None, winner
    if conf and winner is not None and runner is not None:
        conf_gate = arm_gate(cands[winner], [t for t in trials if t.round < 0 and t.arm == winner], reference,
                             n_sources, tolerance, counters)
        confirmed = bool(cw is not None and cr is not None and cw > cr and not conf_gate)
        if not confirmed and winner != default and default is not None and results[default].qualified:
            why += f"; not confirmed in reverse order ({_rate(cw)} vs {_rate(cr)} tok/s): the engine's default stays"
            winner = default
        elif not confirmed:
            why += f"; not confirmed in reverse order ({_rate(cw)} vs {_rate(cr)} tok/s)"

    def gain(over):
        if winner is None or over is None or not results[over].qualified:
            return None
        return 100.0 * (results[winner].median / results[over].median - 1.0)

    return TuningVerdict(tuple(results), complete, reference, winner, runner, default, equal, best, why, gain(default),
                   gain(equal), (cw, cr), confirmed, challenger)


def _mid(xs):
    xs = [x for x in xs if x is not None]
    return median(xs) if xs else None


def _rate(x) -> str:
    return "-" if x is None else f"{x:.2f}"


# ---------------------------------------------------------------------------------------------
# The report


class EngineTuneReport(Document):
    """`autotune --binary --json`: the report's document (`report_dict`)."""

    KIND: ClassVar[str] = REPORT_KIND
    SCHEMA: ClassVar[int] = REPORT_SCHEMA

def report_dict(cands: Sequence[EngineArm], trials: Sequence[EngineRun], v: TuningVerdict, settings: Mapping) -> dict:
    """The report's JSON (REPORT_SCHEMA, kind 'engine-tune'): settings, the arms (candidate,
    prediction, gates, medians, spreads, per-drive counters), every trial, the verdict."""
    return {
        "schema": REPORT_SCHEMA, "kind": REPORT_KIND, **dict(settings),
        "arms": [{"label": c.label, "roles": list(c.roles), "weights": list(c.weights) if c.weights else None,
                  "decode_weights": list(c.decode_weights) if c.decode_weights else None, "mode": list(c.mode),
                  "sources": list(c.sources), "default": c.default, "profile": c.profile,
                  "predicted_tok_s": a.predicted, "median_tok_s": a.median, "runs_tok_s": list(a.runs),
                  "spread_pct": a.spread_pct, "error_pct": a.error_pct, "qualified": a.qualified, "why": a.why,
                  "predicted_e2e_tok_s": a.predicted_e2e, "error_e2e_pct": a.error_e2e_pct,
                  "promised_shares": list(a.promise) if a.promise else None,
                  "measured_shares": list(a.measured_shares) if a.measured_shares else None}
                 for c, a in zip(cands, v.arms)],
        "trials": [{"arm": t.arm, "round": t.round, "tok_s": t.tok_s, "wall_tok_s": t.wall_tok_s, "seconds": t.seconds,
                    "failed": t.failed,
                    "output": t.output, "served": {str(k): b for k, b in t.served.items()},
                    "state_changed": list(t.state_changed), "lines": list(t.lines), "run_dir": t.run_dir,
                    "calibration": dict(t.calibration)}
                   for t in trials],
        "complete_rounds": list(v.complete_rounds),
        "reference_output": v.reference,
        "verdict": {"winner": v.winner, "runner_up": v.runner_up, "default": v.default, "equal": v.equal,
                    "best": v.best, "why": v.why, "gain_over_default_pct": v.gain_over_default_pct,
                    "gain_over_equal_pct": v.gain_over_equal_pct, "confirmation_tok_s": list(v.confirmation),
                    "confirmed": v.confirmed, "challenger": v.challenger},
    }


def report_lines(doc: Mapping) -> list[str]:
    """The report as text lines (the command prints them; report.md holds them): one row per arm,
    then the verdict."""
    arms = doc["arms"]
    v = doc["verdict"]
    wall = bool(doc.get("speed_from_wall"))
    complete = set(doc.get("complete_rounds") or ())
    line = {i: _mid([t["tok_s"] for t in doc.get("trials") or () if t["arm"] == i and t["round"] in complete
                     and not t["failed"]]) for i in range(len(arms))}
    out = [f"engine {doc.get('engine')} ({doc.get('binary')}): {len(arms)} arms, {len(doc['complete_rounds'])} complete "
           f"round(s) in {doc.get('wall_s', 0):.0f} s (budget {doc.get('budget_s', 0):.0f} s"
           + (", interrupted)" if doc.get("interrupted") else ")"),
           f"measured by: {doc.get('measured_by')}; speed: {doc.get('speed')}",
           f"state: {doc.get('state')}",
           f"{'arm':<28} {'roles':<34} {'pred tok/s':>10} {'e2e tok/s':>9} {'median':>8} {'spread':>7} {'reads err':>9} "
           f"{'e2e err':>8}" + (f" {'its line':>8}" if wall else "") + "  shares (promised -> measured)  gates"]
    for i, a in enumerate(arms):
        mark = winner_mark(i, v)
        sh = ("-" if not a["measured_shares"] else
              f"{_fmt(a['promised_shares']) if a['promised_shares'] else 'probe'} -> {_fmt(a['measured_shares'])}")
        out.append(f"{a['label']:<28} {', '.join(a['roles'])[:34]:<34} {_num(a['predicted_tok_s']):>10} "
                   f"{_num(a.get('predicted_e2e_tok_s')):>9} "
                   f"{_num(a['median_tok_s']):>8} {a['spread_pct']:>6.1f}% {_pct(a['error_pct']):>9} "
                   f"{_pct(a.get('error_e2e_pct')):>8}"
                   + (f" {_num(line[i]):>8}" if wall else "") + f"  {sh}  "
                   f"{'ok' if a['qualified'] else 'OUT: ' + a['why']}{mark}")
    w = v["winner"]
    kept = w is not None and v.get("best") is not None and v["best"] != w and w == v.get("default")
    out.append(f"{'kept' if kept else 'winner'}: {arms[w]['label'] if w is not None else 'none'} ({v['why']})")
    if kept:
        out.append(f"measured best: {arms[v['best']]['label']} (its gain is not confirmed)")
    out.append(f"winner's measured gain over the engine's default: {_pct(v['gain_over_default_pct'])}; over equal "
               f"weights: {_pct(v['gain_over_equal_pct'])}")
    if v["confirmed"] is not None:
        cw, cr = v["confirmation_tok_s"]
        ru = arms[v["runner_up"]]["label"] if v["runner_up"] is not None else "-"
        ch = arms[v["challenger"]]["label"] if v.get("challenger") is not None else "-"
        out.append(f"confirmation, runner-up first: {ch} {_num(cw)} vs runner-up {ru} {_num(cr)} tok/s: "
                   f"{'confirmed' if v['confirmed'] else 'NOT confirmed'}")
    out.append(f"output identical on every qualified arm: {_short(doc['reference_output'] or 'none printed', 60)}")
    return out


def winner_mark(i: int, v: Mapping) -> str:
    """The verdict's mark on arm `i`: the winner where it measured best or was confirmed; where the
    engine's default stays because no gain was confirmed (below the minimum, or the reverse order
    did not hold), the default is marked as kept, not as a winner — it may be the slowest arm."""
    if i != v["winner"]:
        return ""
    if v.get("best") is not None and v["best"] != i and i == v.get("default"):
        return " <- kept (the engine's default: no gain confirmed)"
    return " <- winner"


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1f} %"
