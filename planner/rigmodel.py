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
from dataclasses import dataclass, field, replace
from typing import Sequence

from core.errors import MissingError, UsageError
from core.rig import Rig, load_rig
from engines.registry import DEFAULT_ENGINE, check_reads_model, engine_for_model, get_engine
from models.formats import RAW
from models.modelset import FILE, discover, from_rig
from engines.base import Engine
from models.tensortable import inspect_model

from .constants import PREFILL_TOKENS, V41_NAME
from .drivecurves import Background
from .plan import Plan
from .plans import (Inputs, SavedPlan, full_members_for, holds_of, load_inputs, load_plan, parse_background, plan_files,
                    save_plan)
from .solve import Problem, recorded_concurrency, solve_plan, with_concurrency
from .workload import NAMED, ModelWorkload, calibrated_workload, model_workload, named_workload


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


def rig_engine(rig_root: str, engine: str | None) -> str:
    """The engine a planner command plans for: the one given, else the engine that reads the rig's
    model (`engines.registry.engine_for_model`, from rig.toml's format and files) — a colibri
    directory is colibri's without --engine — else the default engine."""
    if engine:
        return engine
    rig = load_rig(rig_root, must_exist=False)
    if rig.model is None or not rig.format:
        return DEFAULT_ENGINE
    return engine_for_model(rig.format, rig.layout, rig.files or (os.path.basename(rig.model.path),))


def rig_problem(inputs: Inputs, chosen: Chosen, engine, backgrounds: tuple[Background, ...] = (),
                lanes: int | None = None, threads: int | None = None, page_cache_bytes: int = 0,
                buffered_excess: float = 0.0) -> Problem:
    """The problem `planner solve`, `simulate`, the tuner and autotune price: the engine (an `Engine`
    or its name; its reads in flight overridden by `lanes`/`threads`), the chosen workload's geometry
    and steps, the rig's drives and links, other work on the drives, for the rig's own model (not a
    named workload, not the fallback) what each source's copy holds, the page cache's room and what
    buffered reads read beyond their bytes."""
    g = chosen.workload.geometry
    holds = holds_of(inputs.sources, sorted({t.file for t in g.tensors})) if chosen.workload.name == "model" else ()
    e = get_engine(engine) if isinstance(engine, str) else engine
    return Problem(with_concurrency(e, lanes, threads), g, inputs.drives, chosen.workload.phases, tuple(backgrounds),
                   inputs.links, holds, page_cache_bytes, buffered_excess=buffered_excess)


RAM_ROOM = "the RAM less the engine's and this tool's own"     # where the page cache's room came from, unless capped


@dataclass(frozen=True)
class World:
    """What the pricing takes of the machine and the engine (planner/world.py): the engine's cache
    (experts, None: the planner's default), the page cache's room for the model, the loads in
    flight and compute per token its lines gave, and the calibration record they came from."""
    cache_experts: int | None
    page_cache_bytes: int
    in_flight: int | None = None
    compute: dict = field(default_factory=dict)
    overlap: bool = False
    calibration: dict = field(default_factory=dict)
    ram: str = ""                 # where the RAM figure came from (core.ram.RamLimit.describe)
    resident_bytes: int = 0       # what the engine keeps of its own
    how: str = ""                 # how its cache was found
    page_cache_from: str = ""     # how the page cache's room was found
    hit_share: float | None = None  # the share of its fetches the page cache served the engine's last buffered run
    buffered_excess: float = 0.0  # what that run's drives read beyond its fetches (readahead), a share of them
    compute_from: str = ""        # how the compute was found ('' none; the engine's lines; inferred from its arms)

    def as_dict(self) -> dict:
        return {"cache_experts": self.cache_experts, "page_cache_bytes": self.page_cache_bytes,
                "in_flight": self.in_flight, "compute_s_per_token": dict(self.compute), "overlap": self.overlap,
                "compute_from": self.compute_from,
                "ram": self.ram, "resident_bytes": self.resident_bytes, "cache_from": self.how,
                "page_cache_from": self.page_cache_from, "buffered_excess": self.buffered_excess,
                "calibration": dict(self.calibration)}


