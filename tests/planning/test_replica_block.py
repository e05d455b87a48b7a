"""A block of replicas simulated for the whole plan gives the whole plan's times and memory, to the last digit."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest

from workbench.core.costs import LinkSpec, ModelCosts
from workbench.core.plan import ParallelPlan
from workbench.core.pods import PodClusterSpec
from workbench.planning.costs import estimate as E
from workbench.planning.costs.clusters import load_cluster

COSTS = ModelCosts.uniform(16, forward_ms=1.0, backward_ms=2.0, param_bytes=20_000_000, activation_bytes=2_000_000,
                           batch_size=8)
NODES_OF_4 = replace(load_cluster("2x8xH100-IB"), name="4x4", num_nodes=4, devices_per_node=4)
SLOW = LinkSpec("slow-pod", latency_us=10.0, bandwidth_gbs=5.0)


def _both(cluster, name: str) -> tuple[E.Estimate, E.Estimate]:
    plan = ParallelPlan.parse(name)
    batch = 2 * plan.dp * plan.microbatches
    block = E.estimate(E.CostContext(COSTS, cluster, batch), plan)
    with mock.patch.object(E, "replica_block", lambda c, s: None):
        every = E.estimate(E.CostContext(COSTS, cluster, batch), plan)
    return block, every


@pytest.mark.parametrize("name", ["dp16", "gropipe-8x2-1f1b-m4-d1", "gropipe-4x4-gpipe-m4-d0", "gropipe-4x4-zbh1-m8-d1",
                                  "async-4x4-m4", "async-8x2-m2-2bw", "gropipe-8x2-zbh2-m4-d0"])
def test_a_block_of_replicas_times_the_whole_plan(name):
    block, every = _both(NODES_OF_4, name)
    assert block.detail.get("simulated_replicas") == E.replica_block(NODES_OF_4, block.strategy) < block.strategy.dp
    assert "simulated_replicas" not in every.detail
    for field in ("iteration_ms", "memory_gib", "compute_ms", "bubble_ms", "exposed_comm_ms"):
        assert getattr(block, field) == pytest.approx(getattr(every, field), rel=1e-9, abs=1e-9), field


def test_the_block_fills_whole_nodes_and_needs_the_same_links_block_after_block():
    assert E.replica_block(NODES_OF_4, ParallelPlan.parse("gropipe-8x2-1f1b-m4-d1")) == 2
    assert E.replica_block(NODES_OF_4, ParallelPlan.parse("dp16")) == 4
    assert E.replica_block(NODES_OF_4, ParallelPlan.parse("gropipe-2x8-1f1b-m8-d1")) is None  # the block is the plan
    assert E.replica_block(NODES_OF_4, ParallelPlan.parse("pp4-1f1b-m8")) is None  # one replica
    # a pipeline of 8 over two pods of one node each: the second replica's messages would cross another link
    pods = PodClusterSpec(**{**vars(NODES_OF_4), "name": "pods", "nodes_per_pod": 1, "inter_pod": SLOW})
    assert E.replica_block(pods, ParallelPlan.parse("gropipe-2x8-1f1b-m8-d1")) is None
    # replicas inside a node repeat on every node, so the pods' slower link only reaches the all-reduce
    block, every = _both(pods, "gropipe-8x2-1f1b-m4-d1")
    assert block.detail["simulated_replicas"] == 2 and block.iteration_ms == pytest.approx(every.iteration_ms)
