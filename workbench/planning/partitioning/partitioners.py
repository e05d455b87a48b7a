"""Baseline partitioners, manual partitions, and one entry point for all of them.

AMPA (:mod:`workbench.planning.partitioning.ampa`) is only interesting next to what
people use without it, so the classic choices live here, each returning the
same :class:`~workbench.planning.partitioning.ampa.PartitionResult` evaluated with the
same projection (per-stage time, boundary transfers, memory) so they
compare directly:

* ``uniform``: the same number of layers per stage;
* ``params``: stages with balanced parameter bytes (exact min-max of the
  largest stage's parameters, by the dynamic programme below);
* ``time``: torchgpipe-style block partition of the per-layer times (no
  communication): start from the even prefix split and move single layers
  off the heaviest block while that lowers the heaviest block (a local-search
  heuristic, as in Barany's block partitions of sequences);
* ``pipedream``: PipeDream's dynamic programme for a straight pipeline: a
  stage costs the *larger* of its compute and its input transfer (it assumes
  communication overlaps compute), minimised over contiguous splits;
* ``manual``: a partition given as text (``"0-3|4-9|10-15"``), checked the
  same way (coverage, stage count, memory cap).

Every algorithm raises ``ValueError`` if its partition breaks the memory cap,
naming the stage and the excess.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import Callable, Sequence

from ...core.costs import ClusterSpec, ModelCosts
from ...core.partition import Partition
from ...scheduling.registry import StageMemory
from .ampa import PartitionResult, Projection, check_fits, solve

__all__ = ["partition", "ALGORITHMS", "block_partition", "min_max_dp", "manual"]


def min_max_dp(values: Sequence[float], num_stages: int,
               stage_cost: Callable[[int, int], float] | None = None) -> Partition:
    """Contiguous split minimising the largest stage cost, by O(S L^2) dynamic programming.

    ``stage_cost(a, b)`` prices layers ``a..b-1`` (default: the sum of ``values``).
    """
    L = len(values)
    pre = [0.0, *accumulate(values)]
    cost = stage_cost or (lambda a, b: pre[b] - pre[a])
    inf = float("inf")
    best = [[inf] * (L + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (L + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for b in range(k, L - (num_stages - k) + 1):
            row_best, row_cut = inf, 0
            for a in range(k - 1, b):
                v = max(best[k - 1][a], cost(a, b))
                if v < row_best:
                    row_best, row_cut = v, a
            best[k][b], cut[k][b] = row_best, row_cut
    sizes, b = [], L
    for k in range(num_stages, 0, -1):
        a = cut[k][b]
        sizes.append(b - a)
        b = a
    return Partition.from_sizes(sizes[::-1])


def block_partition(values: Sequence[float], num_stages: int) -> Partition:
    """Balance ``values`` into contiguous blocks: even prefix split, then move layers off the heaviest block."""
    L = len(values)
    total = sum(values)
    pre = list(accumulate(values))  # pre[i]: sum of values[0..i]
    cuts, prev = [], 0
    for k in range(1, num_stages):
        c = bisect_left(pre, total * k / num_stages) + 1
        prev = min(max(c, prev + 1), L - (num_stages - k))
        cuts.append(prev)
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, L])]
    while True:
        sums = [sum(values[a:a + n]) for a, n in zip(accumulate([0, *sizes[:-1]]), sizes)]
        worst = max(range(num_stages), key=sums.__getitem__)
        start = sum(sizes[:worst])
        moves = []
        if worst > 0 and sizes[worst] > 1:
            moves.append((worst - 1, values[start]))
        if worst + 1 < num_stages and sizes[worst] > 1:
            moves.append((worst + 1, values[start + sizes[worst] - 1]))
        improved = False
        for neighbour, moved in sorted(moves, key=lambda m: sums[m[0]] + m[1]):
            if max(sums[worst] - moved, sums[neighbour] + moved) < sums[worst]:
                sizes[worst] -= 1
                sizes[neighbour] += 1
                improved = True
                break
        if not improved:
            return Partition.from_sizes(sizes)


def _pipedream(proj: Projection) -> Partition:
    # a stage pays max(compute, its input transfer): PipeDream's overlapped-communication stage time
    def cost(a: int, b: int) -> float:
        transfer = proj.boundary(0)[a] if a > 0 else 0.0
        return max(proj.pre_t[b] - proj.pre_t[a], transfer)

    return min_max_dp([0.0] * proj.costs.num_layers, proj.num_stages, cost)


def manual(costs: ModelCosts, text: str, **kwargs) -> PartitionResult:
    """Evaluate a hand-written partition (``"0-3|4-9|10-15"``) with the same checks."""
    p = Partition.parse(text, costs.num_layers)
    return partition(costs, p.num_stages, "manual", text=text, **kwargs)


ALGORITHMS = ("ampa", "uniform", "params", "time", "pipedream", "manual")


def partition(costs: ModelCosts, num_stages: int, algorithm: str = "ampa", *, num_microbatches: int = 1,
              schedule: "str | StageMemory" = "1f1b", memory_cap_bytes: int | None = None, cluster: ClusterSpec | None = None,
              batch_size: int | None = None, text: str | None = None, optimizer: str = "adam") -> PartitionResult:
    """Partition ``costs`` into ``num_stages`` stages with ``algorithm`` (one of :data:`ALGORITHMS`); ``schedule``
    is the pipeline kind (or its ``StageMemory``) whose in-flight memory counts against the cap."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    proj = Projection(costs, num_stages, num_microbatches=num_microbatches, schedule=schedule,
                      batch_size=batch_size, cluster=cluster, optimizer=optimizer)
    cap = memory_cap_bytes if memory_cap_bytes is not None else (cluster.device.memory_bytes if cluster else None)
    if algorithm == "ampa":
        return solve(proj, cap)
    if algorithm == "manual":
        if text is None:
            raise ValueError("algorithm 'manual' needs text, e.g. text='0-3|4-9|10-15'")
        chosen = Partition.parse(text, costs.num_layers)
        if chosen.num_stages != num_stages:
            raise ValueError(f"partition {text!r} has {chosen.num_stages} stages but num_stages={num_stages}")
    elif algorithm == "uniform":
        chosen = Partition.uniform(costs.num_layers, num_stages)
    elif algorithm == "params":
        chosen = min_max_dp([float(l.param_bytes) for l in costs.layers], num_stages)
    elif algorithm == "time":
        chosen = block_partition([f + b for f, b in zip(proj.forward, proj.backward)], num_stages)
    else:
        chosen = _pipedream(proj)
    result = proj.evaluate(chosen, algorithm, cap)
    check_fits(result)
    return result
