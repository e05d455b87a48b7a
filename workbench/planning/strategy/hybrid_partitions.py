"""Where a fine-grained hybrid plan cuts the model into stages: the partition candidates of
:mod:`.hybrid`'s docstring, each searched per layer (or costed for a template's strategy).

Pure Python.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from .hybrid_results import HybridEstimate
from .hybrid_stages import _as_template, _evaluate, _Search
from ..layerwise.layer_strategies import LayerStrategy, for_layer
from ..layerwise.layer_costs import LayerChoiceCost, layer_cost

def _split(weights: Sequence[float], parts: int) -> list[tuple[int, int]] | None:
    """Contiguous split of ``weights`` into ``parts`` non-empty runs minimising the largest run's sum (of equally
    good splits, the one :func:`_split_by_stage` finds)."""
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    if parts > len(weights) or any(w < 0 for w in weights):
        return _split_by_stage(lambda _k, a, b: prefix[b + 1] - prefix[a], len(weights), parts)
    return _cuts(_split_by_sums(prefix, len(weights), parts), len(weights), parts)


def _split_once(search: _Search, weights: Sequence[float], parts: int) -> list[tuple[int, int]] | None:
    """:func:`_split`, once per distinct weights in a search."""
    key = (tuple(weights), parts)
    if key not in search.splits:
        search.splits[key] = _split(weights, parts)
    return search.splits[key]


def _split_by_sums(prefix: Sequence[float], n: int, parts: int) -> list[list[int]]:
    """:func:`_split_by_stage`'s table of cuts for a stage cost ``prefix[last + 1] - prefix[first]`` of
    non-negative weights, in time linear in the layers per stage count.

    For k runs ending at ``end``, the scan keeps the largest start ``s`` of least ``max(before[s], last run)``,
    where ``before[s]`` (the best of the first ``s`` layers in k - 1 runs) never falls as ``s`` grows and the
    last run's sum never rises. The least sits where the two cross: at ``s0``, the last start whose ``before``
    is at most its last run, or at ``s0 + 1`` and the starts after it with the same ``before``, whichever is
    less (the later on a tie). ``s0`` only moves up as ``end`` does.
    """
    inf = math.inf
    best, cut = _tables(n, parts)
    for k in range(1, parts + 1):
        before, here, row = best[k - 1], best[k], cut[k]
        ends = range(k, n - (parts - k) + 1) if k < parts else range(n, n + 1)
        if k == 1:  # one stage starts at layer 0
            for end in ends:
                here[end] = max(before[0], prefix[end] - prefix[0])
            continue
        s0 = k - 2
        for end in ends:
            total = prefix[end]
            while s0 + 1 < end and before[s0 + 1] <= total - prefix[s0 + 1]:
                s0 += 1
            last = max(before[s0], total - prefix[s0]) if s0 >= k - 1 else inf
            s = s0 + 1
            if s < end and before[s] <= last:
                value = before[s]
                while s + 1 < end and before[s + 1] == value:  # the last start of before's run of this value
                    s += 1
                here[end], row[end] = value, s
            else:
                here[end], row[end] = last, s0
    return cut


def _tables(n: int, parts: int) -> tuple[list[list[float]], list[list[int]]]:
    """The split's tables, empty: the best largest cost of the first ``end`` layers in k stages (0 for none in
    none) and where the k-th stage starts."""
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    return best, [[0] * (n + 1) for _ in range(parts + 1)]


def _cuts(cut: list[list[int]], n: int, parts: int) -> list[tuple[int, int]]:
    """The split read back from a table of cuts: ``cut[k][end]`` starts the k-th stage of the first ``end``."""
    bounds, end = [], n
    for k in range(parts, 0, -1):
        start = cut[k][end]
        bounds.append((start, end - 1))
        end = start
    return bounds[::-1]


def _split_by_stage(cost: Callable[[int, int, int], float], n: int, parts: int) -> list[tuple[int, int]] | None:
    """Contiguous split of ``n`` layers into ``parts`` stages minimising the largest ``cost(stage, first, last)``.

    ``cost`` must not decrease as a stage takes more layers (times and memory do not), so scanning the start of
    the last stage downwards can stop once that stage alone costs as much as the best split found. The first
    stage starts at layer 0, and of the last only the split that ends at the last layer is wanted.
    """
    if parts > n:
        return None
    best, cut = _tables(n, parts)
    for k in range(1, parts + 1):
        before, here, row = best[k - 1], best[k], cut[k]
        for end in (range(k, n - (parts - k) + 1) if k < parts else (n,)):
            for start in (range(end - 1, k - 2, -1) if k > 1 else (0,)):  # one stage: it starts at layer 0
                last = cost(k - 1, start, end - 1)
                if last >= here[end]:
                    break
                value = max(before[start], last)
                if value < here[end]:
                    here[end], row[end] = value, start
    return _cuts(cut, n, parts)


def _fastest_times(search: _Search, pp: int, m: int, strategy: LayerStrategy | None) -> list[float]:
    """Each layer's fastest time in a stage of this pipeline (memory ignored), or its template time."""
    return _per_layer(search, pp, m, 0, strategy, lambda costs: min(c.time_ms for c in costs))


def _least_memory(search: _Search, pp: int, m: int, strategy: LayerStrategy | None) -> list[tuple[float, float]]:
    """Per layer (state bytes, activation bytes per in-flight micro-batch) of its leanest option: the least
    memory on the fullest stage (at least ``pp`` micro-batches in flight; ZB-H2's ``2 pp - 1``)."""
    counts = search.in_flight(pp, m)
    held, last = max(pp, *counts), counts[-1]  # costed on the last stage, which holds the fewest
    return _per_layer(search, pp, m, pp - 1, strategy,
                      lambda costs: min(((c.state_bytes, c.activation_bytes / last) for c in costs),
                                        key=lambda sa: sa[0] + held * sa[1]))


def _per_layer(search: _Search, pp: int, m: int, stage: int, strategy: LayerStrategy | None,
               pick: Callable[[list[LayerChoiceCost]], Any]) -> list:
    """``pick`` of each layer's costs (on a stage ``stage`` holding every layer) under the pool, or under the
    template's strategy; once per class of layers (they cost the same)."""
    spec = search.spec(pp, m, stage, 0, search.costs.num_layers - 1)
    pool = search.pool(spec.devices)
    picked: dict[int, Any] = {}
    out = []
    for i, group in enumerate(spec.layer_classes()):
        if group not in picked:
            kind = spec.kind(i)
            options = [_as_template(strategy, kind)] if strategy is not None else for_layer(pool, kind)
            picked[group] = pick([layer_cost(spec, i, s) for s in options])
        out.append(picked[group])
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

    first = attempt(_split_once(search, _fastest_times(search, pp, m, strategy), pp))
    if first is not None:  # balance the chosen times (transitions counted on the layer they enter)
        chosen = [c.time_ms for s in first.stages for c in s.assignment.layer_costs]
        attempt(_split_once(search, chosen, pp))
        return found
    least = _least_memory(search, pp, m, strategy)
    prefix_state, prefix_act = [0.0], [0.0]
    for state, act in least:
        prefix_state.append(prefix_state[-1] + state)
        prefix_act.append(prefix_act[-1] + act)
    held = search.in_flight(pp, m)
    memory = lambda k, a, b: (prefix_state[b + 1] - prefix_state[a]) \
        + held[k] * (prefix_act[b + 1] - prefix_act[a])  # noqa: E731
    # no plan on the time-balanced split: some stage of it does not fit even at its leanest
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