def find_calibration(rig_root: str, engine: str, model_path: str | None) -> dict:
    """The newest calibration record of this engine on this model in the rig's plans (provenance
    `engine_calibration`, written after a run of the real engine); {} when there is none."""
    rig = load_rig(rig_root, must_exist=False)
    try:
        files = plan_files(rig)
    except OSError:
        return {}
    for path in reversed(files[-50:]):
        try:
            prov = load_plan(path).provenance or {}
        except (UsageError, MissingError):
            continue
        cal = prov.get("engine_calibration")
        if (isinstance(cal, dict) and cal.get("engine") == engine and cal.get("record")
                and (model_path is None or cal.get("model") == model_path)):
            return dict(cal["record"])
    return {}


def engine_world(engine: Engine, geometry, args: Sequence[str] = (), env=None, ram=None, cache_experts: int | None = None,
                 page_cache_bytes: int | None = None, calibration: dict | None = None,
                 default_cache: int | None = None, buffered_excess: float | None = None) -> World:
    """The world a plan is priced in: the engine's cache (`cache_experts` when given, else what
    its last run's lines said, else what its arguments give it: `Engine.own_workload`), the page
    cache's room (`page_cache_bytes` when given, else the RAM the process runs under — its
    cgroup's limit, `core.ram.ram_limit` — less what the engine keeps of its own, its last run's
    measured peak or else its arguments' estimate, and, read from the machine, this tool's own
    resident memory; no more than a buffered run under this RAM showed, its measured share over
    the share of what that run read again: `planner.world.hit_room`), what buffered reads read
    beyond their bytes (`buffered_excess` when given, else what a buffered run under this RAM
    showed: `planner.world.readahead_excess`), and the run's loads in flight and compute per
    token. Without the engine's arguments (`args` empty) and
    a run, the cache is the planner's default (`default_cache`), and the engine's memory is priced
    at it."""
    from core.platform import available_memory
    from core.ram import own_resident, ram_limit

    from .workload import ModelShape, run_reread_share
    from .world import compute_per_token, hit_room, hits_record, measured_hits, page_cache_room, readahead_excess

    env = dict(os.environ if env is None else env)
    cal = dict(calibration or {})
    own = engine.own_workload(geometry, tuple(args), env, available_memory()) if engine.own_workload and geometry else None
    cache, how = cache_experts, "given (--cache-experts)"
    resident = own.resident_bytes if own else 0
    if cache is None and isinstance(cal.get("cache_per_layer"), int) and geometry is not None:
        cache, how = cal["cache_per_layer"] * geometry.layers, "the engine's last run (its own lines)"
    elif cache is None and own is not None and args:
        cache, how = own.cache_experts, own.how
    priced = cache if cache is not None else default_cache
    measured = cal.get("resident_bytes")
    ran = cal.get("cache_per_layer")
    if isinstance(measured, int) and measured > 0 and isinstance(ran, int) and geometry is not None:
        # its last run's peak, measured (its buffers and allocator included, which no argument
        # tells), for the cache priced here
        resident = measured + ((priced if priced is not None else ran * geometry.layers) - ran * geometry.layers) \
            * geometry.expert_bytes
    elif own is not None and priced is not None and own.cache_experts is not None and geometry is not None:
        resident += (priced - own.cache_experts) * geometry.expert_bytes
    if ram is None:
        # this tool's own memory too: the launcher and the tuner stay resident beside the engine
        limit, resident = ram_limit(), resident + own_resident()
    else:
        limit = ram
    room = page_cache_bytes if page_cache_bytes is not None else page_cache_room(limit.bytes, resident)
    room_from = "given (--page-cache)" if page_cache_bytes is not None else RAM_ROOM
    # the engine reads the model's bytes outside its routed experts once (its dense weights)
    once = geometry.dense_bytes if geometry is not None else 0
    hits = measured_hits(cal, limit.bytes, once) if page_cache_bytes is None and geometry is not None else None
    if buffered_excess is None:      # what buffered reads read beyond their bytes under this RAM, as a run showed
        buffered_excess = readahead_excess(cal, limit.bytes, once) if geometry is not None else 0.0
    compute = compute_per_token(cal)
    world = World(cache, room, cal.get("in_flight") if isinstance(cal.get("in_flight"), int) else None,
                  compute, bool(cal.get("overlap")), cal,
                  "" if page_cache_bytes is not None else limit.describe(), resident,
                  how if cache is not None else "the planner's default", room_from, hits, buffered_excess,
                  "the engine's own lines" if compute else "")
    if hits is None:
        return world
    # the share is of everything that run fetched, its first reads included; the page cache can
    # only serve what it read again, as many as its own prompt and tokens made
    reread = run_reread_share(ModelShape.from_geometry(geometry), {**cal, **hits_record(cal)}, priced)
    held = hit_room(hits, reread)
    if held * geometry.routed_bytes >= room:
        return world
    # what the kernel did under this RAM (its reclaim, the readahead's pages) beats a share of it
    return replace(world, page_cache_bytes=int(held * geometry.routed_bytes),
                   page_cache_from=f"the engine's last buffered run under this RAM: the page cache served "
                                   f"{100 * hits:.0f} % of what it fetched"
                                   + (f", {100 * held:.0f} % of what it read again" if reread < 1 else ""))


