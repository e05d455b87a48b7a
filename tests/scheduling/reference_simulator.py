"""The simulator as it was before its compiled kernel (workbench/scheduling/sim_kernel.py): the reference the
fast path is compared with, event for event (tests/scheduling/test_simulator_equivalence.py).

A copy of ``workbench/scheduling/simulate.py`` at the commit before the kernel: one ``_Pass`` object that
steps each rank's lowered actions through method calls, an ``Event`` per event, the timeline sorted before
the metrics are read off it, and the memory walk over every lowered action. Kept here, not in the package,
so the package has one simulator.
"""

from __future__ import annotations

import heapq
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from workbench.core.costs import ClusterSpec
from workbench.core.ir import Action, Op, Schedule
from workbench.core.timeline import Event, Timeline
from workbench.scheduling.memory import memory_breakdown
from workbench.scheduling.passes import lower
from workbench.scheduling.sim_links import _Links
from workbench.scheduling.sharing import CoreSharing, Pace, settle
from workbench.scheduling.stagecosts import StageCosts

__all__ = ["simulate", "SimResult"]

BUBBLE_DEFINITION = "1 - (time the rank spends in F/B/I/W) / makespan of the whole run"


@dataclass(frozen=True)
class SimResult:
    """The simulated timeline, its metrics and the lowered schedule that produced them."""

    timeline: Timeline
    metrics: dict[str, Any]
    schedule: Schedule
    memory: list[dict[str, int]] = field(default_factory=list)


def _event(rank: int, stage: int, op: str, start: float, end: float, microbatch: int | None, iteration: int,
           version: int | None, chunk: int | None, peer: int | None, nbytes: int | None) -> Event:
    """An Event built without re-validation: the simulator produces valid values by construction (hot path)."""
    e = object.__new__(Event)
    put = object.__setattr__
    put(e, "rank", rank)
    put(e, "stage", stage)
    put(e, "op", op)
    put(e, "start", start)
    put(e, "end", end)
    put(e, "microbatch", microbatch)
    put(e, "iteration", iteration)
    put(e, "version", version)
    put(e, "source", "simulated")
    put(e, "chunk", chunk)
    put(e, "peer", peer)
    put(e, "nbytes", nbytes)
    return e


_LOWERED: dict[int, tuple[weakref.ref, Schedule]] = {}


def _lowered(schedule: Schedule) -> Schedule:
    """``lower(schedule)``, remembered while ``schedule`` lives (sweeps simulate one schedule many times)."""
    key = id(schedule)
    hit = _LOWERED.get(key)
    if hit is not None and hit[0]() is schedule:
        return hit[1]
    lowered = lower(schedule)
    _LOWERED[key] = (weakref.ref(schedule), lowered)
    weakref.finalize(schedule, _LOWERED.pop, key, None)
    return lowered


def _default_costs(schedule: Schedule) -> StageCosts:
    chunks = schedule.meta.chunks
    return StageCosts.uniform(schedule.num_stages or 1, forward_ms=1.0 / chunks, backward_ms=2.0 / chunks)


def simulate(schedule: Schedule, stage_costs: StageCosts | None = None, cluster: ClusterSpec | None = None, *,
             microbatch_size: int | None = None, sharing: CoreSharing | None = None) -> SimResult:
    """Time ``schedule`` with ``stage_costs`` on ``cluster`` (see the module docstring).

    ``stage_costs=None`` gives every (virtual) stage forward 1 and backward
    2 time units in total per rank (split over interleaved chunks);
    all-reduces reach the cluster's ``collective_link`` where it has one
    (collectives slower or faster than point-to-point messages).
    ``sharing``: the ranks time-share their node's cores (processor
    sharing replaces the overlap slowdown); the result's metrics carry the
    per-rank compute ``sharing_slowdown`` it settled on.
    """
    costs = stage_costs if stage_costs is not None else _default_costs(schedule)
    lowered = _lowered(schedule)
    n = lowered.num_ranks
    stages_used = {a.stage for r in range(n) for a in lowered.actions(r)}
    if max(stages_used, default=0) >= costs.num_stages:
        raise ValueError(f"schedule uses stages up to {max(stages_used)} but stage_costs has {costs.num_stages}")
    if sharing is None:
        return _simulate(lowered, costs, cluster, microbatch_size, None)
    if cluster is not None and sharing.ranks_per_node is None:
        sharing = CoreSharing(sharing.cores, sharing.background, cluster.devices_per_node)
    call = cluster.collective_call_ms if cluster is not None else 0.0
    return settle(lambda pace, wait: _simulate(lowered, costs, cluster, microbatch_size, pace, wait), n, sharing, call)


