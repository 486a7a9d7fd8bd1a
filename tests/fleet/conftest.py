"""Fixtures of the fleet tests: a small real model (built once per module) and Ray's own
multi-node test cluster on this machine (skipped without Ray)."""

import pytest

from tests.fleet.helpers import model_file

NODES = ("alpha", "beta", "gamma")
STORE = 80 << 20      # bytes of object store per node: results are small, and 3 nodes share one machine's /dev/shm


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_file(tmp_path_factory.mktemp("fleet-model"))


@pytest.fixture(scope="module")
def cluster():
    """A head (advertising fleet:head) and three nodes, each advertising its fleet:NAME resource,
    shared by the module's tests; the driver connected to it."""
    ray = pytest.importorskip("ray", reason="the fleet's cluster tests need Ray: pip install 'replica-tuner[fleet]'")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"fleet:head": 1},
                                                      "object_store_memory": STORE})
    for name in NODES:
        c.add_node(num_cpus=1, resources={f"fleet:{name}": 1}, object_store_memory=STORE)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()
