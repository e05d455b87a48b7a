"""One timed pass of the simulator over a compiled schedule (:mod:`.sim_compile`).

Semantics are :mod:`.simulate`'s: a rank runs its next action when its
clock is the earliest (a heap of ``(clock, rank)``), keeps running while
it still is, and parks when it waits for a message or an all-reduce; the
rank that delivers wakes it. Resources taken in that order (a channel, a
node's port, a collective stream) are a list of free times indexed by the
ids the per-call tables give each send, so a step is a few list reads and
float operations on plain numbers.

What the pass records stays flat: one ``(rank, index, start, end)`` tuple
per event (an all-reduce's carries its stage, iteration and bytes), each
rank's compute time, its first and last compute and its exposed
communication, which are what the metrics read. :meth:`Pass.timeline` makes
the :class:`~workbench.core.timeline.Event` objects only when someone asks
for the timeline.
"""

from __future__ import annotations

from collections import defaultdict, deque
from heapq import heapify, heappop, heappush, heapreplace
from operator import itemgetter
from typing import Callable

from ..core.costs import ClusterSpec
from ..core.ir import Action, Op
from ..core.timeline import Event, Timeline
from .sim_compile import ALL_REDUCE, COMPUTE, RECV, SEND, STEP, Compiled
from .sharing import Pace
from .sim_links import _Interference
from .stagecosts import StageCosts

__all__ = ["Pass", "action_ms"]

_END = (-1, 0, 0)  # the entry the kernel puts after each rank's last

_FULL_OR_SPLIT = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)


def action_ms(a: Action, costs: StageCosts, meta, cluster: ClusterSpec | None) -> float:
    """The compute time of one action: a stage's forward, backward, input or weight gradient or step (a
    bucket's share of a bucketed backward, one SUMMA step of a 2D tensor-parallel layer), 0 for the rest."""
    if a.op is Op.STEP:
        return costs.step_ms[a.stage]
    if a.op not in _FULL_OR_SPLIT:
        return 0.0
    base = (costs.forward_ms if a.op is Op.FORWARD else costs.input_grad_ms if a.op is Op.BACKWARD_INPUT
            else costs.weight_grad_ms if a.op is Op.BACKWARD_WEIGHT else costs.backward_ms)[a.stage]
    q = meta.q
    if q:  # one SUMMA step: 1/q of the rank's 1/q^2 share, plus the row and column block broadcasts
        block = (costs.param_bytes[a.stage] + costs.send_bytes[max(a.stage - 1, 0)]) / (q * q)
        link = cluster.group_link(list(meta.row_groups[0])) if cluster else None
        # two broadcasts of q - 1 steps each
        return base / q ** 3 + (link.transfer_ms(block) + 2 * (q - 1) * cluster.collective_call_ms if link else 0.0)
    if a.bucket is not None and a.op is not Op.FORWARD and meta.backward_buckets:
        return base / meta.backward_buckets
    return base


# Event's slot setters: an Event is made without re-validation, its values valid by construction (hot path)
(_rank, _stage, _op, _start, _end, _microbatch, _iteration, _version, _source, _chunk, _peer, _nbytes) = (
    getattr(Event, name).__set__ for name in ("rank", "stage", "op", "start", "end", "microbatch", "iteration",
                                              "version", "source", "chunk", "peer", "nbytes"))


def _event(rank: int, stage: int, op: str, start: float, end: float, microbatch: int | None, iteration: int,
           version: int | None, chunk: int | None, peer: int | None, nbytes: int | None) -> Event:
    """An Event built without re-validation: the simulator produces valid values by construction."""
    e = object.__new__(Event)
    _rank(e, rank)
    _stage(e, stage)
    _op(e, op)
    _start(e, start)
    _end(e, end)
    _microbatch(e, microbatch)
    _iteration(e, iteration)
    _version(e, version)
    _source(e, "simulated")
    _chunk(e, chunk)
    _peer(e, peer)
    _nbytes(e, nbytes)
    return e


