"""Where a run's routed experts are read from: the primary, its replicas and both weight vectors,
from a plan or from `--replica PATH*W` options (what `run` and `replay` share).

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
from engines.registry import DEFAULT_ENGINE
from engines.split import check_weights, parse_weights
from planner.plans import load_plan, resolve_plan_path
from models.modelset import ModelSet, discover, member_set, one_file

from .idle import PHASES, plan_pieces


@dataclass(frozen=True)
class SourceSet:
    """Where routed experts are read from: primary first, then replicas, with both weight vectors.
    models: each source's copy of the model (a path is taken as a one-file model). planned: per
    phase, the plan's prediction of each source's bytes per read (`idle.plan_pieces`), or None
    (no plan, a plan without one, or weights other than the plan's)."""
    models: tuple[ModelSet, ...]
    prefill: tuple[int, ...]     # base weights
    decode: tuple[int, ...]
    planned: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "models", tuple(m if isinstance(m, ModelSet) else one_file(os.fspath(m))
                                                 for m in self.models))

    @property
    def paths(self) -> tuple[str, ...]:
        """Each source's model path (its file, its split set's first file, or its directory)."""
        return tuple(m.path for m in self.models)


def resolve_model(model: Optional[str], plan: Optional[str], rig: Optional[str]) -> ModelSet:
    """The primary model of a run: `--model` (found on disk: a file, any member of a split set, a
    directory), else the plan's primary (source 0), else the rig's model. A path that is a rig
    member's takes the rig's layout. UsageError when none of them names one."""
    if model:
        return discover(model)
    the_rig = load_rig(rig_dir(rig), must_exist=False)
    if plan:
        return member_model(load_plan(resolve_plan_path(plan, Rig(root=the_rig.root))).sources[0].path, the_rig)
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
                  plan: Optional[str], rig: Optional[str]) -> SourceSet:
    """The sources of a run: `plan` (a file, 'latest' or a name in <rig>/plans, whose primary must
    be `model`) or `model` plus `replicas` ('PATH*W', each a copy of the whole model: its file, its
    split set's first file or its directory); `decode_weights` ('W,W,..') overrides either."""
    the_rig = load_rig(rig_dir(rig), must_exist=False)
    if plan:
        if replicas:
            raise UsageError("give either --plan or --replica, not both (the plan lists its sources)")
        path = resolve_plan_path(plan, Rig(root=the_rig.root))
        p = load_plan(path)
        paths = tuple(os.path.abspath(s.path) for s in p.sources)
        if os.path.realpath(paths[0]) != os.path.realpath(model.path):
            raise UsageError(f"--model {model.path} is not the plan's primary {paths[0]} ({path}); run the plan's model "
                             "or re-solve the plan for this one")
        prefill, decode = tuple(p.prefill.weights), tuple(p.decode.weights)
        # the reader cuts reads with ds4's rule: another engine's prediction (colibri's placement
        # shares) says nothing about what each source reads here
        planned = {ph: plan_pieces(getattr(p, ph).predicted, plan_read_bytes(p, ph), len(paths))
                   if p.engine == DEFAULT_ENGINE else None for ph in PHASES}
        if decode_weights:
            decode = parse_weights(decode_weights)
            planned["decode"] = None          # the plan's prediction is for its own decode weights
    else:
        reps = [parse_replica(r) for r in replicas]
        paths = (model.path,) + tuple(p for p, _ in reps)
        prefill = check_weights((primary_weight,) + tuple(w for _, w in reps))
        decode = parse_weights(decode_weights) if decode_weights else prefill
        planned = {}
    if len(decode) != len(paths):
        raise UsageError(f"--decode-weights {':'.join(map(str, decode))}: {len(decode)} weights for {len(paths)} sources; "
                         "give exactly one per source, primary first (with another count ds4 logs \"ds4: ignoring "
                         "DS4_ARGODRIVE_DECODE_WEIGHTS=...\" and reads with the base weights)")
    models = (model,) + tuple(member_model(p, the_rig, model) for p in paths[1:])
    return SourceSet(models=models, prefill=prefill, decode=decode, planned=planned)


def plan_read_bytes(plan, phase: str) -> int | None:
    """The read a plan's phase prediction is for, bytes: its workload's (schema 2), else what its
    provenance recorded of the solver's model."""
    for where in (plan.workload, (plan.provenance or {}).get("model") or {}):
        rb = (where.get(phase) or {}).get("read_bytes") if isinstance(where, dict) else None
        if isinstance(rb, int) and rb > 0:
            return rb
    return None
