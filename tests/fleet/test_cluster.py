"""The fleet on Ray's own multi-node test cluster (ray.cluster_utils.Cluster): several nodes on
this machine, each with its own fleet:NAME resource and its own rig folder of a small real model."""

import json
import os
import shutil

import pytest

from fleet.cli import app, exit_code
from fleet.constants import DOWN, FAILED, LOST, MISMATCH, MISSING, OK, TIMEOUT
from fleet.asker import fleet_run
from replicas.checks import FilePiece
from tests.fleet.helpers import PIECE, QUICK, Sabotaged, fleet_file, node_rig
from tests.replicas.helpers import flip_byte, runner

pytestmark = pytest.mark.slow

def _setup(tmp_path, model, names, extra=None):
    """Each named node's rig in tmp_path/NAME, the shared manifest beside the fleet file (alpha's
    copy of it: every node's rig made the same one), the asker's empty rig; returns (fleet file, asker rig)."""
    rigs = {n: node_rig(tmp_path / n, model) for n in names}
    shared = tmp_path / "shared"
    shared.mkdir()
    shutil.copyfile(os.path.join(rigs[names[0]], "manifest.json"), shared / "manifest.json")
    path = fleet_file(shared / "fleet.toml", {**rigs, **(extra or {})}, manifest="manifest.json")
    return path, str(tmp_path / "asker")


def test_every_node_reported_a_bad_replica_named_by_its_piece(cluster, model, tmp_path):
    fleet, asker = _setup(tmp_path, model, ("alpha", "beta", "gamma"),
                          extra={"head": str(tmp_path / "head" / "rig"),       # a live node without the model
                                 "delta": str(tmp_path / "delta" / "rig")})    # no such node in the cluster
    flip_byte(tmp_path / "beta" / "green" / "model.gguf", 3 * PIECE + 100)
    heard = []
    report, path = fleet_run(fleet, asker, timeout_s=600, bench=QUICK, on_result=heard.append)

    by = {n.node: n for n in report.nodes}
    assert [n.node for n in report.nodes] == ["alpha", "beta", "gamma", "head", "delta"]
    assert {n: r.status for n, r in by.items()} == {"alpha": OK, "beta": MISMATCH, "gamma": OK, "head": MISSING,
                                                    "delta": DOWN}, [(r.node, r.problems) for r in report.nodes]
    assert sorted(r.node for r in heard) == ["alpha", "beta", "gamma", "head"]     # delta never ran
    green = next(d for d in by["beta"].drives if d.name == "green")
    assert green.state == "mismatch" and green.bad == (FilePiece("model.gguf", 3, 3 * PIECE, PIECE),)
    assert {d.name: d.state for d in by["beta"].drives} == {"internal": "identical", "green": "mismatch",
                                                           "white": "identical"}
    assert "no rig at" in by["head"].problems[0] and "fleet:delta" in by["delta"].problems[0]
    for name in ("alpha", "gamma"):
        r = by[name]
        assert [d.name for d in r.drives] == ["internal", "green", "white"]
        assert all(d.state == "identical" and d.seq_Bps > 0 and d.prefill_weight is not None for d in r.drives), r
        assert r.prefill_tok_s > 0 and r.decode_tok_s > 0
        assert os.path.isfile(r.profile) and r.profile.startswith(str(tmp_path / name))
        assert r.host                                     # where it ran, from the cluster
    assert exit_code(report) == 1

    # One report under the asker's rig: the JSON, and the table with the bad piece named.
    assert os.path.dirname(path) == os.path.join(asker, "fleet")
    with open(path[:-5] + ".txt") as f:
        table = f.read()
    assert f"beta: green ({green.path}): model.gguf bad piece 3 at byte {3 * PIECE}, {PIECE} bytes" in table
    res = runner.invoke(app, ["show", "--rig", asker, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["kind"] == "fleet" and doc["counts"] == {"ok": 2, "mismatch": 1, "missing": 1, "down": 1}


def test_a_rerun_redoes_only_what_changed_and_a_hung_node_times_out(cluster, model, tmp_path):
    fleet, asker = _setup(tmp_path, model, ("alpha", "gamma"))
    first, _ = fleet_run(fleet, asker, timeout_s=600, bench=QUICK)
    assert [(n.status, n.reused) for n in first.nodes] == [(OK, False), (OK, False)]

    # gamma's white replica is damaged in place
    flip_byte(tmp_path / "gamma" / "white" / "model.gguf", 100)
    second, _ = fleet_run(fleet, asker, timeout_s=600, bench=QUICK)
    by = {n.node: n for n in second.nodes}
    assert (by["alpha"].status, by["alpha"].reused) == (OK, True)
    assert by["alpha"].drives == first.nodes[0].drives and by["alpha"].plan == first.nodes[0].plan
    assert (by["gamma"].status, by["gamma"].reused) == (MISMATCH, False)
    assert next(d for d in by["gamma"].drives if d.name == "white").bad == (FilePiece("model.gguf", 0, 0, PIECE),)

    # beta joins and hangs. Alone in its fleet file, so a short timeout decides nothing but its own
    # outcome (a node that answers could lose the race against it); the run waits the timeout out.
    beta = node_rig(tmp_path / "beta", model)
    third, _ = fleet_run(fleet_file(tmp_path / "shared" / "beta.toml", {"beta": beta}, manifest="manifest.json"), asker,
                         timeout_s=2, bench=QUICK, work=Sabotaged(hang=["beta"]))
    assert [n.status for n in third.nodes] == [TIMEOUT] and "no answer within 2 s" in third.nodes[0].problems[0]


def test_a_node_removed_mid_run_is_lost_and_a_job_that_raises_failed_while_the_others_finish(cluster, model, tmp_path):
    doomed = cluster.add_node(num_cpus=1, resources={"fleet:doomed": 1}, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    fleet, asker = _setup(tmp_path, model, ("alpha",), extra={"doomed": str(tmp_path / "doomed" / "rig"),
                                                              "gamma": str(tmp_path / "gamma" / "rig")})

    def hear(res):
        # doomed's job never returns; once alpha has answered, its node leaves the cluster.
        if res.node == "alpha":
            cluster.remove_node(doomed)

    report, _ = fleet_run(fleet, asker, timeout_s=600, bench=QUICK, work=Sabotaged(hang=["doomed"], broken=["gamma"]),
                          on_result=hear)
    by = {n.node: n for n in report.nodes}
    assert by["alpha"].status == OK
    assert by["doomed"].status == LOST and "left the cluster" in by["doomed"].problems[0]
    assert by["gamma"].status == FAILED and "broken on purpose on gamma" in by["gamma"].problems[0]
    assert exit_code(report) == 1


def test_a_dead_cluster_address_is_found_at_once_not_after_rays_retries():
    """`fleet run --address 127.0.0.1:1 --timeout 10` hung past its timeout: ray.init retries a dead
    address on its own clock. A closed port is refused and a name that resolves nowhere is said so."""
    import socket

    from fleet.cluster import reachable

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                    # nothing listens there now
    assert "refused" in reachable(f"127.0.0.1:{port}", 2).lower()
    assert reachable("nohost.invalid:6379", 2) == "no such host"
    assert reachable("auto", 2) == "" and reachable("ray://head:10001", 2) == ""
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen(1)
        assert reachable(f"127.0.0.1:{live.getsockname()[1]}", 2) == ""
