"""One node's job, run on that node: verify its replicas against the fleet's manifest, check the
model's upstream digests, measure its drives, solve and export its plan (docs/fleet.md).

`run_node` never raises for what it finds: a missing rig or model, a bad replica or a step that
refuses is the node's status and problems, so one node's trouble is never the fleet's. It keeps
the job's key and result in the node's rig (fleet-node.json); a rerun whose key is unchanged
returns that result without reading a drive, so reruns redo only what changed or failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace

from core.constants import BENCH_DIR, FLEET_NODE_FILE, RIG_FILE
from core.errors import MissingError, ReplicaTunerError
from core.fsutil import FileIdentity
from core.jsonfile import read_json, write_json
from core.rig import Rig, load_rig
from models.modelset import member_files

from .constants import FAILED, MISMATCH, MISSING, NODE_STATE_KIND, NODE_STATE_SCHEMA, OK
from .job import NodeJob
from .report import DriveRow, NodeResult, node_from_dict, node_to_dict, reused


def run_node(job: NodeJob) -> NodeResult:
    """The node's job; its result whatever happens on the way (see the module docstring)."""
    t0 = time.monotonic()
    try:
        res = _run(job)
    except MissingError as e:
        res = NodeResult(node=job.node, status=MISSING, rig=job.rig, engine=job.engine, problems=(str(e),))
    except ReplicaTunerError as e:
        res = NodeResult(node=job.node, status=FAILED, rig=job.rig, engine=job.engine, problems=(str(e),))
    except Exception as e:  # noqa: BLE001 - a node reports what broke; the fleet goes on
        res = NodeResult(node=job.node, status=FAILED, rig=job.rig, engine=job.engine,
                         problems=(f"{type(e).__name__}: {e}",))
    return replace(res, seconds=time.monotonic() - t0)      # this run's time (a reused result's is the look-up's)


def _run(job: NodeJob) -> NodeResult:
    from replicas.manifest import manifest_from_dict

    if not os.path.isfile(os.path.join(job.rig, RIG_FILE)):
        raise MissingError(f"no rig at {job.rig} on this node (no {RIG_FILE}): copy the model there and run "
                           "`replicas init` / `replicas sync`, or fix the node's rig in the fleet file")
    rig = load_rig(job.rig)
    if rig.model is None:
        raise MissingError(f"the rig at {rig.root} names no model: run `replicas init --model PATH`")
    manifest = manifest_from_dict(job.manifest, "the fleet's manifest")
    key = job_key(rig, manifest.digest(), job)
    last = load_state(rig)
    if not job.force and last is not None and last[0] == key and last[1].status == OK:
        return reused(last[1])
    base = {"node": job.node, "rig": rig.root, "engine": job.engine}
    published, tap = None, None
    if job.upstream is not None:
        from replicas.upstream import upstream_from_dict
        from replicas.upstreams import UpstreamTap

        published = upstream_from_dict(job.upstream, "the fleet's upstream digests")
        tap = UpstreamTap([rig.model], manifest, published)
    drives, problems, status = _verify(rig, manifest, job, tap)
    upstream = ""
    if published is not None and status == OK:
        upstream, more = _upstream(rig, manifest, published, tap)
        problems += more
        if upstream != "match":
            status = MISMATCH if upstream == "mismatch" else MISSING
    if status != OK:
        res = NodeResult(status=status, drives=drives, upstream=upstream, problems=tuple(problems), **base)
        save_state(rig, job_key(rig, manifest.digest(), job), res)
        return res
    res = NodeResult(status=OK, drives=drives, upstream=upstream, problems=tuple(problems), **base)
    try:
        res = _plan(rig, manifest, job, res)
    except ReplicaTunerError as e:
        # A step after verify refused: what the node found so far stays in its row.
        res = replace(res, status=MISSING if isinstance(e, MissingError) else FAILED, problems=res.problems + (str(e),))
    save_state(rig, job_key(rig, manifest.digest(), job), res)
    return res


def _plan(rig: Rig, manifest, job: NodeJob, res: NodeResult) -> NodeResult:
    """Measure (or reuse the rig's measurement), solve, export — the chain `engine-bridge tune-rig`
    runs (`engine_bridge.tunerig.steps.plan_rig`, one implementation): the node's row with its
    ceilings, weights, predicted tok/s and profile."""
    from engine_bridge.tunerig.steps import plan_rig

    planned = plan_rig(rig, manifest, job.engine, profile=job.profile or f"fleet-{job.node}", bench=job.bench,
                       measure=job.measure, cache_experts=job.cache_experts, redo=job.force)
    plan = planned.solved.plan
    res = replace(res, drives=_with_ceilings(res.drives, planned.measured.result), bench=planned.measured.path)
    by_name = {s.name: i for i, s in enumerate(plan.sources)}
    return replace(res, drives=tuple(_weighted(d, plan, by_name.get(d.name)) for d in res.drives),
                   plan=planned.solved.path, prefill_tok_s=plan.prefill.predicted.get("tok_s"),
                   decode_tok_s=plan.decode.predicted.get("tok_s"), problems=res.problems + planned.solved.notices,
                   profile=planned.exported.profile)


