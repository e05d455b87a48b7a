"""Timed, dependency-driven simulation of a schedule on a cluster.

The simulator executes the lowered schedule (the same value the runtime
runs) against per-stage costs and a cluster's links, and returns the
:class:`~workbench.core.timeline.Event` list the runtime would record, plus
metrics. Each rank has a compute stream that runs its actions in program
order; communication follows the semantics of
:mod:`workbench.scheduling.passes`:

* a send is launched when the rank reaches it and does not block; its
  transfer starts when the channel (sender -> receiver) is free and, across
  nodes, when both nodes' network ports are free (contention on shared
  links), and takes ``latency + bytes / bandwidth``;
* a receive blocks the rank until the data has arrived;
* an all-reduce is launched without blocking; it starts once every member
  launched it and every member's collective stream (and the node ports it
  crosses) is free, takes the ring time plus the cluster's
  ``collective_call_ms`` for each of its 2(n - 1) ring steps; the stage's
  ``STEP`` waits for it.

Ranks are advanced one action at a time in order of their clocks, so link
contention is resolved in time order.

Overlap slowdown (Galvatron's observation): compute and communication that
overlap on one device both run slower, because they share its cores and
memory bandwidth. With ``cluster.overlap_slowdown = f > 1`` the part of a
compute action that overlaps communication already placed on its device
takes ``f`` times longer, and so does the part of a transfer or all-reduce
that overlaps compute already placed on the devices it involves. A device is
one rank, or a whole node when ``cluster.shared_compute`` (CPU processes
time-sharing the node's cores). Intervals are matched as the simulation
places them, so an overlap with work a slower rank places later is not seen;
``f = 1`` leaves every time unchanged. Without a cluster, communication is
free (zero time) but its bytes are still counted.

Processor sharing (``sharing=``, for CPU ranks time-sharing a node's cores):
instead of the pairwise overlap slowdown, each rank's compute, and the
share of each all-reduce it takes part in that works on a core, progresses
at each moment as fast as the threads of its node runnable then let it,
read from the previous passes and settled by a fixed point
(:class:`~workbench.scheduling.sharing.Pace`, :func:`~workbench.scheduling.sharing.settle`); ``stage_costs`` are
then solo times (one process alone on the node). A message, like each step
of a collective, completes only once its receiver holds a core again: it
arrives ``collective_call_ms`` times
:func:`~workbench.scheduling.sharing.wait_fraction` later, for the threads
runnable on the receiver's node when it arrives (read from the previous pass)
and the receiver itself: nothing while every runnable thread has a core, the
whole call cost once the cores are oversubscribed twice.

Metric definitions: ``iteration_ms`` is the makespan divided by the number
of iterations; ``bubble_fraction[r]`` is ``1 - compute busy time of rank r /
makespan`` (compute = F, B, I, W); ``exposed_comm_ms[r]`` is the time rank
``r`` spends blocked while a transfer or all-reduce it waits on is in
progress (waiting for a peer to *start* is bubble, not communication).

The links' bookkeeping (channels, node ports, collective streams, the
overlap slowdown) is :mod:`.sim_links`. Speed: a schedule is lowered and
compiled into integer programs once while it lives (:mod:`.sim_compile`),
the timed pass steps those (:mod:`.sim_kernel`), the metrics and memory are
read off what it records, and the :class:`SimResult`'s timeline, an
``Event`` per event, is made only when it is read.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..core.costs import ClusterSpec
from ..core.ir import Schedule
from ..core.timeline import Timeline
from .sharing import CoreSharing, Pace, settle
from .sim_compile import Compiled, compiled
from .sim_kernel import Pass
from .stagecosts import StageCosts

__all__ = ["simulate", "SimResult", "BUBBLE_DEFINITION"]

BUBBLE_DEFINITION = "1 - (time the rank spends in F/B/I/W) / makespan of the whole run"
_WORK = frozenset({"F", "B", "I", "W", "STEP"})


class SimResult:
    """The simulated timeline, its metrics and the lowered schedule that produced them, and the memory per rank.

    ``timeline`` is made on first access (one ``Event`` per event; the metrics
    and memory do not need it), from ``make_timeline`` when no timeline is given.
    :meth:`work_ms` and :meth:`step_ends` read what an estimate needs off the
    timeline, or off ``summary`` (the same values, as the simulator recorded
    them) while the timeline is the simulator's own.
    """

    __slots__ = ("_timeline", "_make_timeline", "_summary", "_schedule", "metrics", "memory")

    def __init__(self, timeline: Timeline | None, metrics: dict[str, Any], schedule: Schedule | Compiled,
                 memory: list[dict[str, int]] | None = None, *,
                 make_timeline: Callable[[], Timeline] | None = None,
                 summary: tuple[list[float], dict[tuple[int, int], float]] | None = None) -> None:
        if timeline is None and make_timeline is None:
            raise ValueError("SimResult needs a timeline or a make_timeline to build it from")
        self._timeline, self._make_timeline, self._summary = timeline, make_timeline, summary
        self._schedule, self.metrics, self.memory = schedule, metrics, [] if memory is None else memory

    @property
    def schedule(self) -> Schedule:
        """The lowered schedule simulated (lowered when first read, when the simulator compiled it directly)."""
        return self._schedule.lowered if isinstance(self._schedule, Compiled) else self._schedule

    @property
    def timeline(self) -> Timeline:
        if self._timeline is None:
            self._timeline, self._make_timeline = self._make_timeline(), None
        return self._timeline

    def work_ms(self) -> list[float]:
        """Per rank, the time its compute and optimizer steps (F, B, I, W, STEP) take, summed in timeline order."""
        if self._summary is not None:
            return list(self._summary[0])
        work = [0.0] * self.metrics["num_ranks"]
        for e in self.timeline.events:
            if e.op in _WORK:
                work[e.rank] += e.end - e.start
        return work

    def step_ends(self) -> dict[tuple[int, int], float]:
        """(rank, iteration) -> when the rank's last optimizer step of that iteration ended."""
        if self._summary is not None:
            return dict(self._summary[1])
        steps: dict[tuple[int, int], float] = {}
        for e in self.timeline.events:
            if e.op == "STEP":
                steps[(e.rank, e.iteration)] = max(steps.get((e.rank, e.iteration), 0.0), e.end)
        return steps

    def replace(self, **changes: Any) -> "SimResult":
        """A copy with some of ``timeline``, ``metrics``, ``schedule``, ``memory`` changed."""
        unknown = set(changes) - {"timeline", "metrics", "schedule", "memory"}
        if unknown:
            raise ValueError(f"SimResult has no field {sorted(unknown)[0]!r}")
        if "timeline" in changes:
            timeline, make, summary = changes["timeline"], None, None
        else:
            timeline, make, summary = self._timeline, self._make_timeline, self._summary
        return SimResult(timeline, changes.get("metrics", self.metrics), changes.get("schedule", self._schedule),
                         changes.get("memory", self.memory), make_timeline=make, summary=summary)

    def __repr__(self) -> str:
        return (f"SimResult(schedule={self.metrics.get('schedule')!r}, "
                f"makespan_ms={self.metrics.get('makespan_ms')!r}, ranks={self.metrics.get('num_ranks')!r})")


