"""The tuner's I/O: its opening state from a rig (bench result, plan, harness runs) and saving
the tuned weights as a plan file."""

from __future__ import annotations

import os

from core.constants import RESULTS_FILE
from core.errors import ReplicaTunerError, UsageError
from core.rig import Rig, load_rig
from engines.registry import DEFAULT_ENGINE

from ..measured import HarnessRun, read_results
from ..model import PHASES
from ..plan import Plan
from ..plans import load_inputs, load_plan, plan_files, resolve_plan_path, save_plan
from ..rigmodel import choose_workload
from ..solve import solve_plan
from .state import Measured, TunerState, new_state, settings_from_provenance, tuned_plan


def load_tuner(rig_root: str, bench: str | None = None, plan_ref: str | None = None,
               calibrate: bool = True) -> TunerState:
    """The opening state: the rig's sources (primary first) with the bench result's drive
    models, and the plan's weights (`plan_ref`, else the newest in rig/plans). Without any
    plan the state has no solved weights yet: `solve_weights` finds them (in a worker)."""
    rig = load_rig(rig_root, must_exist=False)
    plan, plan_name = None, ""
    if plan_ref or plan_files(rig):
        path = resolve_plan_path(plan_ref or "latest", rig)
        plan, plan_name = load_plan(path), os.path.basename(path)
        if plan.engine != DEFAULT_ENGINE:
            # The tuner nudges per-read split weights, ds4-argodrive's kind; another engine's plan
            # (colibri places whole experts, one weight vector for both phases) is solved whole.
            raise UsageError(f"plan {plan_name} is for {plan.engine}; the tuner edits {DEFAULT_ENGINE}'s per-read splits — "
                             f"use `planner solve --engine {plan.engine}` and `planner show`, or give a {DEFAULT_ENGINE} --plan")
    prov = plan.provenance if plan is not None else {}
    inputs = load_inputs(rig.root, bench, calibrate=calibrate and prov.get("calibrated", True) is not False,
                         tails=prov.get("tails") is True)
    names = [s.name for s in inputs.sources]
    if plan is not None and [s.name for s in plan.sources] != names:
        raise UsageError(f"plan {plan_name} is for sources {', '.join(s.name for s in plan.sources)}; the rig has "
                         f"{', '.join(names)}: run `planner solve --rig {rig.root}` or give another --plan")
    workloads, backgrounds = settings_from_provenance(prov, names)
    if plan is None:    # nothing solved yet: the rig's own model (or ds4-v41 when it cannot be read)
        chosen = choose_workload(rig.root, DEFAULT_ENGINE)
        workloads = {"prefill": chosen.workload.prefill, "decode": chosen.workload.decode}
    solved = {ph: getattr(plan, ph).weights for ph in PHASES} if plan is not None else None
    return new_state(inputs.sources, inputs.drives, solved, workloads, backgrounds,
                     engine=plan.engine if plan is not None else DEFAULT_ENGINE, plan_name=plan_name,
                     provenance=inputs.provenance, measured=latest_measured(rig.root), links=inputs.links)


def solve_weights(state: TunerState) -> dict[str, tuple[int, ...]]:
    """Solve both phases for the state's drives and shapes (seconds: run it in a worker)."""
    plan = solve_plan(state.sources, state.drives, state.workloads["prefill"], state.workloads["decode"],
                      state.backgrounds, state.engine, top=0, links=state.links)
    return {ph: getattr(plan, ph).weights for ph in PHASES}


def latest_measured(rig_root: str) -> tuple[Measured, ...]:
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


def measured_from_run(results: HarnessRun, run: str) -> tuple[Measured, ...]:
    """The tuner's rows for one harness run (named by its folder)."""
    return tuple(Measured(run, a.name, a.weights, a.n, a.tps) for a in results.arms)


def save_tuned(rig_root: str, state: TunerState) -> str:
    """Write the tuned weights to rig/plans/<timestamp>.json; returns the path."""
    plan: Plan = tuned_plan(state)
    return save_plan(load_rig(rig_root, must_exist=False), plan)
