"""The workload a plan is solved for, found from the rig's model (the I/O around `planner.workload`).

By default the planner reads the rig's own model: its files from rig.toml
(`models.modelset.from_rig`), its geometry from their headers (`models.tensortable`), and
derives the workload from that. `--model PATH` reads another model's header instead (a header-only
copy will do) and `--workload NAME` plans a named workload (`ds4-v41`) without any model. When the
rig's model cannot be read (no rig.toml, a raw or missing file), the planner plans ds4-v41 and says
so: the notice names the model, why, and how to choose. `rig_problem` makes the solver's `Problem`
of a chosen workload on the rig's drives, the one `planner solve` and `engine-bridge autotune` solve.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Sequence

from core.errors import MissingError, UsageError
from core.rig import Rig, load_rig
from engines.registry import check_reads_model, get_engine
from models.formats import RAW
from models.modelset import FILE, discover, from_rig
from engines.base import Engine
from models.tensortable import inspect_model

from .constants import PREFILL_TOKENS, V41_NAME
from .drivecurves import Background
from .plan import Plan
from .plans import Inputs, SavedPlan, full_members_for, holds_of, load_inputs, load_plan, parse_background, save_plan
from .solve import Problem, recorded_concurrency, solve_plan, with_concurrency
from .workload import NAMED, ModelWorkload, model_workload, named_workload


@dataclass(frozen=True)
class Chosen:
    workload: ModelWorkload
    geometry: dict            # the plan's `geometry` block
    notice: str | None = None # said on stderr when the planner chose for the user
    why: str | None = None    # why the rig's model was not planned, when the planner chose a named workload


def choose_workload(rig_root: str, engine: str, name: str | None = None, model: str | None = None,
                    prompt_tokens: int = PREFILL_TOKENS, cache_experts: int | None = None) -> Chosen:
    """The workload for `planner solve/simulate`: `name` (a named workload), else `model`'s
    header, else the rig's model's, else ds4-v41 with a notice. A model the engine cannot read is
    refused in one line naming the engines that can (`Engine.reads_model`)."""
    if name:
        wl = named_workload(name)
        return Chosen(wl, _named_geometry(wl))
    if model:
        found = discover(model)
        g = inspect_model(found)           # one clear error line when it has no routed experts
    else:
        found = from_rig(load_rig(rig_root, must_exist=False))
        why = None
        if found is None:
            why = "the rig has no model (no rig.toml [model])"
        elif not all(os.path.isfile(p) for p in found.paths):
            why = f"the rig's model {found.path} is not on this machine"
        if why is None:
            try:
                if found.format == RAW and found.layout == FILE:
                    try:
                        found = discover(found.path)   # a rig from before formats were recorded: ask the file
                    except UsageError:
                        why = (f"the rig's model {found.path} is raw bytes (replicated with --format raw): "
                               "it has no GGUF or safetensors header to take the reads from")
                if why is None:
                    g = inspect_model(found)
            except (UsageError, MissingError) as e:   # unreadable, or no routed experts
                why = str(e)
        if why is not None:
            wl = named_workload(V41_NAME)
            return Chosen(wl, _named_geometry(wl), f"{why}; planning the named workload {V41_NAME} (DeepSeek V4.1 "
                                                   f"Flash's reads) — pass --workload {V41_NAME} to say so, or "
                                                   "--model PATH to plan another model from its header", why)
    check_reads_model(engine, found.format, found.layout, found.files, found.path)
    wl = model_workload(g, prompt_tokens, cache_experts)
    return Chosen(wl, g.as_dict())


def rig_problem(inputs: Inputs, chosen: Chosen, engine, backgrounds: tuple[Background, ...] = (),
                lanes: int | None = None, threads: int | None = None, page_cache_bytes: int = 0) -> Problem:
    """The problem `planner solve`, `simulate`, the tuner and autotune price: the engine (an `Engine`
    or its name; its reads in flight overridden by `lanes`/`threads`), the chosen workload's geometry
    and steps, the rig's drives and links, other work on the drives, for the rig's own model (not a
    named workload, not the fallback) what each source's copy holds, and the page cache's room."""
    g = chosen.workload.geometry
    holds = holds_of(inputs.sources, sorted({t.file for t in g.tensors})) if chosen.workload.name == "model" else ()
    e = get_engine(engine) if isinstance(engine, str) else engine
    return Problem(with_concurrency(e, lanes, threads), g, inputs.drives, chosen.workload.phases, tuple(backgrounds),
                   inputs.links, holds, page_cache_bytes)


def problem_for_rig(rig_root: str, bench: str | None, engine: str, backgrounds: Sequence[str] = (),
                    lanes: int | None = None, threads: int | None = None, workload: str | None = None,
                    model: str | None = None, prompt_tokens: int = PREFILL_TOKENS, cache_experts: int | None = None,
                    calibrate: bool = True, tails: bool = False,
                    page_cache_bytes: int = 0) -> tuple[Inputs, Chosen, Problem]:
    """(inputs, the chosen workload, the problem) of `planner solve` and `simulate`: the rig's bench
    result (`bench`, default the newest), the workload (`choose_workload`), other work given as
    `SOURCE:KIND` specs (`plans.parse_background`)."""
    # an engine that cannot read a partial replica plans the full members only (provenance.left_out)
    inputs, _ = full_members_for(load_inputs(rig_root, bench, calibrate=calibrate, tails=tails), get_engine(engine))
    names = [s.name for s in inputs.sources]
    chosen = choose_workload(rig_root, engine, workload, model, prompt_tokens, cache_experts)
    bgs = tuple(parse_background(s, names) for s in backgrounds)
    return inputs, chosen, rig_problem(inputs, chosen, engine, bgs, lanes, threads, page_cache_bytes)


def solve_rig(rig_root: str, bench: str | None, engine: str, backgrounds: Sequence[str] = (), top: int = 5,
              **problem) -> SavedPlan:
    """`planner solve`: solve the rig's problem (`problem_for_rig`'s options), record the workload
    in the plan, write it to rig/plans/<timestamp>.json and read it back (what a later command
    will load). The notices: the planner's choice of workload, and each source it leaves idle."""
    inputs, chosen, prob = problem_for_rig(rig_root, bench, engine, backgrounds, **problem)
    plan, choice = solve_plan(inputs.sources, prob, inputs.provenance, top=top)
    record = dict(chosen.workload.as_dict(), engine=engine, idle=choice.idle)
    plan = replace(plan, geometry=chosen.geometry, workload=record)
    path = save_plan(load_rig(rig_root, must_exist=False), plan)
    notices = ([chosen.notice] if chosen.notice else []) + [x["why"] for x in inputs.provenance.get("left_out", ())] \
        + [v["why"] for v in choice.idle.values()] + drive_limits(prob, plan.switches)
    return SavedPlan(load_plan(path), path, tuple(notices))


