"""How many ranks to plan for: the micro-batch sizes a search will charge, and fewer ranks where ranks share cores.

Problem. On GPUs each rank has its own device, so a plan over ``W`` devices
is the question asked. Where a node's ranks time-share its cores (CPU
processes: the ``local`` cluster, ``ClusterSpec.shared_compute``), ranks
beyond the cores add no arithmetic, only splitting: smaller micro-batches,
which cost more per sample, communication, and ranks evicting each other's
caches. On this machine one rank alone trained ``vgg-tiny`` (4096-wide
layers, batch 64) at 260 samples/s and the 4-rank plans of the issue that
asked for this at 91-151, while a 2-rank asynchronous pipeline, one rank a
core, reached 305-407 (``bench/RESULTS.md``, "Predictions that follow the
micro-batch size").

Approach. On such a cluster ``--world-size`` (``Budget.world_size``) is an
upper bound: :func:`add_fewer_ranks` plans the same search for every power of
two below it too (1, 2, ... ranks; without the per-layer search, whose
cost grows with the devices), ranks their plans with the others, and says
in a note, and in the result's ``fewer_ranks`` record, whether a plan on
fewer ranks is the fastest. A search over given strategies, and one on a
cluster whose ranks own their devices, plans exactly the world asked for.

:func:`microbatch_range` is the smallest and largest micro-batch any plan of
the search may run (global batch / replicas / micro-batches), which is the
range a zoo model is profiled over (:func:`workbench.core.batch_fit.fit_sizes`).
"""

from __future__ import annotations

from typing import Any, Callable

from ...core.fields import check_int

__all__ = ["microbatch_range", "smaller_world_sizes", "add_fewer_ranks"]


def microbatch_range(global_batch: int, world_size: int, max_microbatches: int = 64) -> tuple[int, int]:
    """The smallest and largest micro-batch (samples) a plan over ``world_size`` or fewer ranks may run: a
    replica's batch ``global_batch / dp`` (``dp`` dividing the world) over a count of micro-batches that
    divides it, at most ``max_microbatches``; the largest is the whole batch (one replica, one micro-batch)."""
    check_int("global_batch", global_batch, 1)
    check_int("world_size", world_size, 1)
    sizes = set()
    for dp in range(1, world_size + 1):
        if world_size % dp or global_batch % dp:
            continue
        per = global_batch // dp
        sizes.update(per // m for m in range(1, min(per, max_microbatches) + 1) if per % m == 0)
    return min(sizes), max(sizes)


def smaller_world_sizes(world_size: int) -> list[int]:
    """The powers of two below ``world_size`` (1, 2, 4, ...)."""
    out, w = [], 1
    while w < world_size:
        out.append(w)
        w *= 2
    return out


def _best(estimates: list) -> Any:
    simulated = [e for e in estimates if e.method != "projected"] or estimates
    return min(simulated, key=lambda e: (e.iteration_ms, e.strategy.name)) if simulated else None


def add_fewer_ranks(world_size: int, final: list, plan_at: Callable[[int], Any], notes: list[str],
                    cores: int | None) -> dict[str, Any]:
    """Add the plans for every smaller world size to ``final`` (the estimates for ``world_size``), each
    planned by ``plan_at(w)`` (a ``PlanResult``), and note whether one of them is faster than the best on
    ``world_size`` ranks; the record for the result's JSON (``fewer_ranks``)."""
    own = _best(final)
    searched, considered, fewer = 0, [], []
    for w in smaller_world_sizes(world_size):
        try:
            found = plan_at(w)
        except ValueError:  # nothing fits on so few ranks
            continue
        considered.append(w)
        searched += found.searched
        fewer.extend(p.estimate for p in found.plans)
    final.extend(fewer)
    theirs = _best(fewer)
    faster = theirs is not None and (own is None or theirs.iteration_ms < own.iteration_ms)
    best = theirs if faster else own
    record: dict[str, Any] = {"world_size": world_size, "considered": considered, "searched": searched,
                              "best": best.strategy.name if best else None,
                              "best_world_size": best.strategy.world_size if best else None,
                              "best_iteration_ms": best.iteration_ms if best else None,
                              "best_at_world_size": own.strategy.name if own else None,
                              "best_at_world_size_ms": own.iteration_ms if own else None,
                              "fewer_ranks_faster": faster}
    shared = f"the ranks share {cores} core{'s' if cores != 1 else ''}" if cores else "the ranks share cores"
    upper = (f"{shared}, so --world-size {world_size} is an upper bound: plans on "
             f"{', '.join(map(str, considered)) or 'no'} fewer ranks were ranked too")
    if faster:
        ranks = theirs.strategy.world_size
        mine = f" against {own.iteration_ms:.1f} ms for the best on {world_size}, {own.strategy.name}" if own else ""
        notes.append(f"fewer ranks train faster: {theirs.strategy.name} on {ranks} rank{'s' if ranks > 1 else ''}, "
                     f"{theirs.iteration_ms:.1f} ms an iteration{mine} ({upper})")
    else:
        notes.append(f"{upper}; none is faster than {world_size} ranks")
    return record
