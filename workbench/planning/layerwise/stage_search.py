"""Per-layer hybrid parallelism for one pipeline stage: costs of every layer x strategy, and the optimal mix.

Problem. One strategy for every layer wastes either time or memory: a layer
heavy in parameters wants them sharded (FSDP) while a layer heavy in
activations wants them split (tensor parallelism) or recomputed, and a
stage's memory budget couples all the choices. Galvatron (PKU-DAIR) searches
the mix per layer; this module is that search for the workbench: the
strategy set comes from :mod:`.layer_strategies`, the costs from the profile
(:class:`~workbench.core.costs.LayerCost`) and the cluster's links.

The cost model, per layer and strategy on each device of the stage, is
:mod:`.layer_costs` (:func:`layer_cost`, :func:`transition_ms`); the
dynamic programmes over the layers are :mod:`.layer_dp`; both are
re-exported here.

Search (:func:`search_stage`). A dynamic programme over layers whose state is
the layout of the last layer (transitions depend only on layouts). Memory
can be handled two ways: Galvatron's table over memory buckets
(:func:`bucket_dp`; exact only to the bucket, since each layer's memory is
rounded up) or an exact Pareto frontier of (memory, time) per layout
(:func:`pareto_dp`), pruned by the least memory and time the remaining layers
need. ``bench/bench_layerwise_dp.py`` (48 layers x 22 strategies, budget
halfway, pure Python, one core) measured: 1 MiB buckets 1.8-2.0 s (0.06 %
above the optimum), 512 buckets 0.07 s (0.9 % above), the plain frontier
0.6-0.75 s (exact), and the frontier bounded by the time of a 128-bucket answer
(feasible, so an upper bound) 0.14 s including that answer, exact. The last
is what :func:`search_stage` runs: exact, and faster than any table that is
nearly as good. It first asks the programme without the budget
(:func:`~.layer_dp.least_time`, one point per layout): when that fastest
assignment fits, its time is the optimum's and bounds the frontier in place
of the bucket answer. A bound only prunes points that cannot reach it, so the
answer is the same whichever bound is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ...core.fields import number
from ...core.plan import LayerPlan
from .layer_strategies import LayerStrategy, for_layer, stage_strategies
from .layer_costs import (DDP_BUCKET_BYTES, MIB, LayerChoiceCost, StageSpec, _error, layer_cost, paying_steps,
                          transition_ms)
from .layer_dp import Option, bucket_dp, least_time, pareto_dp

__all__ = ["StageSpec", "LayerChoiceCost", "StageAssignment", "NoFit", "layer_cost", "transition_ms",
           "paying_steps", "assignment_cost", "search_stage", "pareto_dp", "bucket_dp"]

BOUND_BUCKETS = 128  # the coarse table whose answer bounds the exact search (fastest in bench_layerwise_dp)
BOUNDED = True  # bound the exact search by a feasible answer's time; False: the plain frontier (tests compare)


class NoFit(ValueError):
    """No assignment fits the budget; ``needed_bytes`` is the least memory any assignment needs."""

    def __init__(self, message: str, needed_bytes: float) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes


@dataclass(frozen=True)
class StageAssignment:
    """The chosen strategy of every layer of a stage, what it costs and what each layer contributes."""

    strategies: tuple[LayerStrategy, ...]
    time_ms: float
    memory_bytes: int
    layer_costs: tuple[LayerChoiceCost, ...]
    transition_ms: float

    def layer_plans(self) -> tuple[LayerPlan, ...]:
        """The plan's per-layer options."""
        return tuple(s.to_layer_plan() for s in self.strategies)


