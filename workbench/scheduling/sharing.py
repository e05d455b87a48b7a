"""Processor sharing: ranks that time-share a node's cores run slower the more of them are busy at once.

Problem. On a CPU node every rank is a process on the same few cores. A
rank computes at full speed only while fewer processes are runnable than
there are cores; a pipeline whose ranks sit idle in the bubble therefore
slows its neighbours less than data parallelism, whose ranks all compute at
once, and a gloo all-reduce running beside a backward takes a core from it.
One constant factor (``ranks / cores``) misses all of that: it charges the
idle pipeline as much as the busy replicas, and charges nothing for a
collective that "overlaps" compute.

Approach (a mean-field fixed point). A process that is runnable next to
``n - 1`` others and ``background`` foreign processes gets
``min(1, cores / (n + background))`` of a core; relative to running alone
(:func:`sharing_slowdown`) it is that many times slower. The activity of a
timeline is, for each rank, the average number of processes of its node
runnable while the rank computes: compute events (F, B, I, W, STEP) and the
communication that works the CPU (all-reduce and send events, each its own
thread) count; receives are waits and do not. The simulator
(:func:`workbench.scheduling.simulate.simulate` with ``sharing=``) times
the schedule, reads each rank's activity, stretches that rank's compute by
the slowdown it implies and times it again, until the stretch settles.
A gloo all-reduce between CPU processes is partly work on their cores
(copies and sums) and partly waiting for its peer: a share
:data:`COLLECTIVE_CPU_SHARE` of its time. Its thread counts as that much of
a runnable thread, and the all-reduce itself is stretched by the threads
runnable while it runs (:meth:`CoreSharing.collective_stretch`): beside two
computing processes on two cores it takes longer than alone (where the
link's bandwidth was measured), two pairs at once only a little longer.
The same activity read from a *measured* timeline turns its durations, which
were taken under contention, back into solo durations
(:func:`solo_durations`), so a prediction from measured stage times does not
count the contention twice.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from ..core.fields import check_number
from ..core.timeline import Event

__all__ = ["CoreSharing", "sharing_slowdown", "wait_fraction", "activity", "runnable_at", "solo_durations",
           "COMPUTE_OPS", "CPU_COMM_OPS", "COLLECTIVE_CPU_SHARE"]

COMPUTE_OPS = frozenset({"F", "B", "I", "W", "STEP"})
CPU_COMM_OPS = frozenset({"AR", "SEND_F", "SEND_B"})
# The share of a gloo all-reduce's time spent working on a core (the rest waits for the peer), fitted by
# bench/bench_collective_cpu.py on this machine's 2 cores (bench/RESULTS.md, "Collectives on shared cores"): beside
# two computing processes a 2-rank all-reduce of 64 MiB took 1.73-2.04x its time alone, and two pairs at once
# 1.39-1.59x; (1 - s) + s * (runnable / 2) with 2 + 2s and 4s runnable fits both best at s = 0.79-0.91 over three
# runs. The computing processes beside it ran 1.86-2.21x slower: the all-reduce thread weighs about what it works.
COLLECTIVE_CPU_SHARE = 0.9


def sharing_slowdown(runnable: float, cores: float, background: float = 0.0) -> float:
    """How much slower a process runs among ``runnable`` busy ones (itself included) than alone.

    Processor sharing: ``n`` runnable processes next to ``background`` others
    get ``min(1, cores / (background + n))`` of a core each; the slowdown is
    the share of one process alone over the share among ``runnable``.
    """
    if cores <= 0:
        raise ValueError(f"cores must be > 0, got {cores!r}")
    if runnable < 0 or background < 0:
        raise ValueError(f"runnable and background must be >= 0, got {runnable!r} and {background!r}")

    def share(n: float) -> float:
        return min(1.0, cores / (background + n)) if background + n > 0 else 1.0

    return share(1.0) / share(max(1.0, runnable))


@dataclass(frozen=True)
class CoreSharing:
    """The cores one node's ranks share and the foreign work already on them (runnable processes)."""

    cores: float
    background: float = 0.0
    ranks_per_node: int | None = None  # None: every rank of the timeline shares one node

    def __post_init__(self) -> None:
        check_number("CoreSharing.cores", self.cores, 0, strict=True)
        check_number("CoreSharing.background", self.background, 0)

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node if self.ranks_per_node else 0

    def slowdown(self, runnable: float) -> float:
        return sharing_slowdown(runnable, self.cores, self.background)

    def wait_fraction(self, runnable: float) -> float:
        """See :func:`wait_fraction`."""
        return wait_fraction(runnable, self.cores, self.background)

    def collective_stretch(self, runnable: float) -> float:
        """How much longer an all-reduce takes among ``runnable`` threads (weighted, its own included) than
        with its peer alone: its share of work on a core slows as compute does, its waiting does not."""
        share = COLLECTIVE_CPU_SHARE
        return (1.0 - share) + share * self.slowdown(runnable)


