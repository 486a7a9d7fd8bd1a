"""A fleet run from the machine that asks: read the fleet file, the manifest and the upstream
digests, run every node's job on the cluster, write the report under the asker's rig
(rig/fleet/<UTC>.json and .txt) (docs/fleet.md)."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Callable

from core.constants import FLEET_DIR, UPSTREAM_FILE
from core.errors import MissingError, RigError, UsageError
from core.fsutil import atomic_write_text, read_text
from core.jsonfile import read_json, write_json
from core.rig import Rig, load_rig
from engines.registry import DEFAULT_ENGINE, ENGINES
from replicas.manifest import model_manifest_to_dict
from replicas.manifests import load_manifest, load_manifest_file
from replicas.upstream import upstream_to_dict
from replicas.upstreams import load_upstream

from .cluster import run_on_cluster
from .constants import DEFAULT_TIMEOUT_S, REPORT_KIND, REPORT_SCHEMA
from .job import BenchSettings, NodeJob
from .node import run_node
from .report import FleetReport, NodeResult, render_table, report_from_dict, report_to_dict
from .spec import FleetSpec, parse_fleet


def load_fleet(path: str) -> FleetSpec:
    text = read_text(path, "fleet file", 'write one (docs/fleet.md): [[node]] name = "alpha" rig = "/srv/rig"')
    return parse_fleet(text, path)


def _near(fleet_file: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.path.dirname(os.path.abspath(fleet_file)), path)


def fleet_jobs(fleet_file: str, rig: Rig, *, verify: str = "quick", measure: str = "auto",
               bench: BenchSettings = BenchSettings(), cache_experts: int | None = None,
               force: bool = False) -> tuple[list[NodeJob], str, str]:
    """(a job per node, the model digest, where the upstream digests came from)."""
    spec = load_fleet(fleet_file)
    if spec.manifest:
        manifest = load_manifest_file(_near(fleet_file, spec.manifest))
    else:
        if not os.path.exists(rig.manifest_file):
            raise MissingError(f"no manifest for the fleet: {fleet_file} names none and {rig.manifest_file} does not "
                               "exist; add manifest = \"PATH\" to the fleet file or run `replicas sync` here")
        manifest = load_manifest(rig)
    up_path = _near(fleet_file, spec.upstream) if spec.upstream else os.path.join(rig.root, UPSTREAM_FILE)
    upstream = load_upstream(up_path) if spec.upstream or os.path.exists(up_path) else None
    engine = spec.engine or DEFAULT_ENGINE
    if engine not in ENGINES:
        raise UsageError(f"{fleet_file}: engine {engine!r}: use one of {', '.join(ENGINES)}")
    doc = model_manifest_to_dict(manifest)
    jobs = [NodeJob(node=n.name, rig=n.rig, manifest=doc, engine=engine,
                    upstream=upstream_to_dict(upstream) if upstream else None, verify=verify, measure=measure,
                    bench=bench, cache_experts=cache_experts, force=force) for n in spec.nodes]
    return jobs, manifest.digest(), upstream.source if upstream else ""


def fleet_run(fleet_file: str, rig_root: str, *, address: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
              verify: str = "quick", measure: str = "auto", bench: BenchSettings = BenchSettings(),
              cache_experts: int | None = None, force: bool = False,
              work: Callable[[NodeJob], NodeResult] = run_node,
              on_result: Callable[[NodeResult], None] | None = None) -> tuple[FleetReport, str]:
    """Run the fleet file's nodes; returns the report and the path of its JSON under the asker's rig."""
    if verify not in ("quick", "full") or measure not in ("auto", "always"):
        raise UsageError(f"verify {verify!r} / measure {measure!r}: use quick|full and auto|always")
    if timeout_s <= 0:
        raise UsageError(f"--timeout {timeout_s:g}: give positive seconds")
    rig = load_rig(rig_root, must_exist=False)
    jobs, digest, upstream = fleet_jobs(fleet_file, rig, verify=verify, measure=measure, bench=bench,
                                        cache_experts=cache_experts, force=force)
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    results = run_on_cluster(jobs, address=address, timeout_s=timeout_s, work=work, on_result=on_result)
    settings = {"fleet_file": os.path.abspath(fleet_file), "verify": verify, "measure": measure,
                "timeout_s": timeout_s, "force": force}
    report = FleetReport(created, digest, tuple(results), jobs[0].engine if jobs else "", upstream, settings)
    return report, save_report(rig, report)


def save_report(rig: Rig, report: FleetReport) -> str:
    """rig/fleet/<UTC>.json (the data) and <UTC>.txt (the table); returns the JSON's path."""
    stem = os.path.join(rig.subdir(FLEET_DIR), report.created.replace("-", "").replace(":", ""))
    atomic_write_text(stem + ".txt", render_table(report))
    return write_json(stem + ".json", report_to_dict(report))


def load_report(path: str) -> FleetReport:
    doc = read_json(path, REPORT_KIND, "run `fleet run FLEET_FILE`", schema=REPORT_SCHEMA, what="fleet report")
    try:
        return report_from_dict(doc)
    except (KeyError, TypeError, ValueError) as e:
        raise RigError(f"{path}: not a fleet report ({type(e).__name__}: {e}); run `fleet run` again") from None


def latest_report(rig: Rig) -> str:
    files = rig.timestamped_files(FLEET_DIR)
    if not files:
        raise MissingError(f"no fleet reports in {os.path.join(rig.root, FLEET_DIR)}: run `fleet run FLEET_FILE` first")
    return files[-1]