def assignment_cost(spec: StageSpec, strategies: Sequence[LayerStrategy]) -> StageAssignment:
    """What one given per-layer assignment costs (what the search minimises)."""
    if len(strategies) != len(spec.layer_costs):
        raise _error("strategies", f"{len(strategies)} strategies", f"one per layer of the stage "
                     f"({len(spec.layer_costs)})")
    classes, found, moves = spec.layer_classes(), [], 0.0 if len(strategies) > 1 else 0
    for i, s in enumerate(strategies):
        if i and s is strategies[i - 1]:  # the same strategy again: no move, and a layer of the same class
            found.append(found[-1] if classes[i] == classes[i - 1] else layer_cost(spec, i, s))
            continue  # equal layouts move nothing (0.0, as transition_ms says)
        found.append(layer_cost(spec, i, s))
        if i and s.layout != strategies[i - 1].layout:
            moves += transition_ms(spec, i, strategies[i - 1], s)
    costs = tuple(found)
    return StageAssignment(tuple(strategies), sum(c.time_ms for c in costs) + moves,
                           sum(c.memory_bytes for c in costs), costs, moves)


def search_stage(spec: StageSpec, strategies: Sequence[LayerStrategy] | None = None,
                 budget_bytes: float | None = None, *, method: str = "pareto") -> StageAssignment:
    """The fastest per-layer assignment whose memory fits ``budget_bytes`` (default: the device's memory).

    ``strategies``: the candidates for every layer (default: the stage's
    Galvatron set with and without recomputation); each layer keeps those
    its kind admits. ValueError, naming the shortfall, when nothing fits.
    """
    if method not in ("pareto", "buckets"):
        raise _error("method", method, "'pareto' (exact) or 'buckets' (Galvatron's table, 1 MiB units)")
    budget = spec.cluster.device.memory_bytes if budget_bytes is None else budget_bytes
    if not number(0).accepts(budget):
        raise _error("budget_bytes", budget_bytes, "a number of bytes >= 0")
    pool = stage_strategies(spec.devices, recompute=(False, True)) if strategies is None else tuple(strategies)
    for s in pool:
        if not isinstance(s, LayerStrategy) or s.devices != spec.devices:
            raise _error("strategies", s, f"LayerStrategy values for a stage of {spec.devices} devices")
    per_layer, options = [], []
    made: dict[int, tuple[tuple[LayerStrategy, ...], list[Option]]] = {}  # per class of layers: they cost alike
    for i, group in enumerate(spec.layer_classes()):
        if group not in made:
            allowed = for_layer(pool, spec.kind(i))
            if not allowed:
                raise _error("strategies", f"{len(pool)} strategies", f"none runs layer {spec.layer_costs[i].name!r} "
                             f"({spec.kind(i).name}, no {'/'.join(sorted({s.tp for s in pool}))} tensor parallelism)")
            costs = [layer_cost(spec, i, s) for s in allowed]
            made[group] = allowed, [(c.time_ms, c.memory_bytes, s.layout) for c, s in zip(costs, allowed)]
        per_layer.append(made[group][0])
        options.append(made[group][1])
    layouts = {s.layout: s for s in pool}
    move = lambda l, a, b: transition_ms(spec, l, layouts[a], layouts[b])  # noqa: E731
    if method == "buckets":
        found = bucket_dp(options, move, budget)
    elif not BOUNDED:
        found = pareto_dp(options, move, budget)
    else:  # a feasible answer's time bounds the exact search: the fastest one if it fits, else a coarse bucket one
        free = least_time(options, move)
        if free[1] <= budget:
            bound = free[0] * (1 + 1e-9)  # the optimum's time, give or take the order of the additions
        else:
            coarse = bucket_dp(options, move, budget, resolution=BOUND_BUCKETS)
            bound = coarse[0] * (1 + 1e-9) if coarse and coarse[1] <= budget else math.inf
        found = pareto_dp(options, move, budget, bound)
    if found is None:
        least = sum(min(o[1] for o in layer) for layer in options)
        first, last = spec.layers
        short = least - budget
        raise NoFit(f"no per-layer assignment of layers {first}-{last} fits budget_bytes = {budget:.0f}: the "
                    f"least memory any needs is {least} bytes, {short:.0f} bytes ({short / MIB:.1f} MiB) over"
                    + ("" if short > 0 else " after rounding to buckets"), least)
    return assignment_cost(spec, [per_layer[i][k] for i, k in enumerate(found[2])])
