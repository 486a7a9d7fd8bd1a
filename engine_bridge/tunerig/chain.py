"""`engine-bridge tune-rig`: from a model and its drives (or an existing rig) to a tuned profile,
doing only what is missing (docs/tune-rig.md).

replicas: copy the model to each drive that holds no replica of it yet (`replicas sync`: one read
fanned out, resumable from its journal), or, with no drives to copy to, a rig naming the model;
verify: every member against the rig's manifest (quick: a live stamp is trusted); then
`steps.plan_rig` — the measure, solve and export fleet's node job runs too —; tune: with the real
engine's binary, its ABBA trials within the budget (`engine_bridge.tuning.real_engine`).

Each step says what it does or reuses and why; each one records itself in rig/tune-rig.json when
it finishes, so a chain stopped by Ctrl-C is resumed by running it again.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Sequence

from core.errors import MismatchError, MissingError, UsageError, error_for
from core.events import Reporter
from core.rig import Rig, load_rig

from .constants import MISMATCH, REUSE, RESULT_KIND, RESULT_SCHEMA, RUN, SKIP
from .state import changed, key_of, load_state, save_step
from .settings import BenchSettings
from .steps import Planned, check_cancel, decide_export, decide_measure, decide_solve, plan_rig

DEFAULT_PROFILE = "tuned"


@dataclass(frozen=True)
class EngineTrials:
    """The real engine's trials (`autotune --binary`'s settings)."""
    binary: str
    args: tuple[str, ...] = ()
    budget_s: float = 300.0
    top: int = 2
    timeout_s: float = 600.0
    min_gain_pct: float = 3.0
    share_tolerance: float = 0.15
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class Request:
    rig: str                                  # the rig folder (made when it does not exist)
    model: str | None = None                  # the model (its file, a file of its split set, or its folder)
    drives: tuple[str, ...] = ()              # folders, one per drive, to hold a replica
    engine: str | None = None                 # default: the engine that reads the model
    profile: str = DEFAULT_PROFILE
    cache_experts: int | None = None
    verify: str = "quick"
    measure: str = "auto"                     # auto: reuse a result that covers the drives; always
    bench: BenchSettings = BenchSettings()
    piece_size: int = 64 << 20
    allow_same_device: bool = False
    allow_unverified: bool = False
    redo: bool = False                        # solve, export and tune again even when nothing changed
    trials: EngineTrials | None = None


@dataclass(frozen=True)
class StepLine:
    step: str
    action: str                               # RUN, REUSE or SKIP
    why: str
    seconds: float = 0.0


@dataclass(frozen=True)
class TuneRigResult:
    rig: str
    model: str
    engine: str
    steps: tuple[StepLine, ...]
    dry_run: bool = False
    bench: str = ""
    plan: str = ""
    profile: str = ""
    fallbacks: tuple[tuple[str, str], ...] = ()
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    weights: dict = field(default_factory=dict)     # {drive: {"prefill": w, "decode": w}}
    trials: dict | None = None                # the engine's trials: folder, winner, confirmed, profile
    seconds: float = 0.0

    KIND: ClassVar[str] = RESULT_KIND
    SCHEMA: ClassVar[int] = RESULT_SCHEMA

    def to_dict(self) -> dict:
        return {"rig": self.rig, "model": self.model, "engine": self.engine, "dry_run": self.dry_run,
                "steps": [{"step": s.step, "action": s.action, "why": s.why, "seconds": round(s.seconds, 3)}
                          for s in self.steps],
                "bench": self.bench, "plan": self.plan, "profile": self.profile,
                "fallbacks": {d: p for d, p in self.fallbacks},
                "predicted_tok_s": {"prefill": self.prefill_tok_s, "decode": self.decode_tok_s},
                "weights": self.weights, "engine_trials": self.trials, "seconds": round(self.seconds, 3)}


# ---- the replicas step ---------------------------------------------------------------------------

def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _members_in(rig: Rig, folder: str) -> list:
    return [m for m in rig.members if _same_dir(os.path.dirname(m.path.rstrip("/")), folder)]


def _whole(rig: Rig, member) -> bool:
    """Every file the member holds is there (what verify then checks)."""
    from models.modelset import ModelSet

    if not rig.files or rig.layout == "file":
        return os.path.isfile(member.path)
    model = ModelSet(member.path, rig.layout, rig.format, tuple(rig.files))
    return all(os.path.exists(model.abs(rel)) for rel in rig.files if member.holds_file(rel))


def decide_replicas(req: Request, rig: Rig) -> tuple[str, str, tuple[str, ...]]:
    """(action, why, the drive folders to copy to)."""
    if req.model and rig.model and not _same_dir(rig.model.path, req.model):
        raise UsageError(f"the rig at {rig.root} holds model {rig.model.path}, not {req.model}; give another --rig or "
                         "leave MODEL out")
    model = req.model or (rig.model.path if rig.model else None)
    if model is None:
        raise UsageError(f"the rig at {rig.root} has no model: give the MODEL (and the drives' folders)")
    todo, held = [], []
    for d in req.drives:
        if not os.path.isdir(d):
            raise MissingError(f"drive folder {d}: not a directory; mount the drive or make the folder")
        if _same_dir(d, os.path.dirname(os.path.abspath(model).rstrip("/"))):
            held.append(f"{d} (the model's own)")
            continue
        have = _members_in(rig, d)
        if have and all(_whole(rig, m) for m in have):
            held.append(f"{d} ({have[0].name})")
        else:
            todo.append(d)
    if todo:
        gone = [d for d in todo if _members_in(rig, d)]
        why = f"copy to {', '.join(todo)}" + (f" ({', '.join(gone)}: the replica is gone or incomplete)" if gone else "")
        return RUN, why + (f"; already there: {', '.join(held)}" if held else ""), tuple(todo)
    if rig.model is None:
        return RUN, f"a rig at {rig.root} naming {model}", ()
    if not req.drives:
        return SKIP, f"no drive folders given: the rig's {len(rig.members)} members as they are", ()
    return REUSE, f"every drive holds a replica: {', '.join(held)}", ()


def _replicas(req: Request, rig: Rig, todo: Sequence[str], report: Reporter, cancel) -> Rig:
    from core.errors import Interrupted
    from core.rig import save_rig, with_model
    from core.drives import drive_label
    from models.modelset import discover
    from replicas.sync import sync

    model = req.model or rig.model.path
    if not todo:                          # a rig naming the model, as `replicas init` writes it
        found = discover(model)
        save_rig(with_model(rig, found.path, drive_label(found.path), found.layout, found.format, found.files))
        return load_rig(req.rig, must_exist=False)
    try:
        res = sync(model, list(todo), req.rig, piece_size=req.piece_size, allow_same_device=req.allow_same_device,
                   report=report, cancel=cancel)
    except (Interrupted, KeyboardInterrupt):
        raise Interrupted("the copy stopped; its durable pieces are kept: run the same command again to resume") from None
    bad = [d for d in res.dests if d.exit_code]
    if bad:
        d = max(bad, key=lambda x: x.exit_code)
        text = f"copy to {d.target} {d.outcome}: {d.error or 'see `replicas status`'}"
        raise error_for(d.exit_code, text)
    return load_rig(req.rig, must_exist=False)


# ---- the chain -----------------------------------------------------------------------------------

def _engine(req: Request, rig: Rig) -> str:
    from engine_bridge.moe.inputs import member_model
    from engines.registry import engine_for_model, get_engine

    if req.engine:
        get_engine(req.engine)
        return req.engine
    if rig.model is not None:
        m = member_model(rig.model.path, rig)
    else:
        from models.modelset import discover

        m = discover(req.model)
    return engine_for_model(m.format, m.layout, m.files)


def tune_inputs(req: Request, engine: str, bench: str, plan: str, cache: int | None) -> dict:
    t = req.trials
    if t is None:
        return {}
    try:
        st = os.stat(t.binary)
        binary = [os.path.realpath(t.binary), st.st_size, st.st_mtime_ns]
    except OSError:
        binary = [t.binary]
    return ({"binary": binary, "args": list(t.args), "budget": t.budget_s, "top": t.top, "timeout": t.timeout_s,
                   "min_gain": t.min_gain_pct, "tolerance": t.share_tolerance, "prompt_tokens": t.prompt_tokens,
                   "engine": engine, "bench": os.path.basename(bench), "plan": plan, "cache": cache})


def decide_tune(req: Request, rig: Rig, inputs: dict) -> tuple[str, str, dict]:
    key = key_of(inputs)
    if req.trials is None:
        return SKIP, "no --binary: the profile is the planner's (give the engine's binary to run its trials)", {}
    rec = load_state(rig).get("tune") or {}
    if req.redo:
        return RUN, "asked to run the trials again", {}
    if rec.get("key") == key and os.path.isfile(os.path.join(rec.get("folder", ""), "report.json")):
        return REUSE, (f"{os.path.basename(rec['folder'])} ran this binary with these arguments and budget on this "
                       "plan and measurement"), rec
    return RUN, (f"{changed(rec, inputs)} changed since the last trials" if rec.get("key")
                 else "no trials of this chain yet"), {}


def _tune(req: Request, rig: Rig, engine: str, planned: Planned, cache, say_line: Callable[[str], None],
          cancel) -> tuple[str, str, dict]:
    from core.errors import Interrupted
    from engine_bridge.tuning.judge import report_lines
    from engine_bridge.tuning.real_engine import tune_with_engine

    inputs = tune_inputs(req, engine, planned.measured.path, planned.solved.path, cache)
    action, why, rec = decide_tune(req, rig, inputs)
    if action != RUN:
        return action, why, rec
    t = req.trials
    doc, folder = tune_with_engine(rig.root, t.binary, engine, list(t.args), t.budget_s, t.top, t.timeout_s,
                                   t.min_gain_pct, t.share_tolerance, planned.measured.path, None, t.prompt_tokens,
                                   cache, req.allow_unverified, on_event=say_line,
                                   stop=cancel.is_set if cancel is not None else None)
    for line in report_lines(doc):
        say_line(line)
    if doc.get("interrupted"):
        raise Interrupted(f"the engine's trials stopped (kept in {folder}); run the same command again to run them anew")
    v = doc["verdict"]
    w = v.get("winner")
    rec = {"key": key_of(inputs), "inputs": inputs, "folder": folder, "profile": os.path.join(folder, "winner.env"),
           "winner": doc["arms"][w]["label"] if w is not None else None, "confirmed": v.get("confirmed"),
           "why": v.get("why", ""), "gain_over_default_pct": v.get("gain_over_default_pct")}
    save_step(rig, "tune", rec)
    return RUN, why, rec


def tune_rig(req: Request, *, say: Callable[[StepLine], None] | None = None, say_line: Callable[[str], None] | None = None,
             report: Reporter = None, cancel: threading.Event | None = None) -> TuneRigResult:
    """Run the chain (see the module docstring). `say` gets each step's line when the step is
    done; `say_line` the engine trials' lines. Raises: MismatchError when a replica differs from
    the manifest (exit 1), MissingError when a member is gone (exit 3), the steps' own errors;
    Interrupted after the step a first Ctrl-C (`cancel`) landed in."""
    say = say or (lambda s: None)
    say_line = say_line or (lambda s: None)
    t0 = time.monotonic()
    lines: list[StepLine] = []
    clock = [time.monotonic()]

    def done(step: str, action: str, why: str) -> None:
        now = time.monotonic()
        line = StepLine(step, action, why, now - clock[0])
        clock[0] = now
        lines.append(line)
        say(line)

    rig = load_rig(req.rig, must_exist=False)
    action, why, todo = decide_replicas(req, rig)
    if action == RUN:
        rig = _replicas(req, rig, todo, report, cancel)
    done("replicas", action, why)
    check_cancel(cancel, "the replicas")

    from replicas.manifests import load_manifest

    manifest = load_manifest(rig, required=False)
    if manifest is None:         # a rig named the model and nothing hashed it yet: verify has nothing to check against
        raise MissingError(f"the rig at {rig.root} has no manifest yet: give a drive folder to copy the model to "
                           "(the copy hashes it), or run `replicas sync`")
    engine = _engine(req, rig)
    verified = _verify(rig, req, report, cancel)
    done("verify", RUN, f"{len(verified.members)} members identical to the manifest ({req.verify}"
                        + (": a live stamp is trusted)" if req.verify == "quick" else ": every byte read)"))
    check_cancel(cancel, "verify")
    planned = plan_rig(rig, manifest, engine, profile=req.profile, bench=req.bench, measure=req.measure,
                       cache_experts=req.cache_experts, allow_unverified=req.allow_unverified, redo=req.redo,
                       say=done, report=report, cancel=cancel)
    check_cancel(cancel, "export")
    cache = req.cache_experts if req.cache_experts is not None else planned.solved.plan.priced_cache
    action, why, rec = _tune(req, rig, engine, planned, cache, say_line, cancel)
    done("tune", action, why)
    plan = planned.solved.plan
    weights = {s.name: {"prefill": plan.prefill.weights[i], "decode": plan.decode.weights[i]}
               for i, s in enumerate(plan.sources)}
    trials = None
    if rec:
        trials = {k: rec.get(k) for k in ("folder", "profile", "winner", "confirmed", "why", "gain_over_default_pct")}
    return TuneRigResult(rig.root, rig.model.path, engine, tuple(lines), bench=planned.measured.path,
                         plan=planned.solved.path, profile=planned.exported.profile, fallbacks=planned.exported.fallbacks,
                         prefill_tok_s=plan.prefill.predicted.get("tok_s"), decode_tok_s=plan.decode.predicted.get("tok_s"),
                         weights=weights, trials=trials, seconds=time.monotonic() - t0)


def _verify(rig: Rig, req: Request, report: Reporter, cancel):
    from .steps import verify_rig

    v = verify_rig(rig, None, "", req.verify, report=report, cancel=cancel)
    if v.status == MISMATCH:
        raise MismatchError("; ".join(v.problems))
    if v.status != "ok":
        raise MissingError("; ".join(v.problems) + ": bring the drive back, or give its folder to copy the model there "
                           "again")
    return v


# ---- --dry-run -----------------------------------------------------------------------------------

def dry_run(req: Request) -> TuneRigResult:
    """The steps the chain would take and why, reading the rig and the drives, writing nothing. A
    step that would run makes the ones after it run (their inputs would be new)."""
    from replicas.manifests import load_manifest

    from .steps import export_inputs, solve_inputs

    rig = load_rig(req.rig, must_exist=False)
    lines = []
    action, why, todo = decide_replicas(req, rig)
    lines.append(StepLine("replicas", action, why))
    engine = _engine(req, rig)
    fresh = rig.model is None or load_manifest(rig, required=False) is None
    if fresh:
        lines.append(StepLine("verify", RUN, "the members the copy makes (read back cold by the copy itself)"))
        lines.append(StepLine("measure", RUN, "no iobench result of this rig yet"))
    else:
        manifest = load_manifest(rig)
        lines.append(StepLine("verify", RUN, f"{len(rig.members)} members against the manifest ({req.verify})"))
        copied = [m.name for d in todo for m in _members_in(rig, d)]
        choice, previous = decide_measure(rig, manifest, req.measure, copied)
        lines.append(StepLine("measure", choice.action, choice.why))
    up = lines[-1].action == RUN or lines[0].action == RUN and todo
    rec = load_state(rig)
    cache = req.cache_experts
    if up or fresh:
        lines.append(StepLine("solve", RUN, "the measurement will be new"))
        lines.append(StepLine("export", RUN, "the plan will be new"))
    else:
        from iobench.result import result_files

        bench = result_files(rig)[-1]
        action, why, plan_path = decide_solve(rig, solve_inputs(rig, manifest, bench, engine, req.cache_experts), req.redo)
        lines.append(StepLine("solve", action, why))
        if action == RUN:
            lines.append(StepLine("export", RUN, "the plan will be new"))
        else:
            from planner.plans import load_plan

            plan = load_plan(plan_path)
            cache = req.cache_experts if req.cache_experts is not None else plan.priced_cache
            action, why, _ = decide_export(rig, export_inputs(rig, plan_path, engine, req.profile, cache,
                                                              req.allow_unverified), req.redo)
            lines.append(StepLine("export", action, why))
    if req.trials is None:
        lines.append(StepLine("tune", SKIP, decide_tune(req, rig, {})[1]))
    elif lines[-1].action == RUN:
        lines.append(StepLine("tune", RUN, f"the profile will be new: the engine's trials within {req.trials.budget_s:g} s"))
    else:
        from iobench.result import result_files

        plan_path = (rec.get("solve") or {}).get("plan", "")
        action, why, _ = decide_tune(req, rig, tune_inputs(req, engine, result_files(rig)[-1], plan_path, cache))
        lines.append(StepLine("tune", action, why))
    return TuneRigResult(rig.root, req.model or (rig.model.path if rig.model else ""), engine, tuple(lines), dry_run=True)

