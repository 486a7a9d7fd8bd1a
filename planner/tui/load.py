"""The tuner's I/O: its opening state from a rig (bench result, plan, the model, harness runs) and
saving the tuned weights as a plan file.

The problem is built as `planner solve` builds it (`planner.rigmodel.rig_problem`): the plan's
engine (with the reads in flight it recorded), the rig's model, or the named workload or other
model the plan was solved for, with the plan's prompt and cache (`choose_workload`), the bench
result's drives and links, and the background work the plan recorded. So the tuner predicts what
the plan predicted."""

from __future__ import annotations

import os

from core.constants import RESULTS_FILE
from core.errors import ReplicaTunerError, UsageError
from core.rig import Rig, load_rig
from engines.registry import get_engine

from ..measured import HarnessRun, read_results
from ..plan import Plan
from ..plans import load_inputs, load_plan, plan_files, resolve_plan_path, save_plan
from ..rigmodel import plan_problem, rig_engine
from ..solve import PHASES, solve
from .state import MeasuredArm, Solution, TunerState, new_state, tuned_plan


def load_tuner(rig_root: str, bench: str | None = None, plan_ref: str | None = None,
               calibrate: bool = True, engine: str | None = None) -> TunerState:
    """The opening state: the rig's sources (primary first) with the bench result's drive
    models, and the plan's weights and switches (`plan_ref`, else the newest in rig/plans, else
    the newest for `engine` when it is given). Without any plan the state has no solved weights
    yet: `solve_weights` finds them (in a worker), for `engine` (default: the registry's)."""
    rig = load_rig(rig_root, must_exist=False)
    plan, plan_name = None, ""
    if plan_ref:
        path = resolve_plan_path(plan_ref, rig)
        plan, plan_name = load_plan(path), os.path.basename(path)
    else:
        found = _newest_plan(rig, engine)
        if found is not None:
            plan, plan_name = found[0], os.path.basename(found[1])
    if plan is not None and engine and plan.engine != engine:
        raise UsageError(f"plan {plan_name} is for {plan.engine}, not {engine}: give a --plan for {engine}, "
                         f"or leave --engine out to tune it")
    name = plan.engine if plan is not None else rig_engine(rig.root, engine)
    eng = get_engine(name)
    prov = plan.provenance if plan is not None else {}
    inputs = load_inputs(rig.root, bench, calibrate=calibrate and prov.get("calibrated", True) is not False,
                         tails=prov.get("tails") is True)
    names = [s.name for s in inputs.sources]
    if plan is not None and [s.name for s in plan.sources] != names:
        raise UsageError(f"plan {plan_name} is for sources {', '.join(s.name for s in plan.sources)}; the rig has "
                         f"{', '.join(names)}: run `planner solve --rig {rig.root}` or give another --plan")
    chosen, problem = plan_problem(rig, inputs, eng, plan)
    solution = None
    if plan is not None:
        solution = Solution({ph: getattr(plan, ph).weights for ph in PHASES},
                            plan.switches)
    geometry = plan.geometry if plan is not None and plan.geometry else chosen.geometry
    workload = plan.workload if plan is not None and plan.workload else dict(chosen.workload.as_dict(), engine=name)
    return new_state(inputs.sources, problem, solution, plan_name=plan_name, provenance=inputs.provenance,
                     geometry=geometry, workload=workload, measured=latest_measured(rig.root),
                     message=f"notice: {chosen.notice}" if chosen.notice else "")


def _newest_plan(rig: Rig, engine: str | None) -> tuple[Plan, str] | None:
    """The newest plan in rig/plans (for `engine`, when given: older plans for other engines are
    passed over, unreadable ones too)."""
    files = plan_files(rig)
    if engine is None:
        return (load_plan(files[-1]), files[-1]) if files else None
    for path in reversed(files):
        try:
            plan = load_plan(path)
        except ReplicaTunerError:
            continue
        if plan.engine == engine:
            return plan, path
    return None


def solve_weights(state: TunerState) -> Solution:
    """Solve the state's problem (seconds: run it in a worker)."""
    ch = solve(state.problem, top=0)
    return Solution(dict(ch.weights), ch.mode)


def latest_measured(rig_root: str) -> tuple[MeasuredArm, ...]:
    """Arms and medians of the newest readable rig/runs/*/results.json; () when there is none.
    Read-only context for the screen, so an unreadable run is skipped rather than an error."""
    d = Rig(root=rig_root).runs_dir
    try:
        runs = sorted((n for n in os.listdir(d) if not n.startswith(".")), reverse=True)
    except (FileNotFoundError, NotADirectoryError):
        return ()
    for run in runs:
        try:
            return measured_from_run(read_results(os.path.join(d, run, RESULTS_FILE)), run)
        except ReplicaTunerError:
            continue
    return ()


def measured_from_run(results: HarnessRun, run: str) -> tuple[MeasuredArm, ...]:
    """The tuner's rows for one harness run (named by its folder)."""
    return tuple(MeasuredArm(run, a.name, a.weights, a.n, a.tps) for a in results.arms)


def save_tuned(rig_root: str, state: TunerState) -> str:
    """Write the tuned weights to rig/plans/<timestamp>.json; returns the path."""
    return save_plan(load_rig(rig_root, must_exist=False), tuned_plan(state))