# ---- the steps --------------------------------------------------------------------------------

def _verify(rig: Rig, manifest, job: NodeJob, tap=None):
    """Every member against the fleet's manifest: the chain's verify step (`replicas verify
    --manifest`: stamps and verdicts only where it is the rig's own); `tap` takes the primary's
    upstream digests on the same reads. (the rows, the problems, the status)"""
    from engine_bridge.tunerig.steps import verify_rig

    v = verify_rig(rig, manifest, "the fleet's manifest", job.verify, tap)
    rows = tuple(DriveRow(name=m.name, path=m.path, role=m.role, state=m.state, bad=m.bad) for m in v.members)
    return rows, list(v.problems), v.status


def _upstream(rig: Rig, manifest, published, tap) -> tuple[str, list[str]]:
    """The primary against the model's published digests: taken on verify's read where it read a
    file whole (--full, or a stale stamp), else in a pass of their own (SHA-256 cannot come from the
    manifest's BLAKE3). The replicas are tied to the primary by the manifest's BLAKE3 pieces."""
    from replicas.upstreams import check_upstream

    check = check_upstream(rig.model, manifest, published, known=tap.known(rig.model.path))
    return check.state, list(check.problems)


def _with_ceilings(drives, result) -> tuple[DriveRow, ...]:
    out = []
    for d in drives:
        try:
            r = result.drive(d.name)
        except KeyError:
            out.append(d)
            continue
        bw = {p: (r.presets[p].bw_bytes if p in r.presets else None) for p in ("seq", "prefill", "decode")}
        out.append(replace(d, seq_Bps=bw["seq"], prefill_Bps=bw["prefill"], decode_Bps=bw["decode"]))
    return tuple(out)


def _weighted(d: DriveRow, plan, i: int | None) -> DriveRow:
    if i is None:
        return d
    return replace(d, prefill_weight=plan.prefill.weights[i], decode_weight=plan.decode.weights[i])


# ---- reruns -----------------------------------------------------------------------------------

def job_key(rig: Rig, manifest_digest: str, job: NodeJob) -> str:
    """What the job's result depends on: the model's digest, the rig's rig.toml, the identity (size,
    mtime, inode, device) of every file of every member, the newest iobench result and the job's
    settings. Any change (a replica re-copied or damaged in place, a drive re-measured, another
    engine) makes a new key; verify's stamps (xattrs) and records do not."""
    from replicas.manifest import manifest_from_dict

    model = manifest_from_dict(job.manifest, "the fleet's manifest")
    h = hashlib.sha256()
    with open(rig.rig_file, "rb") as f:
        h.update(f.read())
    files = []
    for m in rig.members:
        for rel, path, _ in member_files(m, model):
            try:
                i = FileIdentity.of(path)
                files.append([m.name, rel, i.size, i.mtime_ns, i.inode, i.device])
            except OSError:
                files.append([m.name, rel, None])
    bench = rig.timestamped_files(BENCH_DIR)
    h.update(json.dumps({"manifest": manifest_digest, "files": files, "bench": os.path.basename(bench[-1]) if bench else "",
                         "job": job.settings()}, sort_keys=True, default=list).encode())
    return h.hexdigest()


def load_state(rig: Rig) -> tuple[str, NodeResult] | None:
    """(key, result) of the node's last job, or None (none yet, or a file this version cannot read)."""
    path = os.path.join(rig.root, FLEET_NODE_FILE)
    if not os.path.exists(path):
        return None
    try:
        doc = read_json(path, NODE_STATE_KIND, "it is rewritten by the next `fleet run`", schema=NODE_STATE_SCHEMA)
        return doc["key"], node_from_dict(doc["result"])
    except (ReplicaTunerError, KeyError, TypeError, ValueError):
        return None


def save_state(rig: Rig, key: str, result: NodeResult) -> None:
    write_json(os.path.join(rig.root, FLEET_NODE_FILE),
               {"schema": NODE_STATE_SCHEMA, "kind": NODE_STATE_KIND, "key": key, "result": node_to_dict(result)})

