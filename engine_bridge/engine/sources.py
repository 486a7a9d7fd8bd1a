"""Where a run's routed experts are read from: the primary, its replicas and both weight vectors,
from a plan or from `--replica PATH*W` options (what `run` and `replay` share)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

from core.errors import UsageError
from core.rig import Rig, rig_dir
from engines.split import check_weights, parse_weights
from planner.plans import load_plan, resolve_plan_path


@dataclass(frozen=True)
class SourceSet:
    """Where routed experts are read from: primary first, then replicas, with both weight vectors."""
    paths: tuple[str, ...]
    prefill: tuple[int, ...]     # base weights
    decode: tuple[int, ...]


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


def build_sources(model: str, replicas: Sequence[str], primary_weight: int, decode_weights: Optional[str],
                  plan: Optional[str], rig: Optional[str]) -> SourceSet:
    """The sources of a run: `plan` (a file, 'latest' or a name in <rig>/plans, whose primary must
    be `model`) or `model` plus `replicas` ('PATH*W'); `decode_weights` ('W,W,..') overrides either."""
    model = os.path.abspath(model)
    if plan:
        if replicas:
            raise UsageError("give either --plan or --replica, not both (the plan lists its sources)")
        path = resolve_plan_path(plan, Rig(root=rig_dir(rig)))
        p = load_plan(path)
        paths = tuple(os.path.abspath(s.path) for s in p.sources)
        if os.path.realpath(paths[0]) != os.path.realpath(model):
            raise UsageError(f"--model {model} is not the plan's primary {paths[0]} ({path}); run the plan's model "
                             "or re-solve the plan for this one")
        prefill, decode = tuple(p.prefill.weights), tuple(p.decode.weights)
        if decode_weights:
            decode = parse_weights(decode_weights)
    else:
        reps = [parse_replica(r) for r in replicas]
        paths = (model,) + tuple(p for p, _ in reps)
        prefill = check_weights((primary_weight,) + tuple(w for _, w in reps))
        decode = parse_weights(decode_weights) if decode_weights else prefill
    if len(decode) != len(paths):
        raise UsageError(f"--decode-weights {':'.join(map(str, decode))}: {len(decode)} weights for {len(paths)} sources; "
                         "give exactly one per source, primary first (the engine silently ignores a wrong count)")
    return SourceSet(paths=paths, prefill=prefill, decode=decode)
