"""The simulator's links: when a transfer or an all-reduce can start on the channels, node ports and collective
streams it needs, how long it takes, and how compute and communication overlapping on a device slow each other.

See :mod:`.simulate` for the semantics (contention on shared links, the
overlap slowdown, a message's wait for its receiver's core).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from typing import Any, Callable

from ..core.costs import ClusterSpec, LinkSpec

__all__: list[str] = []


class _Interference:
    """Busy intervals per device; work overlapping the other kind runs ``overlap_slowdown`` times slower."""

    def __init__(self, cluster: ClusterSpec, num_ranks: int) -> None:
        self.factor = cluster.overlap_slowdown
        per_node = cluster.devices_per_node
        self.device = [r // per_node if cluster.shared_compute else r for r in range(num_ranks)]
        self.busy: dict[str, dict[int, list[tuple[float, float]]]] = {"compute": defaultdict(list),
                                                                      "comm": defaultdict(list)}
        self.longest = {"compute": 0.0, "comm": 0.0}

    def _stretch(self, kind: str, devices: set[int], start: float, work: float) -> float:
        """End time of ``work`` ms started at ``start`` when the ``kind`` intervals on ``devices`` slow it."""
        lists = [self.busy[kind][d] for d in devices]
        low = (start - self.longest[kind],)
        spans = sorted(x for lst in lists for x in lst[bisect_left(lst, low):]) if len(lists) > 1 else \
            lists[0][bisect_left(lists[0], low):]
        t, left = start, work
        for s, e in spans:
            if e <= t:
                continue
            if s > t:
                if s - t >= left:
                    return t + left
                left -= s - t
                t = s
            slowed = (e - t) / self.factor
            if slowed >= left:
                return t + left * self.factor
            left -= slowed
            t = e
        return t + left

    def place(self, kind: str, ranks: list[int], start: float, work: float) -> float:
        """Place ``work`` of ``kind`` ("compute" or "comm") on the ranks' devices; return its end."""
        devices = {self.device[r] for r in ranks}
        end = self._stretch("comm" if kind == "compute" else "compute", devices, start, work)
        for d in devices:
            insort(self.busy[kind][d], (start, end))
        self.longest[kind] = max(self.longest[kind], end - start)
        return end


class _Links:
    """Link times and shared-resource bookkeeping for one simulation."""

    def __init__(self, cluster: ClusterSpec | None, num_ranks: int,
                 message_wait: Callable[[int, float], float] | None = None) -> None:
        if cluster is not None and cluster.world_size < num_ranks:
            raise ValueError(f"cluster {cluster.name!r} has {cluster.world_size} devices but the schedule needs "
                             f"{num_ranks} ranks")
        self.interference = _Interference(cluster, num_ranks) if cluster and cluster.overlap_slowdown > 1 else None
        self.cluster = cluster
        self.free: dict[Any, float] = defaultdict(float)
        self.bytes_by_link: dict[str, int] = defaultdict(int)
        per_node = cluster.devices_per_node if cluster else 1
        self.node = [r // per_node for r in range(num_ranks)]
        self.multi_node = cluster is not None and cluster.num_nodes > 1
        self.link_cache: dict[tuple[int, int], LinkSpec] = {}
        self.message_wait = message_wait  # (receiver, arrival) -> its wait for a core (processor sharing)

    def _ports(self, ranks: list[int]) -> list[tuple]:
        if not self.multi_node:
            return []
        nodes = {self.node[r] for r in ranks}
        return [("port", n) for n in nodes] if len(nodes) > 1 else []

    def transfer(self, src: int, dst: int, nbytes: int, ready: float) -> tuple[float, float]:
        link = None
        if self.cluster is not None:
            link = self.link_cache.get((src, dst))
            if link is None:
                link = self.link_cache[(src, dst)] = self.cluster.link(src, dst)
        self.bytes_by_link[link.name if link else "free"] += nbytes
        free = self.free
        if self.multi_node and self.node[src] != self.node[dst]:
            keys = [("ch", src, dst), ("port", self.node[src]), ("port", self.node[dst])]
            start = max(ready, *(free[k] for k in keys))
        else:
            keys = [("ch", src, dst)]
            start = max(ready, free[keys[0]])
        end = start + (link.transfer_ms(nbytes) if link else 0.0)
        if self.interference is not None and end > start:
            end = self.interference.place("comm", [src, dst], start, end - start)
        if self.message_wait is not None and link is not None:
            end += self.message_wait(dst, end)
        for k in keys:
            free[k] = end
        return start, end

    def all_reduce(self, group: list[int], nbytes: int, ready: float,
                   pace: Callable[[float, float], float] | None = None) -> tuple[float, float]:
        """A ring all-reduce; ``pace(start, work)`` gives its end among the threads on its members' cores
        (processor sharing), else it takes its time on the link."""
        if len(group) == 1:
            return ready, ready
        link = self.cluster.allreduce_link(group) if self.cluster else None
        self.bytes_by_link[link.name if link else "free"] += int(nbytes * 2 * (len(group) - 1) / len(group))
        keys = [("coll", r) for r in group] + self._ports(group)
        start = max([ready] + [self.free[k] for k in keys])
        call = self.cluster.allreduce_call_ms(len(group)) if self.cluster else 0.0
        work = link.allreduce_ms(nbytes, len(group)) + call if link else 0.0
        end = pace(start, work) if pace is not None and work > 0 else start + work
        if self.interference is not None and end > start:
            end = self.interference.place("comm", group, start, end - start)
        for k in keys:
            self.free[k] = end
        return start, end