def wait_fraction(runnable: float, cores: float, background: float = 0.0) -> float:
    """How much of a full scheduling wait a thread woken among ``runnable`` busy ones (itself included) pays.

    A message completes only once both of its ranks hold a core. While every
    runnable process has one there is no wait; the wait grows with the
    processes queued for a core, to the whole of it once the cores are
    oversubscribed twice: ``min(1, max(0, (runnable + background - cores) / cores))``.
    """
    if cores <= 0:
        raise ValueError(f"cores must be > 0, got {cores!r}")
    return min(1.0, max(0.0, (runnable + background - cores) / cores))


def _weight(op: str) -> float:
    """How much of a runnable thread an event is: computing 1, an all-reduce its share of work on a core."""
    if op in COMPUTE_OPS:
        return 1.0
    if op == "AR":
        return COLLECTIVE_CPU_SHARE
    return 1.0 if op in CPU_COMM_OPS else 0.0


def _counts(events: Iterable[Event], sharing: CoreSharing) -> dict[int, tuple[list[float], list[float]]]:
    """Per node: the times where the (weighted) number of runnable threads changes, and the count from each on."""
    deltas: dict[int, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        w = _weight(e.op)
        if w and e.end > e.start:
            d = deltas[sharing.node(e.rank)]
            d[e.start] += w
            d[e.end] -= w
    out = {}
    for node, d in deltas.items():
        times = sorted(d)
        running, counts = 0.0, []
        for t in times:
            running += d[t]
            counts.append(running)
        out[node] = (times, counts)
    return out


def _mean_count(times: list[float], counts: list[float], start: float, end: float) -> float:
    """Time-average of the step function over [start, end)."""
    i = max(0, bisect_right(times, start) - 1)
    total, t = 0.0, start
    while t < end and i < len(times):
        nxt = times[i + 1] if i + 1 < len(times) else end
        upto = min(end, nxt)
        if upto > t:
            total += counts[i] * (upto - t)
            t = upto
        i += 1
    return total / (end - start) if end > start else float(counts[i - 1] if i else 1)


def activity(events: Iterable[Event], num_ranks: int, sharing: CoreSharing,
             iterations: "set[int] | None" = None, ops: frozenset = COMPUTE_OPS) -> list[float]:
    """Per rank: the average number of runnable threads on its node while the rank computes (>= 1).

    ``iterations``: average over the compute events of these iterations only
    (all threads still count), e.g. the steady iterations of a schedule that
    streams several, whose fill and drain run fewer ranks at once than the
    steady state the iteration time is taken from. A rank with no compute
    events there gets 1.0 (it would run alone). ``ops``: the events averaged
    over (``{"AR"}``: while the rank all-reduces).
    """
    events = list(events)
    counts = _counts(events, sharing)
    weighted = [0.0] * num_ranks
    busy = [0.0] * num_ranks
    for e in events:
        if iterations is not None and e.iteration not in iterations:
            continue
        if e.op in ops and e.end > e.start and e.rank < num_ranks:
            times, c = counts[sharing.node(e.rank)]
            weighted[e.rank] += _mean_count(times, c, e.start, e.end) * (e.end - e.start)
            busy[e.rank] += e.end - e.start
    return [max(1.0, weighted[r] / busy[r]) if busy[r] > 0 else 1.0 for r in range(num_ranks)]


def runnable_at(events: Iterable[Event], sharing: CoreSharing) -> "Callable[[int, float], float]":
    """``at(rank, t)``: how many threads of the *other* ranks of ``rank``'s node the timeline has runnable at ``t``."""
    events = list(events)
    by_node = _counts(events, sharing)
    own = _counts(events, CoreSharing(sharing.cores, sharing.background, 1))  # one "node" per rank

    def count(table: dict, key: int, t: float) -> float:
        times, c = table.get(key, ((), ()))
        i = bisect_right(times, t) - 1
        return c[i] if i >= 0 else 0

    def at(rank: int, t: float) -> float:
        return count(by_node, sharing.node(rank), t) - count(own, rank, t)

    return at


def solo_durations(events: Iterable[Event], sharing: CoreSharing) -> dict[int, float]:
    """For each compute event (by its index in ``events``): its duration had it run alone on the node.

    The measured duration divided by the processor-sharing slowdown of the
    threads runnable beside it during that event.
    """
    events = list(events)
    counts = _counts(events, sharing)
    out = {}
    for i, e in enumerate(events):
        if e.op in COMPUTE_OPS and e.end > e.start:
            times, c = counts[sharing.node(e.rank)]
            out[i] = (e.end - e.start) / sharing.slowdown(_mean_count(times, c, e.start, e.end))
    return out