def _world_for_rig(rig_root: str, bench: str | None, engine: str, backgrounds: Sequence[str] = (),
                   lanes: int | None = None, threads: int | None = None, workload: str | None = None,
                    model: str | None = None, prompt_tokens: int = PREFILL_TOKENS, cache_experts: int | None = None,
                    calibrate: bool = True, tails: bool = False, page_cache_bytes: int | None = 0,
                    engine_args: Sequence[str] = (), use_calibration: bool = True) -> tuple[Inputs, Chosen, Problem]:
    """(inputs, the chosen workload, the problem) of `planner solve` and `simulate`: the rig's bench
    result (`bench`, default the newest), the workload (`choose_workload`) in the engine's world
    (`world_problem`: its cache, the page cache's room — None: from the RAM the process runs
    under —, its last run's calibration), other work given as `SOURCE:KIND` specs
    (`plans.parse_background`)."""
    # an engine that cannot read a partial replica plans the full members only (provenance.left_out)
    inputs, _ = full_members_for(load_inputs(rig_root, bench, calibrate=calibrate, tails=tails), get_engine(engine))
    names = [s.name for s in inputs.sources]
    bgs = tuple(parse_background(s, names) for s in backgrounds)
    chosen, prob, world = world_problem(rig_root, inputs, engine, workload, model, prompt_tokens, cache_experts,
                                        page_cache_bytes, engine_args, use_calibration, bgs, lanes, threads)
    return inputs, chosen, prob, world


def problem_for_rig(rig_root: str, bench: str | None, engine: str, backgrounds: Sequence[str] = (),
                    **options) -> tuple[Inputs, Chosen, Problem]:
    """(inputs, the chosen workload, the problem) of `planner solve` and `simulate`
    (`_world_for_rig`'s options)."""
    return _world_for_rig(rig_root, bench, engine, backgrounds, **options)[:3]


def world_provenance(engine: str, chosen: Chosen, world: World) -> dict:
    """What a plan keeps of its world: `world` (the RAM, the engine's cache and memory, the page
    cache's room) and, carried forward so the next solve uses it, the calibration it was priced
    with (`engine_calibration`)."""
    out = {"world": world.as_dict()}
    if world.calibration:
        out["engine_calibration"] = calibration_entry(engine, chosen.workload.shape.name, world.calibration)
    return out


def record_calibration(rig_root: str, engine: str, record: dict) -> str | None:
    """The rig's newest plan for `engine` again, with the engine's calibration from its own lines in
    its provenance (`engine_calibration`: what the next solve uses), saved into rig/plans; its
    path, or None when the rig has no plan for that engine."""
    rig = load_rig(rig_root, must_exist=False)
    files = plan_files(rig) if os.path.isdir(rig.root) else []
    for path in reversed(files[-50:]):
        try:
            plan = load_plan(path)
        except (UsageError, MissingError):
            continue
        if plan.engine != engine:
            continue
        model = (plan.geometry or {}).get("path") or ""
        prov = {**plan.provenance, "engine_calibration": calibration_entry(engine, model, record)}
        return save_plan(rig, replace(plan, created="", provenance=prov))
    return None


