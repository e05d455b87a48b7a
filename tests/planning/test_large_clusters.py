"""The planner on clusters of real size: the large presets accepted, placement across the pods of a cluster."""

from __future__ import annotations

import itertools

import pytest

from workbench.core.costs import ClusterSpec, LinkSpec, ModelCosts
from workbench.core.pods import PodClusterSpec
from workbench.planning.costs.clusters import get_cluster
from workbench.planning.partitioning.placement import place, placement_cost

FAST, MEDIUM, SLOW = LinkSpec("fast", 5.0, 100.0), LinkSpec("medium", 10.0, 20.0), LinkSpec("slow", 20.0, 2.0)
LARGE = ["4x8xH100-IB", "16x8xH100-IB", "64x8xH100-IB", "128x8xH100-IB", "32x8xA100-IB", "4pod-32x8xH100"]


def pods(num_nodes: int = 4, per_node: int = 1, per_pod: int = 2) -> PodClusterSpec:
    return PodClusterSpec("pods", num_nodes, per_node, get_cluster("1xH100").device, FAST, MEDIUM,
                          nodes_per_pod=per_pod, inter_pod=SLOW)


def cheapest(sends, cluster, **kwargs) -> float:
    """The least cost over every mapping of the (replica, stage) pairs onto distinct devices."""
    n = len(sends) * kwargs.get("num_replicas", 1)
    return min(placement_cost(devices, sends, cluster, **kwargs)
               for devices in itertools.permutations(range(cluster.world_size), n))


@pytest.mark.parametrize("sends, per_node", [([10**7, 10**3, 10**7], 1), ([10**3, 10**7, 10**3], 1),
                                            ([10**5, 10**7, 10**3], 2)])
def test_placement_on_pods_is_the_cheapest_mapping_and_keeps_heavy_boundaries_inside_a_pod(sends, per_node):
    sends = sends + [0]
    cluster = pods(per_node=per_node)
    chosen = place(sends, cluster, num_microbatches=4)
    assert chosen.cost_ms == pytest.approx(cheapest(sends, cluster, num_microbatches=4))
    heavy = max(range(len(sends) - 1), key=lambda s: sends[s])
    a, b = (cluster.node_of(chosen.device_of[s]) for s in (heavy, heavy + 1))
    assert cluster.pod_of_node(a) == cluster.pod_of_node(b)
    assert "slow" not in {row["link"] for row in chosen.rows if row["bytes"] == 8 * sends[heavy]}


def test_placement_with_replicas_on_pods_is_the_cheapest_mapping():
    cluster = pods(num_nodes=4, per_node=1, per_pod=2)
    sends, grads = [10**6, 0], [10**8, 10**3]
    chosen = place(sends, cluster, grad_bytes=grads, num_replicas=2, num_microbatches=2)
    assert chosen.cost_ms == pytest.approx(cheapest(sends, cluster, grad_bytes=grads, num_replicas=2,
                                                    num_microbatches=2))


def test_one_pod_places_as_the_plain_cluster_does():
    plain = ClusterSpec("plain", 4, 2, get_cluster("1xH100").device, FAST, MEDIUM)
    one_pod = pods(num_nodes=4, per_node=2, per_pod=4)
    for sends, replicas in (([10**6, 10**3, 10**7, 0], 1), ([10**6, 0], 3)):
        a = place(sends, plain, num_replicas=replicas, num_microbatches=3, grad_bytes=[10**5] * len(sends))
        b = place(sends, one_pod, num_replicas=replicas, num_microbatches=3, grad_bytes=[10**5] * len(sends))
        assert (a.device_of, a.cost_ms) == (b.device_of, b.cost_ms)


def _costs(tmp_path) -> str:
    costs = ModelCosts.uniform(4, forward_ms=1.0, backward_ms=2.0, param_bytes=1 << 20, activation_bytes=1 << 16,
                               batch_size=8)
    return str(costs.save(tmp_path / "costs.json"))


@pytest.mark.parametrize("name", LARGE)
def test_the_cli_plans_on_the_large_presets(tmp_path, capsys, name):
    from workbench.cli import main

    assert main(["plan", _costs(tmp_path), "--cluster", name, "--batch", "64", "--world-size", "16", "--top", "2"]) == 0
    assert f"on {name} (16 devices)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["128x8xH100-IB", "4pod-32x8xH100"])
def test_the_cli_plans_on_all_1024_devices(tmp_path, capsys, name):
    from workbench.cli import main

    assert main(["plan", _costs(tmp_path), "--cluster", name, "--batch", "1024", "--top", "2"]) == 0
    assert f"on {name} (1024 devices)" in capsys.readouterr().out