def _default_costs(schedule: Schedule) -> StageCosts:
    chunks = schedule.meta.chunks
    return StageCosts.uniform(schedule.num_stages or 1, forward_ms=1.0 / chunks, backward_ms=2.0 / chunks)


def simulate(schedule: Schedule, stage_costs: StageCosts | None = None, cluster: ClusterSpec | None = None, *,
             microbatch_size: int | None = None, sharing: CoreSharing | None = None,
             reduce_groups: Sequence[Sequence[int]] | None = None) -> SimResult:
    """Time ``schedule`` with ``stage_costs`` on ``cluster`` (see the module docstring).

    ``stage_costs=None`` gives every (virtual) stage forward 1 and backward
    2 time units in total per rank (split over interleaved chunks);
    all-reduces reach the cluster's ``collective_link`` where it has one
    (collectives slower or faster than point-to-point messages).
    ``sharing``: the ranks time-share their node's cores (processor
    sharing replaces the overlap slowdown); the result's metrics carry the
    per-rank compute ``sharing_slowdown`` it settled on.
    ``reduce_groups``: per stage, the whole group its all-reduce spans, where
    ``schedule`` runs a block of replicas that stands for more (every replica
    the same program on links the same): each all-reduce is then timed over
    its whole group, on the links and ports that group crosses, while the
    block's ranks are the ones simulated (see
    :func:`workbench.planning.costs.estimate.replica_block`).
    """
    costs = stage_costs if stage_costs is not None else _default_costs(schedule)
    comp = compiled(schedule)
    n = comp.num_ranks
    if comp.max_stage >= costs.num_stages:
        raise ValueError(f"schedule uses stages up to {comp.max_stage} but stage_costs has {costs.num_stages}")
    groups = None if reduce_groups is None else tuple(tuple(g) for g in reduce_groups)
    if sharing is None:
        return _simulate(comp, costs, cluster, microbatch_size, None, reduce_groups=groups)
    if groups is not None:
        raise ValueError("reduce_groups is for ranks that do not share cores; simulate every replica with sharing")
    if cluster is not None and sharing.ranks_per_node is None:
        sharing = CoreSharing(sharing.cores, sharing.background, cluster.devices_per_node)
    call = cluster.collective_call_ms if cluster is not None else 0.0
    return settle(lambda pace, wait: _simulate(comp, costs, cluster, microbatch_size, pace, wait), n, sharing, call)


