"""Lesson 03, profile and partition: every cut of a model evaluated, AMPA's against the one with the shortest
simulated iteration."""

from __future__ import annotations

from itertools import combinations
from typing import Any

from ..core.partition import Partition


def every_cut(editor: Any) -> list[Any]:
    """The editor's state for every cut of its model into its stages that fits its memory cap (all of them
    without one)."""
    layers = editor.costs.num_layers
    cuts = combinations(range(1, layers), editor.num_virtual_stages - 1)
    states = [editor.evaluate(Partition.from_cuts(list(cut), layers)) for cut in cuts]
    cap = editor.memory_cap
    return [s for s in states if cap is None or max(s.result.stage_memory_bytes) <= cap]


def shortest_iteration(editor: Any) -> tuple[Any, Any]:
    """AMPA's cut and the cut with the shortest simulated iteration among those that fit in memory.

    Raises AssertionError when a cut that fits has a faster bottleneck than AMPA's: AMPA is exact for it."""
    fitting = every_cut(editor)
    fastest = min(s.bottleneck_ms for s in fitting)
    if fastest < editor.optimum.bottleneck_ms - 1e-9:
        raise AssertionError(f"a cut has a bottleneck of {fastest} ms, under AMPA's {editor.optimum.bottleneck_ms}")
    return editor.evaluate(editor.optimum.partition), min(fitting, key=lambda s: s.iteration_ms)


def compare_cuts(ampa_state: Any, shortest: Any) -> str:
    """AMPA's cut against the cut with the shortest iteration, in one sentence."""
    head = (f"AMPA's cut {ampa_state.partition}: bottleneck {ampa_state.bottleneck_ms:.2f} ms, "
            f"iteration {ampa_state.iteration_ms:.2f} ms")
    if shortest.iteration_ms >= ampa_state.iteration_ms:
        return head + "; no other cut simulates a shorter iteration"
    return (head + f"; the cut {shortest.partition} simulates a shorter iteration, {shortest.iteration_ms:.2f} ms "
            f"({1 - shortest.iteration_ms / ampa_state.iteration_ms:.1%} less), with a slower bottleneck, "
            f"{shortest.bottleneck_ms:.2f} ms ({shortest.gap:+.1%})")
