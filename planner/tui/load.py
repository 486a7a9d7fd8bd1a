"""The tuner's I/O: its opening state from a rig (bench result, plan, harness runs) and saving
the tuned weights as a plan file."""

from __future__ import annotations

import json
import os

from core.errors import UsageError
from core.rig import load_rig

from ..model import PHASES
from ..plan import Plan
from ..plans import load_inputs, load_plan, plan_files, resolve_plan_path, save_plan
from ..solve import solve_plan
from .state import Measured, TunerState, new_state, settings_from_provenance, tuned_plan

RUNS_DIR = "runs"


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
    prov = plan.provenance if plan is not None else {}
    inputs = load_inputs(rig.root, bench, calibrate=calibrate and prov.get("calibrated", True) is not False)
    names = [s.name for s in inputs.sources]
    if plan is not None and [s.name for s in plan.sources] != names:
        raise UsageError(f"plan {plan_name} is for sources {', '.join(s.name for s in plan.sources)}; the rig has "
                         f"{', '.join(names)}: run `planner solve --rig {rig.root}` or give another --plan")
    workloads, backgrounds = settings_from_provenance(prov, names)
    solved = {ph: getattr(plan, ph).weights for ph in PHASES} if plan is not None else None
    return new_state(inputs.sources, inputs.drives, solved, workloads, backgrounds,
                     engine=plan.engine if plan is not None else "ds4-argodrive", plan_name=plan_name,
                     provenance=inputs.provenance, measured=latest_measured(rig.root))


def solve_weights(state: TunerState) -> dict[str, tuple[int, ...]]:
    """Solve both phases for the state's drives and shapes (seconds: run it in a worker)."""
    plan = solve_plan(state.sources, state.drives, state.workloads["prefill"], state.workloads["decode"],
                      state.backgrounds, state.engine, top=0)
    return {ph: getattr(plan, ph).weights for ph in PHASES}


def latest_measured(rig_root: str) -> tuple[Measured, ...]:
    """Arms and medians of the newest readable rig/runs/*/results.json; () when there is none.
    Read-only context for the screen, so an unreadable run is skipped rather than an error."""
    d = os.path.join(rig_root, RUNS_DIR)
    try:
        runs = sorted((n for n in os.listdir(d) if not n.startswith(".")), reverse=True)
    except (FileNotFoundError, NotADirectoryError):
        return ()
    for run in runs:
        try:
            with open(os.path.join(d, run, "results.json"), encoding="utf-8") as f:
                doc = json.load(f)
            return measured_from_results(doc, run)
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            continue
    return ()


def measured_from_results(doc: dict, run: str) -> tuple[Measured, ...]:
    """The arms of a harness results.json (engine_bridge.arms, schema 1) with their medians."""
    if doc.get("kind") != "bench-results":
        raise ValueError("not a harness results file")
    out = []
    for name, arm in doc["arms"].items():
        med = (doc.get("medians") or {}).get(name) or {}
        out.append(Measured(run, name,
                            {"prefill": tuple(arm.get("prefill_weights") or ()), "decode": tuple(arm.get("decode_weights") or ())},
                            int(med.get("n") or 0),
                            {"prefill": _number(med.get("prefill_tps")), "decode": _number(med.get("gen_steady_tps"))}))
    return tuple(out)


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def save_tuned(rig_root: str, state: TunerState) -> str:
    """Write the tuned weights to rig/plans/<timestamp>.json; returns the path."""
    plan: Plan = tuned_plan(state)
    return save_plan(load_rig(rig_root, must_exist=False), plan)