def _simulate(comp: Compiled, costs: StageCosts, cluster: ClusterSpec | None, microbatch_size: int | None,
              pace: Pace | None,
              message_wait: Callable[[int, float], float] | None = None,
              reduce_groups: tuple[tuple[int, ...], ...] | None = None) -> SimResult:
    """One timed pass; ``pace`` times compute and all-reduces among the node's runnable threads (processor
    sharing, interference then off) and ``message_wait(r, t)`` delays a message rank r receives at time t (its
    wait for a core)."""
    run = Pass(comp, costs, cluster, pace, message_wait, reduce_groups)
    run.run()
    memory = comp.memory.breakdown(costs)
    return SimResult(None, _metrics(comp.source, run, costs, microbatch_size, memory), comp, memory,
                     make_timeline=run.timeline, summary=(run.work, run.step_ends()))


def _metrics(schedule: Schedule, run: Pass, costs: StageCosts, microbatch_size: int | None,
             memory: list[dict[str, int]]) -> dict[str, Any]:
    start, end = run.span()
    makespan = end - start
    iterations = schedule.meta.num_iterations
    mb = microbatch_size or costs.microbatch_size
    units = schedule.meta.replicas * (schedule.num_microbatches or 1) * iterations * (mb or 1)
    n = schedule.num_ranks
    busy, first, last = run.busy, run.first, run.last
    return {
        "schedule": schedule.name,
        "num_ranks": n,
        "makespan_ms": makespan,
        "iteration_ms": makespan / iterations,
        "throughput": units / (makespan / 1e3) if makespan > 0 else 0.0,
        "throughput_unit": "samples/s" if mb else "microbatches/s",
        "bubble_fraction": [1.0 - busy[r] / makespan if makespan > 0 else 0.0 for r in range(n)],
        "bubble_definition": BUBBLE_DEFINITION,
        # the idle time between a rank's first compute and its last: what remains of the bubble when iterations
        # run back to back, each rank's fill and drain covered by its neighbours' (steady state)
        "steady_bubble_ms": [max(0.0, last[r] - first[r] - busy[r]) if first[r] is not None else 0.0
                             for r in range(n)],
        "exposed_comm_ms": run.exposed,
        "peak_memory_bytes": [row["peak"] for row in memory],
        "comm_bytes_by_link": dict(run.bytes_by_link),
    }
