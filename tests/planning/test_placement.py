"""Topology-aware placement: optimal among every mapping, heavy boundaries kept off the slow link, simulated."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.core.costs import ClusterSpec, LinkSpec
from workbench.planning.costs.clusters import get_cluster
from workbench.planning.partitioning.placement import naive_devices, place, placed_schedule, placement_cost
from workbench.scheduling.generators import async_1f1b
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts

FAST = LinkSpec("fast", 5.0, 100.0)
SLOW = LinkSpec("slow", 10.0, 5.0)


def two_nodes(per_node: int) -> ClusterSpec:
    return ClusterSpec(f"2x{per_node}", 2, per_node, get_cluster("2x8xH100-IB").device, FAST, SLOW)


def slow_boundaries(device_of, sends, cluster):
    """Bytes of every boundary whose two stages sit on different nodes."""
    return [sends[s] for s in range(len(sends) - 1)
            if cluster.node_of(device_of[s]) != cluster.node_of(device_of[s + 1])]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_chosen_mapping_keeps_heavier_boundaries_off_the_slow_link(data):
    per_node = data.draw(st.integers(1, 4), label="devices per node")
    stages = data.draw(st.integers(2, 2 * per_node), label="stages")
    sends = data.draw(st.lists(st.integers(0, 10**8), min_size=stages, max_size=stages), label="send bytes")
    m = data.draw(st.integers(1, 8), label="micro-batches")
    cluster = two_nodes(per_node)
    chosen = place(sends, cluster, num_microbatches=m)
    naive = naive_devices(stages)
    assert chosen.cost_ms <= chosen.naive_cost_ms + 1e-9
    assert chosen.naive_cost_ms == pytest.approx(placement_cost(naive, sends, cluster, num_microbatches=m))
    if chosen.rejected:
        assert max(slow_boundaries(chosen.device_of, sends, cluster), default=0) <= \
            max(slow_boundaries(naive, sends, cluster), default=0)
    if stages <= 4:  # every mapping of the stages onto the devices, by brute force
        best = min(placement_cost(p, sends, cluster, num_microbatches=m)
                   for p in itertools.permutations(range(cluster.world_size), stages))
        assert chosen.cost_ms == pytest.approx(best, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_replicas_and_allreduce_optimal_against_brute_force(data):
    stages = data.draw(st.integers(2, 3), label="stages")
    sends = data.draw(st.lists(st.integers(0, 10**7), min_size=stages, max_size=stages), label="send bytes")
    grads = data.draw(st.lists(st.integers(0, 10**8), min_size=stages, max_size=stages), label="grad bytes")
    cluster = two_nodes(stages)
    chosen = place(sends, cluster, grad_bytes=grads, num_replicas=2, num_microbatches=4)
    assert sorted(set(chosen.device_of)) == sorted(chosen.device_of)
    best = min(placement_cost(p, sends, cluster, grad_bytes=grads, num_replicas=2, num_microbatches=4)
               for p in itertools.permutations(range(cluster.world_size)))
    assert chosen.cost_ms == pytest.approx(best, rel=1e-9)


def test_heavy_boundary_moves_inside_a_node_and_the_simulator_agrees():
    cluster = two_nodes(2)
    sends = [10**6, 8 * 10**6, 10**5, 0]  # the middle boundary is heavy; naive puts it on the slow link
    chosen = place(sends, cluster, num_microbatches=4)
    assert chosen.rejected and chosen.naive_device_of == (0, 1, 2, 3)
    assert cluster.node_of(chosen.device_of[1]) == cluster.node_of(chosen.device_of[2])
    text = chosen.table()
    assert "stage 1->2" in text and f"{chosen.cost_ms:.3f}" in text
    costs = StageCosts(forward_ms=(1.0,) * 4, backward_ms=(2.0,) * 4, send_bytes=tuple(sends), param_bytes=(0,) * 4,
                       grad_bytes=(0,) * 4, optimizer_bytes=(0,) * 4, activation_bytes=(0,) * 4)
    schedule = async_1f1b(4, 4, 3)
    placed = simulate(placed_schedule(schedule, chosen.device_of, cluster), costs, cluster).metrics["iteration_ms"]
    naive = simulate(placed_schedule(schedule, chosen.naive_device_of, cluster), costs, cluster).metrics["iteration_ms"]
    assert placed < naive


def test_replicated_pipelines_keep_heavy_allreduce_inside_nodes():
    cluster = get_cluster("2x8xH100-IB")
    chosen = place([10**6] * 8, cluster, grad_bytes=[10**8] * 8, num_replicas=2, num_microbatches=4)
    for s in range(8):  # both replicas of every stage on one node: the big all-reduces stay on NVLink
        assert cluster.node_of(chosen.device_of[s]) == cluster.node_of(chosen.device_of[8 + s])
    assert chosen.cost_ms < chosen.naive_cost_ms


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"send_bytes": [1, -1]}, "send_bytes"),
    ({"send_bytes": [1, 2], "grad_bytes": [1]}, "grad_bytes"),
    ({"send_bytes": [1] * 5}, "need 5 devices"),
    ({"send_bytes": [1, 2], "num_microbatches": 0}, "num_microbatches"),
])
def test_bad_input_is_refused_with_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        place(cluster=two_nodes(2), **kwargs)


def test_placement_figure_draws_both_mappings():
    from workbench.viz.placement import placement_figure

    cluster = two_nodes(2)
    chosen = place([10**6, 8 * 10**6, 10**5, 0], cluster, num_microbatches=4)
    fig = placement_figure(chosen, cluster)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == ["chosen mapping", "naive mapping"]
    assert sum(bars[0].x) == pytest.approx(chosen.cost_ms) and sum(bars[1].x) == pytest.approx(chosen.naive_cost_ms)


def test_the_planner_times_a_pipeline_on_the_placement_it_chose_and_the_config_carries_it(monkeypatch):
    """Parameter-heavy stages with light activations: the node-major order puts every stage's all-reduce
    across the nodes; the chosen placement keeps a stage's replicas on one node and cuts the pipeline there."""
    from workbench.core.costs import LayerCost, ModelCosts
    from workbench.core.plan import ParallelPlan
    import importlib

    from workbench.planning import SearchOptions, Workload, plan
    from workbench.planning.costs.clusters import get_cluster
    from workbench.planning.costs.estimate import cost_context, estimate

    mib = 2**20
    costs = ModelCosts("heavy", 8, "synthetic", tuple(
        LayerCost(f"l{i}", 2.0, 4.0, param_bytes=100 * mib, activation_bytes=mib) for i in range(8)), input_bytes=mib)
    cluster = get_cluster("2x8xH100-IB")
    ctx = cost_context(costs, cluster, 64, world_size=16)
    strategy = ParallelPlan.parse("gropipe-4x4-1f1b-m8-d0")
    placed = estimate(ctx, strategy)
    device_of = placed.detail["placement"]
    assert sorted(device_of) == list(range(16)) and device_of != list(range(16))
    # every stage's four replicas on one node: its gradient all-reduce never crosses the slow link
    for stage in range(4):
        assert len({cluster.node_of(device_of[g * 4 + stage]) for g in range(4)}) == 1
    assert placed.detail["placement_saves_ms"] > 0
    monkeypatch.setattr(importlib.import_module("workbench.planning.costs.estimate"), "_placement", lambda *args: None)
    naive = estimate(cost_context(costs, cluster, 64, world_size=16), strategy)
    assert "placement" not in naive.detail and placed.iteration_ms < naive.iteration_ms
    monkeypatch.undo()
    # the run config launches the processes where the estimate put them
    found = plan(Workload(costs, 64), cluster, options=SearchOptions(strategies=[strategy.name])).plans[0]
    assert list(found.to_config().run.placement) == device_of
