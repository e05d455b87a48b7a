"""Planning for ranks that share a GPU: each rank a device with its share of the GPU's memory and throughput."""

import pytest

from workbench.core.costs import ModelCosts
from workbench.planning import SearchOptions, Workload, plan
from workbench.planning.costs.clusters import HOST_STAGED_LINK, get_cluster, share_gpus

COSTS = ModelCosts.uniform(8, forward_ms=1.0, backward_ms=2.0, param_bytes=2 * 1024 ** 3, activation_bytes=10 ** 8,
                           batch_size=8)


def test_each_rank_gets_its_share_of_the_gpu():
    gpu = get_cluster("1xH100")
    shared = share_gpus(gpu, 4)
    assert shared.name == "1xH100-shared4" and shared.world_size == 4
    assert shared.device.memory_bytes == gpu.device.memory_bytes // 4  # as the runtime caps each rank's allocator
    assert shared.device.tflops("bfloat16") == pytest.approx(gpu.device.tflops("bfloat16") / 4)
    assert shared.device.memory_bandwidth_gbs == pytest.approx(gpu.device.memory_bandwidth_gbs / 4)
    assert shared.intra_node == HOST_STAGED_LINK  # ranks on one GPU talk through host memory
    assert share_gpus(gpu, 1) is gpu
    two_nodes = share_gpus(get_cluster("2x8xH100-IB"), 2)
    assert (two_nodes.num_nodes, two_nodes.devices_per_node) == (2, 16)
    assert two_nodes.inter_node == get_cluster("2x8xH100-IB").inter_node


def test_bad_sharing_is_refused():
    with pytest.raises(ValueError, match="ranks_per_gpu must be an int >= 1"):
        share_gpus(get_cluster("1xH100"), 0)
    with pytest.raises(ValueError, match="CPU processes sharing cores"):
        share_gpus(get_cluster("local-cpu"), 2)


def test_the_planner_budget_is_the_share():
    """A model whose weights, gradients and Adam state fit one H100 but not a quarter of it, unsharded."""
    whole = plan(Workload(COSTS, 8), get_cluster("1xH100"), options=SearchOptions(strategies=["dp1"]))
    assert whole.plans and whole.plans[0].estimate.memory_gib > 20
    shared = plan(Workload(COSTS, 8), share_gpus(get_cluster("1xH100"), 4),
                  options=SearchOptions(strategies=["dp4", "pp4-1f1b-m4"]))
    feasible = {p.name for p in shared.plans}
    assert "dp4" not in feasible  # every replica holds all the state: more than a quarter of 80 GiB
    assert "pp4-1f1b-m4" in feasible  # a quarter of the layers each