class Pass:
    """The state of one timed pass: per-call tables (costs on this cluster), each rank's clock and place in its
    program, the messages in flight, the all-reduces launched, and what the metrics read."""

    def __init__(self, comp: Compiled, costs: StageCosts, cluster: ClusterSpec | None, pace: Pace | None,
                 message_wait: Callable[[int, float], float] | None,
                 reduce_groups: tuple[tuple[int, ...], ...] | None = None) -> None:
        n = comp.num_ranks
        self.pace = pace  # processor sharing: when compute and all-reduces end among the node's runnable threads
        self.reduce_groups = reduce_groups  # per stage, the whole group an all-reduce spans (a block of replicas)
        if cluster is not None and cluster.world_size < n:
            raise ValueError(f"cluster {cluster.name!r} has {cluster.world_size} devices but the schedule needs "
                             f"{n} ranks")
        self.comp, self.costs, self.cluster, self.message_wait = comp, costs, cluster, message_wait
        overlap = cluster is not None and cluster.overlap_slowdown > 1 and pace is None
        self.interference = _Interference(cluster, n) if overlap else None
        meta = comp.source.meta  # lowering changes only which passes the meta says ran
        self.tables = [[action_ms(a, costs, meta, cluster) for a in comp.classes]] * n
        per_node = cluster.devices_per_node if cluster else 1
        self.node = [r // per_node for r in range(n)]
        self.multi_node = cluster is not None and cluster.num_nodes > 1
        self._send_tables(comp, costs, cluster)
        self.clock, self.pointer = [0.0] * n, [0] * n
        self.exposed, self.busy, self.first, self.last = [0.0] * n, [0.0] * n, [None] * n, [0.0] * n
        self.work = [0.0] * n  # compute and optimizer steps
        self.events: list[tuple] = []
        self.steps: list[tuple] = []  # (rank, its entry's needs, end) per optimizer step
        self.bytes_by_link: dict[str, int] = defaultdict(int)
        self.arrivals = [deque() for _ in comp.queue_receiver]  # per queue, the messages not yet received
        self.parked_recv = [-1] * len(comp.queue_receiver)
        self.launches = [dict() for _ in comp.ar_keys]
        self.ar_done: list[tuple[float, float] | None] = [None] * len(comp.ar_keys)
        self.parked_ar: list[list[int]] = [[] for _ in comp.ar_keys]
        self.coll: dict[int, float] = defaultdict(float)  # each rank's collective stream: free from
        self._links: dict[tuple[int, ...], tuple] = {}  # an all-reduce group's link, and whether it spans nodes

    def _send_tables(self, comp: Compiled, costs: StageCosts, cluster: ClusterSpec | None) -> None:
        """Per send descriptor: its bytes, link time, link name, receiver, and the resources it takes (the channel
        sender -> receiver, and across nodes both nodes' ports), as ids into ``self.free``."""
        channels: dict[tuple[int, int], int] = {}
        for src, dst, _, _ in comp.sends:
            channels.setdefault((src, dst), len(channels))
        self.port0 = len(channels)  # port of node k: port0 + k
        self.free = [0.0] * (len(channels) + (self.node[-1] + 1 if self.node else 0))
        links: dict[tuple[int, int], object] = {}
        nbytes, ms, names, res = [], [], [], []
        for src, dst, forward, stage in comp.sends:
            size = costs.send_bytes[stage] if forward else costs.send_bytes[stage - 1]
            link = None
            if cluster is not None:
                link = links.get((src, dst))
                if link is None:
                    link = links[(src, dst)] = cluster.link(src, dst)
            nbytes.append(size)
            ms.append(link.transfer_ms(size) if link else 0.0)
            names.append(link.name if link else "free")
            across = self.multi_node and self.node[src] != self.node[dst]
            res.append((channels[(src, dst)], self.port0 + self.node[src] if across else -1,
                        self.port0 + self.node[dst] if across else -1, src, dst))
        self.send_bytes, self.send_ms, self.send_name, self.send_res = nbytes, ms, names, res
        self.send_table = [(ch, port, t, name, size)  # what the kernel's loop reads of a send
                           for (ch, port, _, _, _), t, name, size in zip(res, ms, names, nbytes)]

    def run(self) -> None:
        """Every rank to the end of its program (ValueError naming a rank that cannot finish). A rank no longer the
        earliest trades places with the earliest in one ``heapreplace`` (what a push and a pop would give)."""
        programs, clock, pointer, tables = self.comp.programs, self.clock, self.pointer, self.tables
        busy, work, first, last, exposed = self.busy, self.work, self.first, self.last, self.exposed
        arrivals, parked, free = self.arrivals, self.parked_recv, self.free
        append, inter, sends, by_link = self.events.append, self.interference, self.send_table, self.bytes_by_link
        pace = self.pace
        plain = inter is None and self.message_wait is None  # sends inside a node then need no call
        heap = [(0.0, r) for r in range(len(programs)) if programs[r]]
        heapify(heap)
        programs = [prog + (_END,) for prog in programs]
        while heap:  # a heap entry's time is its rank's clock (clock[r] is kept for ranks that park)
            now, r = heappop(heap)
            prog, p, cms = programs[r], pointer[r], tables[r]
            while True:
                code, x, y = prog[p]
                if code == COMPUTE:
                    d = cms[x]
                    if inter is not None and d > 0:
                        d = inter.place("compute", [r], now, d) - now
                    elif pace is not None and d > 0:
                        d = pace.compute_end(r, now, d) - now
                    if d > 0:
                        e = now + d
                        append((r, p, now, e))
                        d = e - now
                        busy[r] += d
                        work[r] += d
                        if first[r] is None:
                            first[r] = now
                        last[r] = e
                        now = e
                elif code == RECV:
                    arrived = arrivals[x]
                    if not arrived:
                        parked[x] = r
                        break
                    s, e = arrived.popleft()
                    if e > now:
                        b = now if now > s else s
                        if e > b:
                            exposed[r] += e - b
                            append((r, p, b, e))
                        now = e
                elif code == SEND:
                    ch, port, ms, name, nbytes = sends[x]
                    if port >= 0 or not plain:
                        self._send(r, p, x, y, now, heap)
                    else:  # inside a node, nothing else to wait for: the channel is free from free[ch]
                        s = free[ch]
                        if now > s:
                            s = now
                        e = free[ch] = s + ms
                        by_link[name] += nbytes
                        arrivals[y].append((s, e))
                        if e > s:
                            append((r, p, s, e))
                        w = parked[y]
                        if w >= 0:
                            parked[y] = -1
                            heappush(heap, (clock[w], w))
                elif code == STEP:
                    clock[r] = now
                    done = self._step(r, p, x, y, now)
                    if done is None:
                        break
                    now = done
                elif code == ALL_REDUCE:
                    self._all_reduce(r, x, now, heap)
                elif code < 0:  # the end of the rank's program
                    break
                p += 1
                if heap and heap[0][0] < now:  # no longer the earliest: trade places with the earliest
                    pointer[r] = p
                    now, r = heapreplace(heap, (now, r))
                    prog, p, cms = programs[r], pointer[r], tables[r]
            pointer[r], clock[r] = p, now
        self._check_finished()

    def _send(self, r: int, p: int, x: int, queue: int, now: float, heap: list) -> None:
        """Launch a send: its transfer starts when its channel (and, across nodes, both ports) is free."""
        free = self.free
        ch, port_a, port_b, src, dst = self.send_res[x]
        start = free[ch]
        if now > start:
            start = now
        if port_a >= 0:
            start = max(start, free[port_a], free[port_b])
        end = start + self.send_ms[x]
        if self.interference is not None and end > start:
            end = self.interference.place("comm", [src, dst], start, end - start)
        if self.message_wait is not None and self.cluster is not None:
            end += self.message_wait(dst, end)
        free[ch] = end
        if port_a >= 0:
            free[port_a] = free[port_b] = end
        self.bytes_by_link[self.send_name[x]] += self.send_bytes[x]
        self.arrivals[queue].append((start, end))
        if end > start:
            self.events.append((r, p, start, end))
        w = self.parked_recv[queue]
        if w >= 0:
            self.parked_recv[queue] = -1
            heappush(heap, (self.clock[w], w))

    def _step(self, r: int, p: int, cls: int, need: int, now: float) -> float | None:
        """An optimizer step: wait for the all-reduces it needs (None: parked on one), then compute."""
        needed, done = self.comp.needs[need][0], self.ar_done
        for k in needed:
            if done[k] is None:
                self.parked_ar[k].append(r)
                return None
        for k in needed:
            start, end = done[k]
            if end > now:
                self.exposed[r] += end - max(now, start)
                now = end
        d = self.tables[r][cls]
        if self.interference is not None and d > 0:
            d = self.interference.place("compute", [r], now, d) - now
        elif self.pace is not None and d > 0:
            d = self.pace.compute_end(r, now, d) - now
        end = now + d
        self.events.append((r, p, now, end))
        self.steps.append((r, need, end))
        self.work[r] += end - now
        return end

    def _all_reduce(self, r: int, kid: int, now: float, heap: list) -> None:
        """Launch an all-reduce; the last member of its group to launch it starts it."""
        stage, iteration, bucket = self.comp.ar_keys[kid]
        groups = self.comp.source.meta.dp_groups
        group = groups[stage] if stage < len(groups) else [r]
        launched = self.launches[kid]
        launched[r] = now
        if len(launched) != len(group):
            return
        buckets = self.comp.source.meta.num_buckets
        nbytes = self.costs.grad_bytes[stage] // (buckets if bucket is not None else 1)
        whole = self.reduce_groups[stage] if self.reduce_groups else tuple(group)
        start, end = self._reduce(group, nbytes, max(launched.values()), whole)
        self.ar_done[kid] = (start, end)
        if end > start:
            for m in group:
                self.events.append((m, -1, start, end, stage, iteration or 0, nbytes))
        for w in self.parked_ar[kid]:
            heappush(heap, (self.clock[w], w))
        self.parked_ar[kid] = []

    def _reduce(self, group, nbytes: int, ready: float, whole) -> tuple[float, float]:
        """A ring all-reduce over ``whole`` (``group``, or the whole group that the simulated members of a block
        of replicas stand for): it starts when every simulated member's collective stream (and the ports of the
        simulated nodes it spans) is free."""
        size = len(whole)
        if size == 1:
            return ready, ready
        cluster, coll, free = self.cluster, self.coll, self.free
        known = self._links.get(whole)
        if known is None:
            spans = len({m // (cluster.devices_per_node if cluster else 1) for m in whole}) > 1
            known = self._links[whole] = (cluster.allreduce_link(list(whole)) if cluster else None, spans)
        link, spans = known
        self.bytes_by_link[link.name if link else "free"] += int(nbytes * 2 * (size - 1) / size)
        ports = [self.port0 + k for k in {self.node[m] for m in group}] if self.multi_node and spans else []
        start = max([ready] + [coll[m] for m in group] + [free[k] for k in ports])
        call = cluster.allreduce_call_ms(size) if cluster else 0.0
        work = link.allreduce_ms(nbytes, size) + call if link else 0.0
        end = self.pace.all_reduce_end(group, start, work) if self.pace is not None and work > 0 else start + work
        if self.interference is not None and end > start:
            end = self.interference.place("comm", group, start, end - start)
        for m in group:
            coll[m] = end
        for k in ports:
            free[k] = end
        return start, end

    def _check_finished(self) -> None:
        programs, pointer = self.comp.programs, self.pointer
        stuck = [r for r in range(len(programs)) if pointer[r] < len(programs[r])]
        if stuck:
            r = stuck[0]
            raise ValueError(f"schedule {self.comp.source.name!r} cannot finish: rank {r} is blocked at step "
                             f"{pointer[r]} ({self.comp.actions[r][pointer[r]]}); run validate() for the full "
                             f"diagnosis")

    # -- what the pass recorded ------------------------------------------------------------------------------------
    def span(self) -> tuple[float, float]:
        """The earliest start and the latest end of any event (0, 0 without events): the timeline's."""
        if not self.events:
            return 0.0, 0.0
        return min(map(itemgetter(2), self.events)), max(map(itemgetter(3), self.events))

    def step_ends(self) -> dict[tuple[int, int], float]:
        """(rank, iteration) -> when the rank's last optimizer step of that iteration ended."""
        needs = self.comp.needs
        out: dict[tuple[int, int], float] = {}
        for r, need, end in self.steps:
            key = (r, needs[need][1])
            out[key] = max(out.get(key, 0.0), end)
        return out

    def timeline(self) -> Timeline:
        """The events as a :class:`~workbench.core.timeline.Timeline` (what the runtime would record): the records
        sorted as a Timeline sorts its events (stable, by start, rank and end), then an Event each."""
        fields, send_bytes = self.comp.event_fields(), self.send_bytes
        out = []
        for rec in sorted(self.events, key=itemgetter(2, 0, 3)):
            r, p, start, end = rec[0], rec[1], rec[2], rec[3]
            if p < 0:
                out.append(_event(r, rec[4], "AR", start, end, None, rec[5], None, None, None, rec[6]))
                continue
            stage, op, microbatch, iteration, version, chunk, peer, send = fields[r][p]
            out.append(_event(r, stage, op, start, end, microbatch, iteration, version, chunk, peer,
                              send_bytes[send] if send >= 0 else None))
        cluster = self.cluster
        return Timeline.from_sorted(tuple(out), {"schedule": self.comp.source.name,
                                                 "cluster": cluster.name if cluster else None})