def _simulate(lowered: Schedule, costs: StageCosts, cluster: ClusterSpec | None, microbatch_size: int | None,
              pace: Pace | None,
              message_wait: Callable[[int, float], float] | None = None) -> SimResult:
    """One timed pass; ``pace`` times compute and all-reduces among the node's threads (processor sharing,
    interference then off) and
    ``message_wait(r, t)`` delays a message rank r receives at time t (its wait for a core)."""
    run = _Pass(lowered, costs, cluster, pace, message_wait)
    run.run()
    timeline = Timeline(tuple(run.events), {"schedule": lowered.name, "cluster": cluster.name if cluster else None})
    memory = memory_breakdown(lowered, costs)
    return SimResult(timeline, _metrics(lowered, timeline, costs, run.exposed, run.links, microbatch_size, memory),
                     lowered, memory)


def _all_reduces_per_step(programs: list[tuple[Action, ...]]) -> list[dict[tuple, list[tuple]]]:
    """Per rank: (stage, iteration) -> the all-reduces (stage, iteration, bucket) its ``STEP`` waits for."""
    out = []
    for program in programs:
        needs: dict[tuple, list[tuple]] = defaultdict(list)
        for a in program:
            if a.op is Op.ALL_REDUCE:
                needs[(a.stage, a.iteration)].append((a.stage, a.iteration, a.bucket))
        out.append(needs)
    return out


