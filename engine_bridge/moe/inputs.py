"""Where a run's routed experts are read from, and how: the primary, its replicas, both weight
vectors, the target engine and its switches, from a plan or from `--replica PATH*W` options (what
`run` and `replay` share).

A source is a member's copy of the whole model (`models.modelset.ModelSet`): the file, the split
set's first file or the directory a rig member's path names. The primary comes from `--model`
(found on disk with `models.modelset.discover`), the plan's source 0 or the rig's model (the
rig says its layout: `member_set`); every other source is the same model where that member keeps it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

from core.errors import UsageError
from core.rig import Rig, load_rig, rig_dir
from engines.registry import DEFAULT_ENGINE, check_reads_model, engine_for_model, get_engine
from engines.split import check_weights, parse_weights
from planner.plan import Plan
from planner.plans import load_plan, resolve_plan_path
from models.modelset import ModelSet, discover, member_set, one_file

from .idle import PHASES, plan_shares
from .staging import StepReads


@dataclass(frozen=True)
class SourceSet:
    """Where routed experts are read from: primary first, then replicas, with both weight vectors,
    the engine whose reads the run performs and its switches. models: each source's copy of the
    model (a path is taken as a one-file model). planned: per phase, the plan's prediction of each
    source's share of the bytes (`idle.plan_shares`), or None (no plan, a plan without one, or
    weights other than the plan's)."""
    models: tuple[ModelSet, ...]
    prefill: tuple[int, ...]     # base weights
    decode: tuple[int, ...]
    planned: dict = field(default_factory=dict)
    engine: str = DEFAULT_ENGINE
    switches: tuple[str, ...] = ()    # the engine's switches that are on ('direct', 'stripe')
    # per source: the files a partial replica holds (the rig's rig.toml `holds`); None or no entry: every file
    partial: tuple[tuple[str, ...] | None, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "models", tuple(m if isinstance(m, ModelSet) else one_file(os.fspath(m))
                                                 for m in self.models))

    @property
    def paths(self) -> tuple[str, ...]:
        """Each source's model path (its file, its split set's first file, or its directory)."""
        return tuple(m.path for m in self.models)

    def holds(self) -> tuple[frozenset[str] | None, ...]:
        """Per source, the model files its copy holds when it is a partial replica (None: every
        file, as the primary and a full replica hold)."""
        return tuple(None if h is None else frozenset(h) for h in self.partial) or (None,) * len(self.models)

    def step_reads(self, geometry, healthy=None, holds=(), weights_now=None) -> StepReads:
        """The target engine's read pattern of each step of a run over these sources; `healthy`:
        the reader's sources still in use and `weights_now(phase)` the weights it cuts with now
        (both asked at every step); `holds`: what each holds (`holds()`)."""
        return StepReads(get_engine(self.engine), geometry, {"prefill": self.prefill, "decode": self.decode},
                         self.switches, holds, healthy, weights_now)

    def in_flight(self) -> dict:
        """Per phase, the most reads the engine keeps outstanding (None: its lanes limit it)."""
        e = get_engine(self.engine)
        return {ph: (c.shared if c.per_read else None) for ph in PHASES for c in (e.concurrency(ph),)}


@dataclass(frozen=True)
class RunInputs:
    """What a run reads from the rig before it opens any model: rig.toml and the plan it was given
    (`path` and `plan` None without --plan), each read once (`run_inputs`)."""

    rig: Rig
    path: Optional[str] = None
    plan: Optional[Plan] = None


def run_inputs(plan: Optional[str], rig: Optional[str]) -> RunInputs:
    """rig.toml (an empty rig when there is none) and the plan `plan` names (a file, 'latest' or a
    name in <rig>/plans), read once for the whole command."""
    the_rig = load_rig(rig_dir(rig), must_exist=False)
    if not plan:
        return RunInputs(the_rig)
    path = resolve_plan_path(plan, Rig(root=the_rig.root))
    return RunInputs(the_rig, path, load_plan(path))


def resolve_model(model: Optional[str], plan: Optional[str], rig: Optional[str]) -> ModelSet:
    """The primary model of a run: `--model` (found on disk: a file, any member of a split set, a
    directory), else the plan's primary (source 0), else the rig's model. A path that is a rig
    member's takes the rig's layout. UsageError when none of them names one."""
    return discover(model) if model else model_of(None, run_inputs(plan, rig))


def model_of(model: Optional[str], inputs: RunInputs) -> ModelSet:
    """`resolve_model` on what `run_inputs` read."""
    if model:
        return discover(model)
    the_rig = inputs.rig
    if inputs.plan is not None:
        return member_model(inputs.plan.sources[0].path, the_rig)
    if the_rig.model is None:
        raise UsageError(f"no model to run: give --model PATH, --plan PLAN, or --rig DIR whose rig.toml names one "
                         f"(the rig at {the_rig.root} names none)")
    return member_set(the_rig, the_rig.model)


def member_model(path: str, rig: Rig | None, primary: ModelSet | None = None) -> ModelSet:
    """The model at a source's `path`: where the rig member with that path keeps it, else the
    primary's model at that path (a replica), else what is on disk there."""
    real = os.path.realpath(path)
    for m in rig.members if rig is not None and rig.model is not None else ():
        if os.path.realpath(m.path) == real:
            return member_set(rig, m)
    return primary.at(path) if primary is not None else discover(path)