def calibration_entry(engine: str, model: str, record: dict) -> dict:
    """A plan's provenance `engine_calibration`: the engine, the model it ran and its record."""
    from .world import CALIBRATION_SCHEMA

    return {"schema": CALIBRATION_SCHEMA, "engine": engine, "model": model, "record": dict(record)}


def world_problem(rig_root: str, inputs: Inputs, engine: str, workload: str | None = None, model: str | None = None,
                  prompt_tokens: int = PREFILL_TOKENS, cache_experts: int | None = None,
                  page_cache_bytes: int | None = None, engine_args: Sequence[str] = (), use_calibration: bool = True,
                  backgrounds: tuple[Background, ...] = (), lanes: int | None = None, threads: int | None = None,
                  env=None, buffered_excess: float | None = None) -> tuple[Chosen, Problem, World]:
    """The chosen workload and its problem in the engine's world (`engine_world`): for the rig's
    own model the engine's cache and calibration; a named workload keeps the planner's defaults."""
    e = get_engine(engine)
    chosen = choose_workload(rig_root, engine, workload, model, prompt_tokens, cache_experts)
    own_model = chosen.workload.name == "model"
    cal = find_calibration(rig_root, engine, chosen.workload.shape.name) if own_model and use_calibration else {}
    geometry, default_cache = chosen.workload.geometry if own_model else None, chosen.workload.traffic.cache_experts
    world = engine_world(e, geometry, engine_args, env, cache_experts=cache_experts, page_cache_bytes=page_cache_bytes,
                         calibration=cal, default_cache=default_cache, buffered_excess=buffered_excess)

    def problem_at(prompt: int) -> tuple[Chosen, Problem]:
        ch = chosen
        if own_model and world.cache_experts != ch.workload.traffic.cache_experts and world.cache_experts is not None:
            ch = choose_workload(rig_root, engine, workload, model, prompt, world.cache_experts)
        elif prompt != prompt_tokens:
            ch = choose_workload(rig_root, engine, workload, model, prompt, cache_experts)
        if cal:
            ch = replace(ch, workload=calibrated_workload(ch.workload, cal))
        return ch, rig_problem(inputs, ch, e, backgrounds, lanes, threads if threads is not None else world.in_flight,
                               world.page_cache_bytes, world.buffered_excess)

    chosen, prob = problem_at(prompt_tokens)
    if not world.compute and cal.get("arms"):
        # the engine's lines gave no compute: what its arms took beyond their priced reads
        window = int(cal.get("prompt_tokens") or 0)
        compute, how = arms_compute(prob if window in (0, prompt_tokens) else problem_at(window)[1], cal)
        if compute:
            world = replace(world, compute=compute, compute_from=how)
    prob = replace(prob, compute=world.compute, overlap=world.overlap)
    return chosen, prob, world


def arm_predictions(problem: Problem, sources: Sequence[int], weights: Sequence[int],
                    decode_weights: Sequence[int] | None = None, mode: Sequence[str] = ()) -> dict[str, dict]:
    """{phase: the prediction} of an arm of the real-engine tuner — `weights` (prefill; decode's
    `decode_weights` or the same) over the problem's `sources` (indexes, primary first), with the
    switches `mode` — for each phase the problem reads in."""
    from .solve import Pricer, problem_prediction
    from .whatif import only_drives

    sub = problem if len(sources) == len(problem.drives) else only_drives(problem, sources)
    pricer, m = Pricer(sub), frozenset(mode)
    w = {"prefill": tuple(weights), "decode": tuple(decode_weights or weights)}
    return {ph: problem_prediction(sub, pricer.price(ph, w[ph], m), w[ph], m)
            for ph in ("prefill", "decode") if sub.phases[ph].steps}


ARMS_MIN = 2        # arms an inferred compute needs: one arm cannot tell compute from a mispriced read