class _Pass:
    """The state of one timed pass of :func:`_simulate`: each rank's clock and place in its program, the
    messages in flight and the all-reduces launched. A rank runs its next action when its clock is the
    earliest, and parks when it has to wait for another rank (a message, an all-reduce)."""

    def __init__(self, lowered: Schedule, costs: StageCosts, cluster: ClusterSpec | None, pace: Pace | None,
                 message_wait: Callable[[int, float], float] | None) -> None:
        n = lowered.num_ranks
        self.lowered, self.costs, self.cluster, self.pace = lowered, costs, cluster, pace
        self.links = _Links(cluster, n, message_wait)
        if pace is not None:
            self.links.interference = None
        self.meta = lowered.meta
        self.groups = self.meta.dp_groups
        self.num_buckets = self.meta.num_buckets
        self.q = self.meta.q
        self.programs = [lowered.actions(r) for r in range(n)]
        self.ar_keys_on_rank = _all_reduces_per_step(self.programs)
        self.clock = [0.0] * n
        self.pointer = [0] * n
        self.events: list[Event] = []
        self.exposed = [0.0] * n
        self.arrivals: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        self.recv_count: dict[tuple, int] = defaultdict(int)
        self.launches: dict[tuple, dict[int, float]] = defaultdict(dict)
        self.ar_done: dict[tuple, tuple[float, float]] = {}
        self.parked: dict[tuple, list[int]] = defaultdict(list)
        self.heap = [(0.0, r) for r in range(n) if self.programs[r]]
        heapq.heapify(self.heap)

    def compute_ms(self, a: Action) -> float:
        costs, meta, q, cluster = self.costs, self.meta, self.q, self.cluster
        if a.op is Op.STEP:
            return costs.step_ms[a.stage]
        if a.op not in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT):
            return 0.0
        base = (costs.forward_ms if a.op is Op.FORWARD else costs.input_grad_ms if a.op is Op.BACKWARD_INPUT
                else costs.weight_grad_ms if a.op is Op.BACKWARD_WEIGHT else costs.backward_ms)[a.stage]
        if q:  # one SUMMA step: 1/q of the rank's 1/q^2 share, plus the row and column block broadcasts
            block = (costs.param_bytes[a.stage] + costs.send_bytes[max(a.stage - 1, 0)]) / (q * q)
            link = cluster.group_link(list(meta.row_groups[0])) if cluster else None
            # two broadcasts of q - 1 steps each
            return base / q ** 3 + (link.transfer_ms(block) + 2 * (q - 1) * cluster.collective_call_ms if link else 0.0)
        if a.bucket is not None and a.op is not Op.FORWARD and meta.backward_buckets:
            return base / meta.backward_buckets
        return base

    def wake(self, key: tuple) -> None:
        for w in self.parked.pop(key, []):
            heapq.heappush(self.heap, (self.clock[w], w))

    def emit(self, r, a, start, end, peer=None, nbytes=None) -> None:
        self.events.append(_event(r, a.stage, a.op.value, start, end, a.microbatch, a.iteration or 0, a.version,
                                  a.chunk, peer, nbytes))

    def step(self, r: int) -> bool:
        """Run rank r's next action; False if it has to wait for another rank."""
        a = self.programs[r][self.pointer[r]]
        op = a.op
        if op is Op.SEND_F or op is Op.SEND_B:
            self._send(r, a)
            return True
        if op is Op.RECV_F or op is Op.RECV_B:
            return self._receive(r, a)
        if op is Op.ALL_REDUCE:
            self._all_reduce(r, a)
            return True
        return self._compute(r, a)

    def _send(self, r: int, a: Action) -> None:
        op = a.op
        nbytes = self.costs.send_bytes[a.stage] if op is Op.SEND_F else self.costs.send_bytes[a.stage - 1]
        ch = (r, a.peer, op is Op.SEND_F)
        start, end = self.links.transfer(r, a.peer, nbytes, self.clock[r])
        self.arrivals[ch].append((start, end))
        if end > start:
            self.emit(r, a, start, end, peer=a.peer, nbytes=nbytes)
        self.wake(("recv",) + ch)

    def _receive(self, r: int, a: Action) -> bool:
        now = self.clock[r]
        ch = (a.peer, r, a.op is Op.RECV_F)
        k = self.recv_count[ch]
        if k >= len(self.arrivals[ch]):
            self.parked[("recv",) + ch].append(r)
            return False
        start, end = self.arrivals[ch][k]
        self.recv_count[ch] = k + 1
        if end > now:
            begin = now if now > start else start
            if end > begin:
                self.exposed[r] += end - begin
                self.emit(r, a, begin, end, peer=a.peer)
            self.clock[r] = end
        return True

    def _all_reduce(self, r: int, a: Action) -> None:
        key = (a.stage, a.iteration, a.bucket)
        group = self.groups[a.stage] if a.stage < len(self.groups) else [r]
        launched = self.launches[key]
        launched[r] = self.clock[r]
        if len(launched) == len(group):
            nbytes = self.costs.grad_bytes[a.stage] // (self.num_buckets if a.bucket is not None else 1)
            pace = None if self.pace is None else (lambda s, w: self.pace.all_reduce_end(group, s, w))
            start, end = self.links.all_reduce(group, nbytes, max(launched.values()), pace)
            self.ar_done[key] = (start, end)
            if end > start:
                for m in group:
                    self.events.append(_event(m, a.stage, "AR", start, end, None, a.iteration or 0, None, None,
                                              None, nbytes))
            self.wake(("ar",) + key)

    def _compute(self, r: int, a: Action) -> bool:
        """A compute action (or another that takes only compute time); a STEP first waits for its all-reduces."""
        op, now = a.op, self.clock[r]
        if op is Op.STEP:
            needed = self.ar_keys_on_rank[r].get((a.stage, a.iteration), [])
            pending = [k for k in needed if k not in self.ar_done]
            if pending:
                self.parked[("ar",) + pending[0]].append(r)
                return False
            for k in needed:
                start, end = self.ar_done[k]
                if end > now:
                    self.exposed[r] += end - max(now, start)
                    now = end
        dur = self.compute_ms(a)
        interference = self.links.interference
        if interference is not None and dur > 0:
            dur = interference.place("compute", [r], now, dur) - now
        elif self.pace is not None and dur > 0:
            dur = self.pace.compute_end(r, now, dur) - now
        if dur > 0 or op is Op.STEP:
            self.emit(r, a, now, now + dur)
        self.clock[r] = now + dur
        return True

    def run(self) -> None:
        """Every rank to the end of its program (ValueError naming a rank that cannot finish)."""
        heap, pointer, programs, clock = self.heap, self.pointer, self.programs, self.clock
        # a rank keeps running while its clock is still the earliest, so resources are taken in time order
        while heap:
            _, r = heapq.heappop(heap)
            while self.step(r):
                pointer[r] += 1
                if pointer[r] == len(programs[r]):
                    break
                if heap and heap[0][0] < clock[r]:
                    heapq.heappush(heap, (clock[r], r))
                    break
        stuck = [r for r in range(len(programs)) if pointer[r] < len(programs[r])]
        if stuck:
            r = stuck[0]
            raise ValueError(f"schedule {self.lowered.name!r} cannot finish: rank {r} is blocked at step {pointer[r]} "
                             f"({programs[r][pointer[r]]}); run validate() for the full diagnosis")