def drive_limits(problem, switches=frozenset()) -> list[str]:
    """The engine's own line when more drives cannot shorten its reads of this model (why, and
    what would: `Engine.drive_limit`), else nothing."""
    e = problem.engine
    why = e.drive_limit(problem.geometry, len(problem.drives), frozenset(switches)) if e.drive_limit else ""
    return [why] if why else []


def _named_geometry(wl: ModelWorkload) -> dict:
    s = wl.shape
    return {"name": s.name, "layers": s.layers, "experts": s.experts, "top_k": s.top_k, "arch": wl.geometry.arch,
            "component_bytes": s.component_bytes, "components": s.components, "expert_bytes": s.expert_bytes}


@dataclass(frozen=True)
class RigProblem:
    """What `planner whatif` starts from: `problem_for_rig`'s three, named (the rig's inputs, the
    workload chosen and the problem built of them)."""
    inputs: Inputs
    chosen: Chosen
    problem: Problem


# ---- a plan's problem, as it was solved -------------------------------------------------------

def plan_workload(rig: Rig, engine: str, plan: Plan | None) -> tuple[Chosen, bool]:
    """(the workload the plan was solved for, whether it is a named one): its named workload, or
    the other model it names, or the rig's model, with the plan's prompt and cache."""
    w = plan.workload if plan is not None else {}
    traffic = w.get("traffic") if isinstance(w.get("traffic"), dict) else {}
    prompt = traffic.get("prompt_tokens")
    cache = traffic.get("cache_experts")
    prompt = prompt if isinstance(prompt, int) and prompt >= 1 else PREFILL_TOKENS
    cache = cache if isinstance(cache, int) and cache >= 0 else None
    if w.get("name") in NAMED:
        return choose_workload(rig.root, engine, w["name"], None, prompt, cache), True
    path = (plan.geometry or {}).get("path") if plan is not None else None
    found = from_rig(rig)
    other = (isinstance(path, str) and os.path.exists(path)
             and (found is None or os.path.realpath(path) != os.path.realpath(found.path)))
    return choose_workload(rig.root, engine, None, path if other else None, prompt, cache), False


def recorded_backgrounds(record: dict, names) -> tuple[Background, ...]:
    """The background work a plan was solved with (its provenance `model.background`)."""
    out = []
    for b in record.get("background") or ():
        if isinstance(b, dict) and b.get("source") in names and b.get("kind") in ("engram", "busy"):
            out.append(Background(list(names).index(b["source"]), b["kind"], float(b.get("value") or 0.0)))
    return tuple(out)


def plan_problem(rig: Rig, inputs: Inputs, engine: Engine, plan: Plan | None) -> tuple[Chosen, Problem]:
    """The problem a plan was solved for, on `inputs`' drives: its engine with the reads in flight
    it recorded, its workload (`plan_workload`), the background work and page cache it recorded."""
    prov = plan.provenance if plan is not None else {}
    record = prov.get("model") if isinstance(prov.get("model"), dict) else {}
    names = [s.name for s in inputs.sources]
    chosen, _ = plan_workload(rig, engine.name, plan)
    problem = rig_problem(inputs, chosen, recorded_concurrency(engine, record.get("concurrency")),
                          recorded_backgrounds(record, names), page_cache_bytes=int(record.get("page_cache_bytes") or 0))
    return chosen, problem
