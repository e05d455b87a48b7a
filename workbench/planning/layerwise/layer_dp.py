"""Dynamic programmes over a stage's layers under a memory budget: one option per layer, least time.

Each layer offers options ``(time_ms, memory_bytes, layout)``; entering a
layer in another layout than the previous layer's costs a transition. The
exact Pareto frontier of (memory, time) per layout (:func:`pareto_dp`) and
Galvatron's table over memory buckets (:func:`bucket_dp`) both answer with
the chosen option of every layer; :func:`least_time` is the programme
without the budget (a lower bound on the time, and the answer when it fits).
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Callable, Hashable, Sequence

from ...core.fields import integer, optional
from .layer_costs import MIB, _error

__all__ = ["Option", "pareto_dp", "bucket_dp", "least_time"]

Option = tuple[float, float, Hashable]  # (time_ms, memory_bytes, layout) of one strategy for one layer


def pareto_dp(options: Sequence[Sequence[Option]], transition: Callable[[int, Hashable, Hashable], float],
              budget: float, upper_bound: float = math.inf) -> tuple[float, float, list[int]] | None:
    """Least-time choice of one option per layer with total memory <= ``budget``, exactly (None if none fits).

    ``transition(l, a, b)`` (>= 0): the cost of entering layer ``l`` in
    layout ``b`` after layout ``a``. Per layout the state is the Pareto
    frontier of (memory, time) over the choices so far. A point survives
    only if the remaining layers' least memory still fits and, given the
    time of a known feasible assignment (``upper_bound``), only if their
    least time does not push it past that bound: both bounds are exact, so
    the optimum is never pruned. A point is ``(memory, time, (option,
    previous point))``, so the winner's choices are read back along its chain.
    """
    if not options or any(not layer for layer in options):
        raise _error("options", options, "every layer needs at least one (time, memory, layout) option")
    rest_memory, rest_time = [0.0] * (len(options) + 1), [0.0] * (len(options) + 1)  # least of layers l..
    for l in range(len(options) - 1, -1, -1):
        rest_memory[l] = rest_memory[l + 1] + min(o[1] for o in options[l])
        rest_time[l] = rest_time[l + 1] + min(o[0] for o in options[l])
    fronts: dict[Hashable, list] = {None: [(0.0, 0.0, None)]}
    for l, layer in enumerate(options):
        arrive = {}
        for key in dict.fromkeys(o[2] for o in layer):
            moved = []
            for prev, front in fronts.items():
                r = transition(l, prev, key) if l else 0.0
                moved += [(mem, time + r, node) for mem, time, node in front] if r else front
            arrive[key] = _frontier(moved)
        memory_limit, time_limit = budget - rest_memory[l + 1], upper_bound - rest_time[l + 1]
        grown = {}
        for index, (time_ms, mem_bytes, key) in enumerate(layer):
            points = grown.setdefault(key, [])
            for mem, time, node in arrive[key]:
                if mem + mem_bytes > memory_limit:
                    break  # the frontier is sorted by memory, time falling
                if time + time_ms <= time_limit:
                    points.append((mem + mem_bytes, time + time_ms, (index, node)))
        fronts = {key: _frontier(points) for key, points in grown.items() if points}
        if not fronts:
            return None
    mem, time, node = min((p for front in fronts.values() for p in front), key=itemgetter(1, 0))
    picks = []
    while node is not None:
        index, node = node
        picks.append(index)
    return time, mem, picks[::-1]


def least_time(options: Sequence[Sequence[Option]],
               transition: Callable[[int, Hashable, Hashable], float]) -> tuple[float, float, list[int]]:
    """Least-time choice of one option per layer, memory ignored (of equally fast choices, one of the least
    memory); ``(time, memory, picks)`` as :func:`pareto_dp` answers. Per layout the state is one point.
    ``transition`` must be >= 0, and 0 between equal layouts."""
    if not options or any(not layer for layer in options):
        raise _error("options", options, "every layer needs at least one (time, memory, layout) option")
    best: dict[Hashable, tuple[float, float, tuple | None]] = {None: (0.0, 0.0, None)}
    for l, layer in enumerate(options):
        arrive = {}
        for key in dict.fromkeys(o[2] for o in layer):
            chosen = best.get(key) if l else None  # staying in the layout costs nothing
            for prev, point in best.items():
                if chosen is not None and (point[0] > chosen[0] or point[0] == chosen[0] and point[1] >= chosen[1]):
                    continue  # a move costs >= 0: it cannot beat the point in hand
                if l and (r := transition(l, prev, key)):
                    point = (point[0] + r, point[1], point[2])
                if chosen is None or point[0] < chosen[0] or (point[0] == chosen[0] and point[1] < chosen[1]):
                    chosen = point
            arrive[key] = chosen
        grown: dict[Hashable, tuple[float, float, tuple | None]] = {}
        for index, (time_ms, mem_bytes, key) in enumerate(layer):
            time, mem, node = arrive[key]
            time, mem = time + time_ms, mem + mem_bytes
            here = grown.get(key)
            if here is None or time < here[0] or (time == here[0] and mem < here[1]):
                grown[key] = (time, mem, (index, node))
        best = grown
    time, mem, node = min(best.values(), key=itemgetter(0, 1))
    picks = []
    while node is not None:
        index, node = node
        picks.append(index)
    return time, mem, picks[::-1]


def _frontier(points: list) -> list:
    """The points no other point beats in both memory and time, by memory ascending."""
    points.sort(key=itemgetter(0, 1))
    out, best = [], math.inf
    for p in points:
        if p[1] < best:
            out.append(p)
            best = p[1]
    return out


def bucket_dp(options: Sequence[Sequence[Option]], transition: Callable[[int, Hashable, Hashable], float],
              budget: float, resolution: int | None = None) -> tuple[float, float, list[int]] | None:
    """Galvatron's dynamic programme over memory buckets: ``best[layout][e]`` = least time with at most ``e``
    units of ``budget / resolution`` used (default: 1 MiB units). Each option's memory is rounded up to
    whole units, so a result always fits but one that fits only exactly may be missed. O(L x E x options).

    Of equally fast choices it returns the one whose last layer's layout comes first (in the order the
    last layer's options name them), then the fewest units, then, layer by layer from the last, the
    earliest option and the earliest previous layout."""
    if not options or any(not layer for layer in options):
        raise _error("options", options, "every layer needs at least one (time, memory, layout) option")
    if not optional(integer(1)).accepts(resolution):
        raise _error("resolution", resolution, "an int >= 1 (buckets of budget / resolution), or None for 1 MiB")
    if budget < 0:
        return None
    size = max(1, math.ceil(budget / MIB)) if resolution is None else resolution
    unit, inf = max(budget / size, 1e-9), math.inf
    # rounded up, so never over the budget; a whole number of units the division lands a hair above stays that number
    needs = [[math.ceil(o[1] / unit - 1e-9) for o in layer] for layer in options]
    tables: list[dict[Hashable, list[float]]] = []
    previous: dict[Hashable, list[float]] = {None: [0.0] * (size + 1)}
    for l, layer in enumerate(options):
        arrive = {}
        for key in dict.fromkeys(o[2] for o in layer):
            shifted = [row if not l or not (r := transition(l, prev, key)) else [x + r for x in row]
                       for prev, row in previous.items()]
            arrive[key] = shifted[0] if len(shifted) == 1 else list(map(min, *shifted))
        table: dict[Hashable, list[float]] = {}
        for (time_ms, _, key), need in zip(layer, needs[l]):
            if need > size:
                continue
            row = [inf] * need + [x + time_ms for x in arrive[key][:size + 1 - need]]
            table[key] = list(map(min, table[key], row)) if key in table else row
        if not table:
            return None
        tables.append(table)
        previous = table
    key = min(previous, key=lambda k: previous[k][size])
    best = previous[key][size]
    if best == inf:
        return None
    picks, e = [], previous[key].index(best)  # the fewest units that reach it (each row falls with e)
    for l in range(len(options) - 1, -1, -1):  # redo each cell's arithmetic to find the option it came from
        target = tables[l][key][e]
        before = tables[l - 1] if l else {None: [0.0] * (size + 1)}
        step = next((index, prev, need) for index, ((time_ms, _, k), need) in enumerate(zip(options[l], needs[l]))
                    if k == key and need <= e for prev, row in before.items()
                    if _shifted(row[e - need], transition(l, prev, key) if l else 0.0) + time_ms == target)
        picks.append(step[0])
        key, e = step[1], e - step[2]
    picks.reverse()
    return best, sum(options[l][i][1] for l, i in enumerate(picks)), picks


def _shifted(value: float, r: float) -> float:
    """``value + r`` exactly as the table built it (a zero transition leaves the row untouched)."""
    return value + r if r else value
