"""The fleet on three simulated nodes with throttled drives: Ray's local test cluster on this
machine (one raylet per node, each advertising its fleet:NAME resource), each node's rig on its
own three testbed drives, `fleet run` twice (the second reuses what did not change).

    python -m bench.fleet_bench            # as root; waits for the testbed lock; ~3 min

Prints the fleet table, then side by side per drive: the throttle, the ceiling the node measured
and their ratio; per node the share of each drive in its plan against its share of the throttles;
and the rerun's wall time against the first run's. The Ray processes start inside the testbed's
group, so every read a node makes goes through its drive's throttle.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.testbed import REPO, Testbed, drop_caches, wait_writeback

# Three nodes that differ, as a fleet's hosts do (MB/s read ceilings): alpha is the reference rig's
# ratio 12.9 : 7.08 : 7.08 scaled to 30 MB/s; beta has two equal fast drives and a slow one; gamma
# a slow primary.
NODES = {"alpha": (30.0, 16.5, 16.5), "beta": (24.0, 24.0, 12.0), "gamma": (12.0, 24.0, 18.0)}
DRIVES = ("internal", "green", "white")
# The demo's model: 2 layers x 32 experts, q8_0, ~230 MB (prefill's 32 MiB reads at 2 lanes need >134 MB).
MODEL = ("--layers", "2", "--experts", "32", "--top-k", "2", "--dim", "1024", "--ff", "1024", "--quant", "q8_0")
PY = sys.executable


def sh(cmd: list[str], wrap: list[str] | None = None) -> None:
    p = subprocess.run([*(wrap or []), *cmd], cwd=REPO, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"fleet_bench: {' '.join(cmd[:4])} failed ({p.returncode}): {p.stderr[-1500:]}")


def outer() -> None:
    limits = {f"{n}-{d}": mbs for n, caps in NODES.items() for d, mbs in zip(DRIVES, caps)}
    work = tempfile.mkdtemp(prefix="fleet-bench-", dir="/var/tmp")
    try:
        _outer(work, limits)
    finally:
        shutil.rmtree(work, ignore_errors=True)      # the model, the rigs and the reports: all ours


def _outer(work: str, limits: dict[str, float]) -> None:
    model = os.path.join(work, "model.gguf")
    sh([PY, "-m", "engine_bridge.cli", "synth", model, *MODEL])
    with Testbed(limits, size="512M") as tb:
        mounts = tb.mounts()
        rigs = {}
        for n in NODES:
            primary = os.path.join(mounts[f"{n}-internal"], "model.gguf")
            sh(["cp", model, primary])
            rig = os.path.join(work, n, "rig")
            sh([PY, "-m", "replicas.cli", "init", "--rig", rig, "--model", primary, "--name", "internal"])
            sh([PY, "-m", "replicas.cli", "sync", "--rig", rig, "--quiet", "--piece-size", "16M", primary,
                mounts[f"{n}-green"], mounts[f"{n}-white"]], wrap=tb.wrap)
            # The drives carry the names the throttles have; the fleet table shows the rig's names.
            rigs[n] = rig
        wait_writeback()
        drop_caches()
        p = subprocess.run([*tb.wrap, PY, "-m", "bench.fleet_bench", "--inner", work, json.dumps(rigs)], cwd=REPO)
        if p.returncode:
            raise SystemExit(p.returncode)


def inner(work: str, rigs: dict[str, str]) -> None:
    import ray
    from ray.cluster_utils import Cluster

    with open(os.path.join(rigs["alpha"], "manifest.json")) as f:
        shared = os.path.join(work, "manifest.json")
        with open(shared, "w") as g:
            g.write(f.read())
    fleet = os.path.join(work, "fleet.toml")
    with open(fleet, "w") as f:
        f.write('manifest = "manifest.json"\n' + "".join(f'\n[[node]]\nname = "{n}"\nrig = "{r}"\n' for n, r in rigs.items()))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20})
    for n in NODES:
        c.add_node(num_cpus=1, resources={f"fleet:{n}": 1}, object_store_memory=80 << 20)
    c.wait_for_nodes()
    asker = os.path.join(work, "asker")
    try:
        walls, docs, table = [], [], ""
        for _ in range(2):
            t0 = time.perf_counter()
            p = subprocess.run([PY, "-m", "fleet.cli", "run", fleet, "--rig", asker, "--address", c.address, "--json",
                                "--quiet"], cwd=REPO, capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            if p.returncode:
                raise SystemExit(f"fleet run failed ({p.returncode}): {p.stderr[-2000:]}")
            docs.append(json.loads(p.stdout))
            table = table or subprocess.run([PY, "-m", "fleet.cli", "show", "--rig", asker], cwd=REPO,
                                            capture_output=True, text=True).stdout
    finally:
        ray.shutdown()
        c.shutdown()
    print("== the fleet table (first run)")
    print(table, end="")
    print("\n== measured ceiling vs throttle, per drive (seq, 1 MiB reads at 8 lanes)")
    for node in docs[0]["nodes"]:
        for d, cap in zip(node["drives"], NODES[node["node"]]):
            seq = d["ceilings_Bps"]["seq"] / 1e6
            print(f"{node['node']:6} {d['name']:9} throttle {cap:5.1f} MB/s  measured {seq:5.1f} MB/s  ratio {seq / cap:.2f}")
    print("\n== each drive's share of the plan's weights vs its share of the throttles")
    for node in docs[0]["nodes"]:
        caps = NODES[node["node"]]
        for phase in ("prefill", "decode"):
            w = [d["weights"][phase] for d in node["drives"]]
            shares = " ".join(f"{x / sum(w):.2f}/{c / sum(caps):.2f}" for x, c in zip(w, caps))
            print(f"{node['node']:6} {phase:7} weights {':'.join(map(str, w)):10} share/throttle share {shares}")
    reused = sum(n["reused"] for n in docs[1]["nodes"])
    print(f"\n== rerun: {reused} of {len(docs[1]['nodes'])} nodes reused; wall {walls[1]:.1f} s vs first {walls[0]:.1f} s "
          f"(ratio {walls[1] / walls[0]:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inner", nargs=2, metavar=("WORK", "RIGS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        inner(a.inner[0], json.loads(a.inner[1]))
    else:
        outer()


if __name__ == "__main__":
    main()
