"""The fleet on a Ray cluster: find each node of the fleet file among the cluster's live nodes, run
its job there as one task pinned to it, and collect what comes back (docs/fleet.md).

Ray does the distributed work (placement, transport, node failure); this module only decides what
runs where and turns each way a node can fail into its status: no live node matches (down), the
node or its worker died before answering (lost), the job raised (failed), no answer within the
timeout (timeout; the task is cancelled). None of them stops the other nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from core.errors import MissingError, UsageError

from .constants import DOWN, FAILED, LOST, RESOURCE_PREFIX, TIMEOUT
from .job import NodeJob
from .node import run_node
from .report import NodeResult, failed

INSTALL = "pip install 'replica-tuner[fleet]'"


def import_ray():
    """Ray, or one line saying how to get it (it is the optional extra `fleet`)."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"the fleet runs on a Ray cluster and Ray is not installed here: {INSTALL}") from None
    return ray


@dataclass(frozen=True)
class ClusterNode:
    node_id: str
    address: str         # NodeManagerAddress
    hostname: str
    resources: tuple[str, ...]


def live_nodes(ray) -> list[ClusterNode]:
    return [ClusterNode(n["NodeID"], n.get("NodeManagerAddress", ""), n.get("NodeManagerHostname", ""),
                        tuple(n.get("Resources", {})))
            for n in ray.nodes() if n.get("Alive")]


def match_node(name: str, nodes: Sequence[ClusterNode]) -> ClusterNode | None:
    """The live node a fleet entry names: the one advertising the resource fleet:NAME, else the one
    whose address or hostname is NAME (the first, when several share a host)."""
    for n in nodes:
        if RESOURCE_PREFIX + name in n.resources:
            return n
    return next((n for n in nodes if name in (n.address, n.hostname)), None)


# How long a cluster address has to answer before `fleet run` gives up on it (at most; --timeout
# when shorter): ray.init retries a dead GCS address on its own clock, well past any --timeout.
CONNECT_S = 10.0


def reachable(address: str, deadline_s: float) -> str:
    """'' when HOST:PORT accepts a TCP connection within `deadline_s`, else why not ('refused',
    'timed out', 'no such host'). 'auto' and ray:// client addresses are Ray's to find."""
    import socket

    if not address or address == "auto" or "://" in address:
        return ""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return ""
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, deadline_s)):
            return ""
    except socket.gaierror:
        return "no such host"
    except TimeoutError:
        return f"no answer within {deadline_s:g} s"
    except OSError as e:
        return e.strerror or str(e)


def connect(address: str | None, deadline_s: float = CONNECT_S):
    """Ray, connected to the cluster at `address` ('auto': the one `ray start` began here), or the
    connection this process already has. A HOST:PORT that does not answer within `deadline_s` is
    MissingError (exit 3) at once, instead of Ray retrying past --timeout."""
    ray = import_ray()
    if not ray.is_initialized():
        why = reachable(address or "auto", deadline_s)
        if why:
            raise MissingError(f"no Ray cluster at {address} ({why}); start one with `ray start --head` (see "
                               "docs/fleet.md) or give --address HOST:PORT")
        try:
            ray.init(address=address or "auto", include_dashboard=False, log_to_driver=False)
        except ConnectionError as e:
            raise UsageError(f"no Ray cluster at {address or 'auto'} ({e}); start one with `ray start --head` "
                             "(see docs/fleet.md) or give --address HOST:PORT") from None
    return ray


def run_on_cluster(jobs: Sequence[NodeJob], *, address: str | None = None, timeout_s: float,
                   work: Callable[[NodeJob], NodeResult] = run_node,
                   on_result: Callable[[NodeResult], None] | None = None) -> list[NodeResult]:
    """Each job on its node, all at once; their results in the jobs' order. `work` is what a node
    runs (run_node; tests give one that fails on purpose); `on_result` hears of each node as it
    finishes, in the order they finish. `timeout_s` counts from submission."""
    ray = connect(address, min(CONNECT_S, timeout_s))
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = live_nodes(ray)
    remote = ray.remote(_on_node)
    results: dict[str, NodeResult] = {}
    pending, hosts = {}, {}
    for job in jobs:
        node = match_node(job.node, nodes)
        if node is None:
            results[job.node] = failed(job.node, DOWN, f"no live node of the Ray cluster is '{job.node}' (no resource "
                                       f"{RESOURCE_PREFIX}{job.node}, no such address or hostname); start it with "
                                       f"`ray start --address HEAD:6379 --resources '{{\"{RESOURCE_PREFIX}{job.node}\": 1}}'`",
                                       rig=job.rig)
            continue
        hosts[job.node] = node.address
        # Pinned for good (soft=False): a job must never run on another node's drives; no retries,
        # as a retry could only land on the same node. num_cpus=0: the job waits on drives, and a
        # node advertising no CPUs must still run it.
        ref = remote.options(num_cpus=0, max_retries=0,
                             scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote(work, job)
        pending[ref] = job
    deadline = time.monotonic() + timeout_s
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        for ref in ready:
            job = pending.pop(ref)
            res = _collect(ray, ref, job, hosts.get(job.node, ""))
            results[job.node] = res
            if on_result is not None:
                on_result(res)
    for ref, job in pending.items():
        ray.cancel(ref, force=True)
        res = failed(job.node, TIMEOUT, f"no answer within {timeout_s:g} s (the task was cancelled); a drive or the "
                     f"node may hang: look at the node, or give --timeout", rig=job.rig, host=hosts.get(job.node, ""))
        results[job.node] = res
        if on_result is not None:
            on_result(res)
    return [results[j.node] for j in jobs]


def _on_node(work: Callable[[NodeJob], NodeResult], job: NodeJob) -> NodeResult:
    """The task: `work` (any callable, shipped with the task) on the node's job."""
    return work(job)


def _collect(ray, ref, job: NodeJob, host: str) -> NodeResult:
    from dataclasses import replace

    from ray import exceptions as rx

    try:
        res = ray.get(ref)
    except rx.RayTaskError as e:
        # The job itself raised (run_node never does; an injected `work` may): the first line of its cause.
        cause = str(getattr(e, "cause", None) or e).strip().splitlines()
        return failed(job.node, FAILED, f"the job raised: {cause[0] if cause else type(e).__name__}", rig=job.rig, host=host)
    except rx.RayError as e:
        first = (str(e).strip().splitlines() or [""])[0].split(". ")[0]
        return failed(job.node, LOST, f"the node left the cluster or its worker died before answering "
                      f"({type(e).__name__}: {first[:200]})", rig=job.rig, host=host)
    return replace(res, host=host)
