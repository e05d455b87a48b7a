"""Processor sharing: ranks that time-share a node's cores run slower the more of them are busy at once.

Problem. On a CPU node every rank is a process on the same few cores. A
rank computes at full speed only while fewer processes are runnable than
there are cores; a pipeline whose ranks sit idle in the bubble therefore
slows its neighbours less than data parallelism, whose ranks all compute at
once, and a gloo all-reduce running beside a backward takes a core from it.
One constant factor (``ranks / cores``) misses all of that: it charges the
idle pipeline as much as the busy replicas, and charges nothing for a
collective that "overlaps" compute.

Approach (processor sharing in time, settled by a fixed point). A process
that is runnable next to ``n - 1`` others and ``background`` foreign
processes gets ``min(1, cores / (n + background))`` of a core; relative to
running alone (:func:`sharing_slowdown`) it is that many times slower. The
simulator (:func:`workbench.scheduling.simulate.simulate` with ``sharing=``)
times the schedule with every rank alone, then again with each compute
action progressing, moment by moment, at the speed the threads runnable on
its node at that moment in the previous passes allow (:class:`Pace`):
compute events (F, B, I, W, STEP) and the communication that works the CPU
(all-reduce and send events, each its own thread) count; receives are waits
and do not. It repeats until no rank's compute or all-reduce time moves
(:func:`settle`). A rank that computes while its neighbours wait for its
message runs alone; one whose all-reduce thread runs beside its next
forward shares a core with it. An average over a rank's whole iteration
would charge both alike.
A gloo all-reduce between CPU processes is partly work on their cores
(copies and sums) and partly waiting for its peer: a share
:data:`COLLECTIVE_CPU_SHARE` of its time. Its thread counts as that much of
a runnable thread, and that share of the all-reduce slows with the threads
runnable while it runs (:meth:`CoreSharing.collective_stretch`): beside two
computing processes on two cores it takes longer than alone (where the
link's bandwidth was measured), two pairs at once only a little longer.
The threads runnable beside each event of a *measured* timeline turn its
durations, which were taken under contention, back into solo durations
(:func:`solo_durations`), so a prediction from measured stage times does not
count the contention twice.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..core.fields import check_number
from ..core.timeline import Event

__all__ = ["CoreSharing", "Pace", "settle", "sharing_slowdown", "wait_fraction", "runnable_at", "solo_durations",
           "COMPUTE_OPS", "CPU_COMM_OPS", "COLLECTIVE_CPU_SHARE", "SHARING_ROUNDS", "SHARING_TOLERANCE"]

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


def _steps(deltas: dict[float, float]) -> tuple[list[float], list[float]]:
    """A step function from its jumps: the times it changes at and its value from each on (0 before the first)."""
    times = sorted(deltas)
    values, running = [], 0.0
    for t in times:
        running += deltas[t]
        values.append(running)
    return times, values


def _counts(events: Iterable[Event], sharing: CoreSharing) -> dict[int, tuple[list[float], list[float]]]:
    """Per node: the times where the (weighted) number of runnable threads changes, and the count from each on."""
    deltas: dict[int, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        w = _weight(e.op)
        if w and e.end > e.start:
            d = deltas[sharing.node(e.rank)]
            d[e.start] += w
            d[e.end] -= w
    return {node: _steps(d) for node, d in deltas.items()}


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


def _advance(steps: tuple[list[float], list[float]], start: float, work: float,
             rate: "Callable[[float], float]") -> float:
    """When ``work`` started at ``start`` ends, progressing at ``rate(value)`` while the step function has that
    value (0 outside it)."""
    times, values = steps
    i = bisect_right(times, start) - 1
    t = start
    while True:
        v = values[i] if i >= 0 else 0.0
        speed = rate(v if v > 0.0 else 0.0)
        nxt = times[i + 1] if i + 1 < len(times) else None
        if nxt is None or t + work / speed <= nxt:
            return t + work / speed
        work -= (nxt - t) * speed
        t = nxt
        i += 1


class Pace:
    """Where work started at a moment ends when the threads runnable beside it are those of earlier passes.

    Processor sharing in time: a rank's compute progresses, at each moment, at
    ``1 / slowdown(D)`` of its solo speed, ``D`` the threads runnable on its
    node then (itself and the other ranks' threads, read from ``timelines``,
    the previous passes' events, weighed equally: averaging the last two
    damps the fixed point). An all-reduce's share of work on a core slows the
    same way for the threads beside its members' (``collective_stretch``).
    The rank's own compute in the earlier passes is not counted beside
    itself (it may have moved), but its own all-reduce thread is: a delayed
    all-reduce runs beside the next iteration's compute. ``Pace([], sharing)``
    runs everything as if alone on the node (with its background).
    """

    def __init__(self, timelines: "Sequence[Sequence[Event]]", sharing: CoreSharing) -> None:
        self.sharing = sharing
        node: dict[int, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        own: dict[tuple[str, int], dict[float, float]] = defaultdict(lambda: defaultdict(float))
        share = 1.0 / len(timelines) if timelines else 0.0
        for events in timelines:
            for e in events:
                w = _weight(e.op) * share
                if not w or e.end <= e.start:
                    continue
                tables = [node[sharing.node(e.rank)]]
                if e.op in COMPUTE_OPS or e.op == "AR":  # the rank's own thread, left out beside itself
                    tables.append(own[("c" if e.op in COMPUTE_OPS else "a", e.rank)])
                for table in tables:
                    table[e.start] += w
                    table[e.end] -= w
        self._node, self._own = node, own
        self._others: dict[tuple, tuple[list[float], list[float]]] = {}

    def _beside(self, node: int, minus: "tuple[tuple[str, int], ...]") -> tuple[list[float], list[float]]:
        """The threads runnable on ``node`` less the ``minus`` ones (each rank's compute or all-reduce thread)."""
        key = (node,) + minus
        found = self._others.get(key)
        if found is None:
            deltas = defaultdict(float, self._node.get(node, {}))
            for k in minus:
                for t, v in self._own.get(k, {}).items():
                    deltas[t] -= v
            found = self._others[key] = _steps(deltas)
        return found

    def compute_end(self, rank: int, start: float, work: float) -> float:
        """When ``work`` ms of ``rank``'s compute (solo time) started at ``start`` ends."""
        slowdown = self.sharing.slowdown
        return _advance(self._beside(self.sharing.node(rank), (("c", rank),)), start, work,
                        lambda v: 1.0 / slowdown(v + 1.0))

    def all_reduce_end(self, group: "Sequence[int]", start: float, work: float) -> float:
        """When an all-reduce over ``group`` taking ``work`` ms with its peers alone, started at ``start``, ends:
        the latest over the nodes it spans, its members' threads there each counting their share of work."""
        stretch, end = self.sharing.collective_stretch, start
        nodes: dict[int, list[int]] = defaultdict(list)
        for m in group:
            nodes[self.sharing.node(m)].append(m)
        for node, members in nodes.items():
            mine = COLLECTIVE_CPU_SHARE * len(members)
            steps = self._beside(node, tuple(("a", m) for m in members))
            end = max(end, _advance(steps, start, work, lambda v: 1.0 / stretch(v + mine)))
        return end


def _totals(events: "Sequence[Event]", num_ranks: int) -> list[tuple[float, float]]:
    """Per rank: its compute time (F, B, I, W, STEP) and its all-reduce time."""
    out = [[0.0, 0.0] for _ in range(num_ranks)]
    for e in events:
        if e.rank < num_ranks:
            if e.op in COMPUTE_OPS:
                out[e.rank][0] += e.end - e.start
            elif e.op == "AR":
                out[e.rank][1] += e.end - e.start
    return [tuple(row) for row in out]


SHARING_ROUNDS = 12  # fixed-point passes at most; the schedules here settle to 1% in 3-7
SHARING_TOLERANCE = 0.01  # settled: no rank's compute or all-reduce time moved by more than this share


def settle(run: "Callable[[Pace, Callable[[int, float], float] | None], Any]", num_ranks: int,
           sharing: CoreSharing, call_ms: float = 0.0) -> Any:
    """The processor-sharing fixed point: time a schedule, pace the next pass by the threads the last two passes
    had runnable, until every rank's compute and all-reduce time moves less than 1%.

    ``run(pace, wait)`` makes one timed pass and returns its result (with
    ``timeline`` and ``metrics``); ``wait(rank, t)`` is a message's wait for
    its receiver's core, ``call_ms`` times :meth:`CoreSharing.wait_fraction`
    of the threads runnable on the receiver's node at ``t`` in the previous
    pass (none in the first). The result's metrics gain, per rank, how much
    longer its compute (``sharing_slowdown``) and its all-reduces
    (``sharing_comm_slowdown``) took than alone.
    """
    result = run(Pace([], sharing), None)
    events = result.timeline.events
    solo = before = _totals(events, num_ranks)
    history = [events]
    for _ in range(SHARING_ROUNDS - 1):
        at = runnable_at(events, sharing) if call_ms else None
        wait = None if at is None else (lambda dst, t, at=at: call_ms * sharing.wait_fraction(at(dst, t) + 1))
        result = run(Pace(history[-2:], sharing), wait)
        events = result.timeline.events
        history.append(events)
        now = _totals(events, num_ranks)
        if all(abs(a - b) <= SHARING_TOLERANCE * b for x, y in zip(now, before) for a, b in zip(x, y)):
            break
        before = now
    final = _totals(events, num_ranks)
    result.metrics["sharing_slowdown"] = [f[0] / s[0] if s[0] > 0 else 1.0 for f, s in zip(final, solo)]
    result.metrics["sharing_comm_slowdown"] = [f[1] / s[1] if s[1] > 0 else 1.0 for f, s in zip(final, solo)]
    return result