def arms_compute(problem: Problem, cal: dict, arms: Sequence[dict] | None = None,
                 least: int = ARMS_MIN) -> tuple[dict[str, float], str]:
    """({phase: compute seconds per token}, how) for an engine whose lines give no compute (ds4),
    from the real-engine tuner's arms (`cal["arms"]`, or `arms`): each arm ran the same prompt and
    tokens with other weights, so what each took beyond its reads as `problem` prices them is the
    engine's compute, the same for every arm; the median over the arms (docs/planner.md, "Compute
    the engine's lines do not give"). Charged as a 'run' window's compute is (`world.compute_per_token`:
    all to decode). ({}, why) when fewer than `least` arms priced, or the median is not positive
    (the reads alone are priced slower than the engine ran: nothing to add)."""
    from .world import compute_per_token, run_seconds

    arms = list(cal.get("arms") or () if arms is None else arms)
    prompt, gen = int(cal.get("prompt_tokens") or 0), int(cal.get("tokens") or 0)
    if gen < 1:
        return {}, "no generated tokens in the calibration's window"
    extra = []
    for a in arms:
        srcs, tok_s = tuple(a.get("sources") or ()), a.get("tok_s")
        if not a.get("weights") or not srcs or not isinstance(tok_s, (int, float)) or tok_s <= 0 \
                or max(srcs) >= len(problem.drives):
            continue
        reads = run_seconds(arm_predictions(problem, srcs, a["weights"], a.get("decode_weights"), a.get("mode") or ()),
                            prompt, gen)          # "seconds": the reads alone, whatever compute `problem` knows
        if reads is not None:
            extra.append(gen / tok_s - reads)
    if len(extra) < max(1, least):
        return {}, f"{len(extra)} arm(s) with weights ran: {least} needed to tell compute from the reads"
    from statistics import median

    c = median(extra)
    if c <= 0:
        return {}, f"the arms ran faster than their reads are priced (median {c:+.3f} s over the window): no compute added"
    how = (f"inferred from {len(extra)} arms of the real-engine tuner: the seconds each took beyond its priced reads, "
           f"median {c / gen:.3f} s per generated token (arms {min(extra) / gen:.3f}..{max(extra) / gen:.3f})")
    return compute_per_token({"compute_s": c, "tokens": gen}), how


def solve_rig(rig_root: str, bench: str | None, engine: str, backgrounds: Sequence[str] = (), top: int = 5,
              **problem) -> SavedPlan:
    """`planner solve`: solve the rig's problem (`problem_for_rig`'s options), record the workload
    in the plan, write it to rig/plans/<timestamp>.json and read it back (what a later command
    will load). The notices: the planner's choice of workload, and each source it leaves idle."""
    inputs, chosen, prob, world = _world_for_rig(rig_root, bench, engine, backgrounds, **problem)
    plan, choice = solve_plan(inputs.sources, prob, inputs.provenance, top=top)
    record = dict(chosen.workload.as_dict(), engine=engine, idle=choice.idle)
    plan = replace(plan, geometry=chosen.geometry, workload=record,
                   provenance={**plan.provenance, **world_provenance(engine, chosen, world)})
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
    it recorded, its workload (`plan_workload`; calibrated as it was, `engine_calibration`), the
    background work, page cache and engine's compute it recorded."""
    prov = plan.provenance if plan is not None else {}
    record = prov.get("model") if isinstance(prov.get("model"), dict) else {}
    names = [s.name for s in inputs.sources]
    chosen, _ = plan_workload(rig, engine.name, plan)
    cal = prov.get("engine_calibration") if isinstance(prov.get("engine_calibration"), dict) else {}
    traffic = (plan.workload or {}).get("traffic") if plan is not None else None
    if isinstance(cal.get("record"), dict) and isinstance(traffic, dict) and traffic.get("source") == "engine":
        # the decode's reads as the engine's run calibrated them when the plan was solved
        chosen = replace(chosen, workload=calibrated_workload(chosen.workload, cal["record"]))
    problem = rig_problem(inputs, chosen, recorded_concurrency(engine, record.get("concurrency")),
                          recorded_backgrounds(record, names), page_cache_bytes=int(record.get("page_cache_bytes") or 0))
    comp = record.get("compute_s_per_token")
    if isinstance(comp, dict) and comp:
        problem = replace(problem, compute={k: float(v) for k, v in comp.items() if isinstance(v, (int, float))},
                          overlap=bool(record.get("overlap")))
    return chosen, problem