def parse_replica(text: str) -> tuple[str, int]:
    """'PATH*W' -> (absolute path, W)."""
    path, star, w = str(text).rpartition("*")
    if not star or not path:
        raise UsageError(f"--replica {text!r}: use PATH*WEIGHT, e.g. /mnt/green/model.gguf*5")
    try:
        weight = int(w)
    except ValueError:
        raise UsageError(f"--replica {text!r}: weight {w!r} is not an integer 1..100") from None
    return os.path.abspath(path), weight


def build_sources(model: ModelSet, replicas: Sequence[str], primary_weight: int, decode_weights: Optional[str],
                  plan: Optional[str], rig: Optional[str], engine: Optional[str] = None,
                  switches: Sequence[str] = ()) -> SourceSet:
    """The sources of a run: `plan` (a file, 'latest' or a name in <rig>/plans, whose primary must
    be `model`; its engine and switches are the run's) or `model` plus `replicas` ('PATH*W', each
    a copy of the whole model: its file, its split set's first file or its directory) read as
    `engine` reads (default: the engine that reads such a model, `engines.registry.engine_for_model`)
    with `switches` on; `decode_weights` ('W,W,..')
    overrides either."""
    return sources_of(model, replicas, primary_weight, decode_weights, run_inputs(plan, rig), engine, switches)


def sources_of(model: ModelSet, replicas: Sequence[str], primary_weight: int, decode_weights: Optional[str],
               inputs: RunInputs, engine: Optional[str] = None, switches: Sequence[str] = ()) -> SourceSet:
    """`build_sources` on what `run_inputs` read."""
    the_rig, path, p = inputs.rig, inputs.path, inputs.plan
    chosen = False
    if p is not None:
        if replicas:
            raise UsageError("give either --plan or --replica, not both (the plan lists its sources)")
        if engine and engine != p.engine:
            raise UsageError(f"--engine {engine}: the plan {path} is for {p.engine}; drop --engine or solve a plan for "
                             f"{engine} (`planner solve --engine {engine}`)")
        if switches:
            raise UsageError("--direct/--stripe come from the plan with --plan; drop them or solve another plan")
        engine = p.engine
        paths = tuple(os.path.abspath(s.path) for s in p.sources)
        if os.path.realpath(paths[0]) != os.path.realpath(model.path):
            raise UsageError(f"--model {model.path} is not the plan's primary {paths[0]} ({path}); run the plan's model "
                             "or re-solve the plan for this one")
        prefill, decode = tuple(p.prefill.weights), tuple(p.decode.weights)
        switches = tuple(k for k in get_engine(engine).switches if getattr(p, k, False))
        planned = {ph: plan_shares(getattr(p, ph).predicted, len(paths)) for ph in PHASES}
        if decode_weights:
            decode = parse_weights(decode_weights, engine)
            planned["decode"] = None          # the plan's prediction is for its own decode weights
    else:
        chosen = engine is not None
        engine = engine or engine_for_model(model.format, model.layout, model.files)
        e = get_engine(engine)
        for k in switches:
            if k not in e.switches:
                raise UsageError(f"--{k}: {engine} has no such switch" + (f" (it has {', '.join('--' + x for x in e.switches)})"
                                                                          if e.switches else ""))
        reps = [parse_replica(r) for r in replicas]
        paths = (model.path,) + tuple(rep_path for rep_path, _ in reps)
        prefill = check_weights((primary_weight,) + tuple(w for _, w in reps), engine)
        decode = parse_weights(decode_weights, engine) if decode_weights else prefill
        planned = {}
    if len(decode) != len(paths):
        raise UsageError(f"--decode-weights {':'.join(map(str, decode))}: {len(decode)} weights for {len(paths)} sources; "
                         "give exactly one per source, primary first (with another count ds4 logs \"ds4: ignoring "
                         "DS4_ARGODRIVE_DECODE_WEIGHTS=...\" and reads with the base weights)")
    if decode != prefill and not get_engine(engine).phase_weights:
        raise UsageError(f"--decode-weights {':'.join(map(str, decode))}: {engine} reads both phases with one weight "
                         f"vector ({':'.join(map(str, prefill))}); drop --decode-weights")
    if (p is not None or chosen) and engine_for_model(model.format, model.layout, model.files) != engine:
        # another engine is the one that reads this model: its pattern is the one to run. (A layout
        # no engine reads, a split GGUF set, is still replayed with the engine asked for.)
        check_reads_model(engine, model.format, model.layout, model.files, model.path)
    models = (model,) + tuple(member_model(p, the_rig, model) for p in paths[1:])
    partial = {os.path.realpath(m.path): m.holds for m in the_rig.replicas if m.partial}
    holds = (None,) + tuple(partial.get(os.path.realpath(p)) for p in paths[1:])
    return SourceSet(models=models, prefill=prefill, decode=decode, planned=planned, engine=engine,
                     switches=tuple(switches), partial=holds if any(h is not None for h in holds) else ())
