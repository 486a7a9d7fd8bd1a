"""N-1 plans: a plan re-solved without each of its drives (I/O: reads the plan's bench result).

Both engines fail closed when a replica's drive is gone (ds4-argodrive's reader turns the whole
split off on a bad path; colibri drops a mirror it cannot load and then rejects a weight list of
the wrong length), and a RAM member is gone after every reboot. So export writes, beside the
chosen profile, the profile of the plan re-solved without each drive: the same bench result's
drive models for the drives that are left, the plan's engine, workload and recorded settings.
Without the primary, the next source becomes the primary (it holds the same bytes), unless it is a
partial copy, which cannot be the engine's primary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from core.errors import ReplicaTunerError
from core.events import Notice, Reporter, emit
from core.rig import Rig
from engines.registry import get_engine

from .plan import Plan
from .plans import load_inputs
from .rigmodel import plan_problem
from .solve import solve_plan
from .whatif import without_drive


@dataclass(frozen=True)
class Fallback:
    """The plan without one drive: `plan` None when it could not be solved (`why`)."""
    drive: str            # the source's name
    path: str             # the source's path in the plan
    plan: Plan | None
    why: str = ""


def fallback_plans(rig: Rig, plan: Plan, report: Reporter = None) -> tuple[Fallback, ...]:
    """One `Fallback` per source of a plan of two or more; () for a one-source plan. `rig`: the
    loaded rig the plan belongs to (its rig.toml is not read again). `report` gets a Notice before
    each re-solve (one can take tens of seconds on a big model)."""
    if len(plan.sources) < 2:
        return ()
    try:
        prov = plan.provenance or {}
        bench = prov.get("bench") if isinstance(prov.get("bench"), str) and os.path.isfile(prov["bench"]) else None
        inputs = load_inputs(rig.root, bench, calibrate=prov.get("calibrated", True) is not False,
                             tails=prov.get("tails") is True, rig=rig)
        names = [s.name for s in inputs.sources]
        if names != [s.name for s in plan.sources]:
            why = (f"the plan's sources ({', '.join(s.name for s in plan.sources)}) are not the rig's "
                   f"({', '.join(names)}); solve the plan again")
            return tuple(Fallback(s.name, s.path, None, why) for s in plan.sources)
        _, problem = plan_problem(rig, inputs, get_engine(plan.engine), plan)
    except ReplicaTunerError as e:
        return tuple(Fallback(s.name, s.path, None, f"the plan's inputs could not be read again: {e}") for s in plan.sources)
    out = []
    holds = tuple(problem.holds) + (None,) * (len(plan.sources) - len(problem.holds))
    for i, s in enumerate(plan.sources):
        if i == 0 and holds[1] is not None:
            out.append(Fallback(s.name, s.path, None, f"without the primary, {plan.sources[1].name} would be the "
                                                      "primary, and it holds only part of the model"))
            continue
        emit(report, Notice(s.name, f"re-solving the plan without {s.name} ({i + 1} of {len(plan.sources)})"))
        try:
            left = tuple(x for j, x in enumerate(plan.sources) if j != i)
            prov = dict(plan.provenance or {}, without=s.name, solved_from=plan.created)
            p, _ = solve_plan(left, without_drive(problem, i), prov, created=plan.created)
            out.append(Fallback(s.name, s.path, replace(p, geometry=plan.geometry, workload=plan.workload)))
        except ReplicaTunerError as e:
            out.append(Fallback(s.name, s.path, None, str(e)))
    return tuple(out)
