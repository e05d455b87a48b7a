"""Where a fine-grained hybrid plan cuts the model into stages: the partition candidates of
:mod:`.hybrid`'s docstring, each searched per layer (or costed for a template's strategy).

Pure Python.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from .hybrid_results import HybridEstimate
from .hybrid_stages import _as_template, _evaluate, _Search
from ..layerwise.layer_strategies import LayerStrategy, for_layer
from ..layerwise.layer_costs import layer_cost

def _split(weights: Sequence[float], parts: int) -> list[tuple[int, int]] | None:
    """Contiguous split of ``weights`` into ``parts`` non-empty runs minimising the largest run's sum."""
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    return _split_by_stage(prefix, len(weights), parts)


def _split_by_stage(cost: Callable[[int, int, int], float] | Sequence[float], n: int,
                    parts: int) -> list[tuple[int, int]] | None:
    """Contiguous split of ``n`` layers into ``parts`` stages minimising the largest ``cost(stage, first, last)``,
    or, given prefix sums as ``cost``, the largest ``cost[last + 1] - cost[first]``.

    ``cost`` must not decrease as a stage takes more layers (times and memory do not), so scanning the start of
    the last stage downwards can stop once that stage alone costs as much as the best split found. The first
    stage starts at layer 0, and of the last only the split that ends at the last layer is wanted.
    """
    if parts > n:
        return None
    inf, prefix = math.inf, None if callable(cost) else cost
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        before, here, row = best[k - 1], best[k], cut[k]
        for end in (range(k, n - (parts - k) + 1) if k < parts else (n,)):
            for start in (range(end - 1, k - 2, -1) if k > 1 else (0,)):  # one stage: it starts at layer 0
                if prefix is not None:
                    last = prefix[end] - prefix[start]
                else:
                    last = cost(k - 1, start, end - 1)  # type: ignore[operator]
                if last >= here[end]:
                    break
                value = max(before[start], last)
                if value < here[end]:
                    here[end], row[end] = value, start
    bounds, end = [], n
    for k in range(parts, 0, -1):
        start = cut[k][end]
        bounds.append((start, end - 1))
        end = start
    return bounds[::-1]


def _fastest_times(search: _Search, pp: int, m: int, strategy: LayerStrategy | None) -> list[float]:
    """Each layer's fastest time in a stage of this pipeline (memory ignored), or its template time."""
    spec = search.spec(pp, m, 0, 0, search.costs.num_layers - 1)
    pool = search.pool(spec.devices)
    out = []
    for i in range(search.costs.num_layers):
        options = [_as_template(strategy, spec.kind(i))] if strategy is not None else for_layer(pool, spec.kind(i))
        out.append(min(layer_cost(spec, i, s).time_ms for s in options))
    return out


def _least_memory(search: _Search, pp: int, m: int, strategy: LayerStrategy | None) -> list[tuple[float, float]]:
    """Per layer (state bytes, activation bytes per in-flight micro-batch) of its leanest option."""
    spec = search.spec(pp, m, pp - 1, 0, search.costs.num_layers - 1)  # in_flight 1
    pool = search.pool(spec.devices)
    out = []
    for i in range(search.costs.num_layers):
        options = [_as_template(strategy, spec.kind(i))] if strategy is not None else for_layer(pool, spec.kind(i))
        costs = [layer_cost(spec, i, s) for s in options]
        out.append(min(((c.state_bytes, c.activation_bytes) for c in costs), key=lambda sa: sa[0] + pp * sa[1]))
    return out


def _partitions(search: _Search, template: str, strategy: LayerStrategy | None, pp: int, m: int,
                seen: set[tuple]) -> list[HybridEstimate]:
    """The plans of the partition candidates of :mod:`.hybrid`'s docstring (one list entry per feasible split);
    ``seen`` collects the splits tried."""
    num = search.costs.num_layers
    if pp == 1:
        seen.add(((0, num - 1),))
        plan = _evaluate(search, template, strategy, 1, m, [(0, num - 1)])
        return [plan] if plan else []
    found: list[HybridEstimate] = []

    def attempt(bounds: list[tuple[int, int]] | None) -> HybridEstimate | None:
        if bounds is None or tuple(bounds) in seen:
            return None
        seen.add(tuple(bounds))
        plan = _evaluate(search, template, strategy, pp, m, bounds)
        if plan is not None:
            found.append(plan)
        return plan

    first = attempt(_split(_fastest_times(search, pp, m, strategy), pp))
    if first is not None:  # balance the chosen times (transitions counted on the layer they enter)
        chosen = [c.time_ms for s in first.stages for c in s.assignment.layer_costs]
        attempt(_split(chosen, pp))
    least = _least_memory(search, pp, m, strategy)
    prefix_state, prefix_act = [0.0], [0.0]
    for state, act in least:
        prefix_state.append(prefix_state[-1] + state)
        prefix_act.append(prefix_act[-1] + act)
    held = search.in_flight(pp, m)
    memory = lambda k, a, b: (prefix_state[b + 1] - prefix_state[a]) \
        + held[k] * (prefix_act[b + 1] - prefix_act[a])  # noqa: E731
    if first is None:  # some stage of the time-balanced split does not fit even at its leanest
        times = _fastest_times(search, pp, m, strategy)
        prefix_time = [0.0]
        for t in times:
            prefix_time.append(prefix_time[-1] + t)
        fits = lambda k, a, b: (prefix_time[b + 1] - prefix_time[a]  # noqa: E731
                                if memory(k, a, b) <= search.budget else math.inf)
        bounds = _split_by_stage(fits, num, pp)
        if bounds is None or any(memory(k, a, b) > search.budget for k, (a, b) in enumerate(bounds)):
            bounds = _split_by_stage(memory, num, pp)  # nothing balances time under the budget: balance memory
        attempt(bounds)
    return found
