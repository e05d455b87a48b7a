"""Lesson 03's helpers: every cut evaluated, AMPA's against the shortest iteration, in words."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workbench.core.costs import LayerCost, ModelCosts
from workbench.core.partition import Partition
from workbench.lessons.partitioning import compare_cuts, every_cut, shortest_iteration
from workbench.widgets.partition_editor import PartitionEditor


def _made_up_editor() -> PartitionEditor:
    """Lesson 03's made-up model: big activations out of the first three layers, a slower bottleneck is faster."""
    costs = ModelCosts("made-up", 16, "synthetic", tuple(
        LayerCost(f"layer{i}", forward, backward, param_bytes=2**20, activation_bytes=activation, saved_bytes=2**20)
        for i, (forward, backward, activation) in enumerate([(2.6, 4.8, 2**22), (0.6, 5.8, 2**22), (1.5, 4.9, 2**22),
                                                              (2.9, 2.8, 2**16), (1.8, 2.4, 2**16),
                                                              (2.0, 2.2, 2**16)])))
    return PartitionEditor(costs, num_stages=3, num_microbatches=8, schedule="1f1b", cluster="local-cpu", models=[])


def test_the_shortest_iteration_can_have_a_slower_bottleneck_than_ampas():
    editor = _made_up_editor()
    cuts = every_cut(editor)
    assert len(cuts) == 10  # 6 layers into 3 stages: C(5, 2) cuts, all fitting without a cap
    ampa, shortest = shortest_iteration(editor)
    assert ampa.partition == editor.optimum.partition
    assert shortest.iteration_ms == min(s.iteration_ms for s in cuts) < ampa.iteration_ms
    assert shortest.bottleneck_ms > ampa.bottleneck_ms
    text = compare_cuts(ampa, shortest)
    assert text.startswith(f"AMPA's cut {ampa.partition}: bottleneck {ampa.bottleneck_ms:.2f} ms")
    assert f"the cut {shortest.partition} simulates a shorter iteration, {shortest.iteration_ms:.2f} ms" in text
    assert f"({1 - shortest.iteration_ms / ampa.iteration_ms:.1%} less), with a slower bottleneck" in text


def test_the_comparison_says_when_no_cut_is_shorter():
    state = SimpleNamespace(partition="0-1|2-3", bottleneck_ms=2.0, iteration_ms=10.0)
    assert compare_cuts(state, state) == ("AMPA's cut 0-1|2-3: bottleneck 2.00 ms, iteration 10.00 ms; "
                                          "no other cut simulates a shorter iteration")


def _fake_editor(bottlenecks: dict[tuple[int, ...], float], optimum_ms: float, cap=None, memory=None):
    def evaluate(partition):
        cut = tuple(partition.cuts)
        used = (memory or {}).get(cut, 1)
        return SimpleNamespace(partition=partition, bottleneck_ms=bottlenecks.get(cut, optimum_ms),
                               iteration_ms=10.0 + bottlenecks.get(cut, optimum_ms),
                               result=SimpleNamespace(stage_memory_bytes=[used]))
    return SimpleNamespace(costs=SimpleNamespace(num_layers=3), num_virtual_stages=2, memory_cap=cap,
                           evaluate=evaluate,
                           optimum=SimpleNamespace(bottleneck_ms=optimum_ms, partition=Partition.from_cuts([2], 3)))


def test_a_cut_faster_than_ampas_bottleneck_is_an_error_unless_it_does_not_fit():
    with pytest.raises(AssertionError, match="under AMPA's"):
        shortest_iteration(_fake_editor({(1,): 4.0, (2,): 6.0}, optimum_ms=5.0))
    # the faster cut does not fit the cap: it is left out, and nothing is wrong
    editor = _fake_editor({(1,): 4.0, (2,): 6.0}, optimum_ms=5.0, cap=10, memory={(1,): 11})
    assert [s.bottleneck_ms for s in every_cut(editor)] == [6.0]
    _, shortest = shortest_iteration(editor)
    assert shortest.bottleneck_ms == 6.0