def _metrics(schedule: Schedule, timeline: Timeline, costs: StageCosts, exposed: list[float], links: _Links,
             microbatch_size: int | None, memory: list[dict[str, int]]) -> dict[str, Any]:
    makespan = timeline.makespan
    iterations = schedule.meta.num_iterations
    mb = microbatch_size or costs.microbatch_size
    units = schedule.meta.replicas * (schedule.num_microbatches or 1) * iterations * (mb or 1)
    n = schedule.num_ranks
    busy = _busy_per_rank(timeline, n)
    return {
        "schedule": schedule.name,
        "num_ranks": n,
        "makespan_ms": makespan,
        "iteration_ms": makespan / iterations,
        "throughput": units / (makespan / 1e3) if makespan > 0 else 0.0,
        "throughput_unit": "samples/s" if mb else "microbatches/s",
        "bubble_fraction": [1.0 - busy[r] / makespan if makespan > 0 else 0.0 for r in range(n)],
        "bubble_definition": BUBBLE_DEFINITION,
        "steady_bubble_ms": _gaps_per_rank(timeline, n, busy),
        "exposed_comm_ms": exposed,
        "peak_memory_bytes": [row["peak"] for row in memory],
        "comm_bytes_by_link": dict(links.bytes_by_link),
    }


def _gaps_per_rank(timeline: Timeline, n: int, busy: list[float]) -> list[float]:
    """Per rank, the idle time between its first compute and its last: what remains of the bubble when
    iterations run back to back, each rank's fill and drain covered by its neighbours' (steady state)."""
    first, last = [None] * n, [0.0] * n
    for e in timeline.events:
        if e.op in _COMPUTE:
            first[e.rank] = e.start if first[e.rank] is None else min(first[e.rank], e.start)
            last[e.rank] = max(last[e.rank], e.end)
    return [max(0.0, last[r] - first[r] - busy[r]) if first[r] is not None else 0.0 for r in range(n)]


_COMPUTE = frozenset({"F", "B", "I", "W"})


def _busy_per_rank(timeline: Timeline, n: int) -> list[float]:
    busy = [0.0] * n
    compute = {"F", "B", "I", "W"}
    for e in timeline.events:
        if e.op in compute:
            busy[e.rank] += e.end - e.start
    return busy
