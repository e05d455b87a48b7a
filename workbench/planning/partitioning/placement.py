"""Topology-aware placement: which device runs which pipeline stage of which replica.

Problem: a pipeline moves an activation forward and a gradient backward over
every stage boundary for every micro-batch, and each stage all-reduces its
gradients across the replicas that hold it. On a cluster of nodes, a
boundary that crosses nodes travels over the slow inter-node link. The
naive placement (rank ``g * S + s`` on device ``g * S + s``, node-major)
ignores how heavy each boundary is, so a heavy boundary can end up on the
slow link while a light one stays inside a node.

Approach: inside a node every device is the same (one intra-node link), so
the cost depends only on *which node* each (replica, stage) is on. The cost
of a node assignment is the predicted communication time of one iteration in
the alpha-beta model of :class:`~workbench.core.costs.LinkSpec`: for every
replica and boundary ``s -> s+1``, ``2 * m`` messages (activation and
gradient per micro-batch) of ``send_bytes[s]`` over the link between the two
devices, plus every stage's ring all-reduce of ``grad_bytes[s]`` over the
slowest link its group crosses. On a cluster of pods
(:class:`~workbench.core.pods.PodClusterSpec`) a transfer between two pods
takes the link between pods. Node assignments are searched exhaustively
(depth first, nodes numbered in order of first use so identical nodes are
tried once: within a pod, and pods among themselves; branches pruned when
their partial cost already exceeds the best found), and the cheapest wins; the naive node-major mapping is evaluated too
and reported as the rejected alternative when it costs more. Devices inside
a node are then taken in order. Problems too large to enumerate
(``max_assignments``) are refused with the sizes involved.

Pure arithmetic (no torch): :func:`place` gives a :class:`Placement` with the
mapping, its cost, a per-link breakdown and :meth:`Placement.table`;
:func:`placed_schedule` re-indexes a schedule onto the chosen devices so the
simulator times the pipeline on the links the placement uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ...core.costs import ClusterSpec
from ...core.fields import check_int, integer
from ...core.ir import Schedule
from ...core.pods import level_link, nodes_link
from ...core.topology import Topology

__all__ = ["Placement", "place", "placement_cost", "placed_schedule", "naive_devices"]


@dataclass(frozen=True)
class Placement:
    """``device_of[g * S + s]`` is the device of stage ``s`` of replica ``g``; costs in ms per iteration."""

    device_of: tuple[int, ...]
    cost_ms: float
    rows: list[dict[str, Any]]
    naive_device_of: tuple[int, ...]
    naive_cost_ms: float
    naive_rows: list[dict[str, Any]] = field(default_factory=list)
    num_stages: int = 1
    cluster_name: str = ""

    @property
    def rejected(self) -> bool:
        """True when the naive node-major mapping was worse and so not chosen."""
        return self.naive_cost_ms > self.cost_ms

    def table(self) -> str:
        """Chosen mapping and its predicted communication, next to the naive mapping's."""
        S = self.num_stages
        lines = [f"placement on {self.cluster_name}: predicted communication {self.cost_ms:.3f} ms per iteration "
                 f"(naive node-major mapping {self.naive_cost_ms:.3f} ms)",
                 f"{'replica':>7} {'stage':>5} {'device':>6} {'naive':>6}"]
        for r, (d, n) in enumerate(zip(self.device_of, self.naive_device_of)):
            lines.append(f"{r // S:>7} {r % S:>5} {d:>6} {n:>6}")
        lines.append(f"{'transfer':<22}{'MB':>10}{'link':>16}{'ms':>10}{'naive link':>16}{'naive ms':>10}")
        for row, naive in zip(self.rows, self.naive_rows):
            lines.append(f"{row['what']:<22}{row['bytes'] / 1e6:>10.3f}{row['link']:>16}{row['ms']:>10.3f}"
                         f"{naive['link']:>16}{naive['ms']:>10.3f}")
        return "\n".join(lines)


def _check(stage_bytes: Sequence[int], grad_bytes: Sequence[int] | None, num_replicas: int, num_microbatches: int,
           cluster: ClusterSpec) -> tuple[list[int], list[int]]:
    sends = list(stage_bytes)
    if not sends or not all(integer(0).accepts(b) for b in sends):
        raise ValueError(f"send_bytes must be non-negative ints, one per stage (the last one's is ignored), got {sends!r}")
    grads = [0] * len(sends) if grad_bytes is None else list(grad_bytes)
    if len(grads) != len(sends) or not all(integer(0).accepts(b) for b in grads):
        raise ValueError(f"grad_bytes must be {len(sends)} non-negative ints (one per stage), got {grads!r}")
    for name, value in (("num_replicas", num_replicas), ("num_microbatches", num_microbatches)):
        check_int(name, value, 1)
    needed = num_replicas * len(sends)
    if needed > cluster.world_size:
        raise ValueError(f"{num_replicas} replicas x {len(sends)} stages need {needed} devices; cluster "
                         f"{cluster.name!r} has {cluster.world_size}")
    return sends, grads


def naive_devices(num_ranks: int) -> tuple[int, ...]:
    """The node-major mapping every launcher uses by default: rank ``r`` on device ``r``."""
    return tuple(range(num_ranks))


def _breakdown(nodes: Sequence[int], sends: list[int], grads: list[int], num_replicas: int, num_microbatches: int,
               cluster: ClusterSpec) -> list[dict[str, Any]]:
    """Per transfer (boundary of a replica, all-reduce of a stage): bytes, link and predicted ms."""
    S = len(sends)
    layout = Topology(dp=num_replicas, pp=S)
    rows = []
    for g in range(num_replicas):
        for s in range(S - 1):
            link = nodes_link(cluster, (nodes[layout.rank(dp=g, pp=s)], nodes[layout.rank(dp=g, pp=s + 1)]))
            rows.append({"what": f"replica {g} stage {s}->{s + 1}", "bytes": 2 * num_microbatches * sends[s],
                         "link": link.name, "ms": 2 * num_microbatches * link.transfer_ms(sends[s])})
    if num_replicas > 1:
        for s in range(S):
            link = nodes_link(cluster, {nodes[r] for r in layout.group_of(layout.rank(dp=0, pp=s), "dp")})
            rows.append({"what": f"all-reduce stage {s}", "bytes": grads[s], "link": link.name,
                         "ms": link.allreduce_ms(grads[s], num_replicas)})
    return rows


def placement_cost(device_of: Sequence[int], send_bytes: Sequence[int], cluster: ClusterSpec, *,
                   grad_bytes: Sequence[int] | None = None, num_replicas: int = 1,
                   num_microbatches: int = 1) -> float:
    """Predicted communication ms of one iteration for a given mapping (see the module docstring)."""
    sends, grads = _check(send_bytes, grad_bytes, num_replicas, num_microbatches, cluster)
    nodes = [cluster.node_of(d) for d in device_of]
    return sum(r["ms"] for r in _breakdown(nodes, sends, grads, num_replicas, num_microbatches, cluster))


def _candidate_nodes(opened: list[int], per_pod: int) -> list[int]:
    """The nodes the next (replica, stage) may take: the nodes of a pod are interchangeable, and so are the pods,
    so a new node is only opened in order within its pod (the next unused one) and a new pod only in order too;
    ``opened[p]``: the nodes of pod ``p`` in use (one pod: nodes ``0..used``, the next new one last)."""
    pods_used = sum(1 for count in opened if count)
    out = [p * per_pod + j for p in range(pods_used) for j in range(min(opened[p] + 1, per_pod))]
    return out + ([pods_used * per_pod] if pods_used < len(opened) else [])


def place(send_bytes: Sequence[int], cluster: ClusterSpec, *, grad_bytes: Sequence[int] | None = None,
          num_replicas: int = 1, num_microbatches: int = 1, max_assignments: int = 2_000_000) -> Placement:
    """The cheapest mapping of ``num_replicas`` pipelines of ``len(send_bytes)`` stages onto ``cluster``."""
    sends, grads = _check(send_bytes, grad_bytes, num_replicas, num_microbatches, cluster)
    S, n = len(sends), num_replicas * len(sends)
    N, d = cluster.num_nodes, cluster.devices_per_node
    if min(N, n) ** n > max_assignments * max(1, N):
        raise ValueError(f"{n} (replica, stage) pairs on {N} nodes are too many node assignments to enumerate "
                         f"(limit max_assignments={max_assignments}); place fewer stages or replicas per call")
    per_pod = getattr(cluster, "nodes_per_pod", None) or N
    links = [level_link(cluster, level) for level in range(3)]

    def edge_ms(a: int, b: int, nbytes: int) -> float:
        level = 0 if a == b else 1 if a // per_pod == b // per_pod else 2
        return 2 * num_microbatches * links[level].transfer_ms(nbytes)

    best: dict[str, Any] = {"cost": float("inf"), "nodes": None}
    nodes = [0] * n
    reduce_ms: dict[tuple[int, frozenset], float] = {}

    def all_reduces_ms() -> float:
        """The stages' all-reduces, each over the nodes its replicas hold (what ``_breakdown``'s rows sum to)."""
        if num_replicas == 1:
            return 0.0
        total = 0.0
        for s in range(S):
            key = (s, frozenset(nodes[s::S]))
            if key not in reduce_ms:
                reduce_ms[key] = nodes_link(cluster, key[1]).allreduce_ms(grads[s], num_replicas)
            total += reduce_ms[key]
        return total
    load = [0] * N
    opened = [0] * (N // per_pod)  # nodes in use in each pod

    def dfs(i: int, partial: float) -> None:
        if partial >= best["cost"]:
            return
        if i == n:
            total = partial + all_reduces_ms()
            if total < best["cost"]:
                best.update(cost=total, nodes=list(nodes))
            return
        for node in _candidate_nodes(opened, per_pod):
            if load[node] == d:
                continue
            nodes[i] = node
            pod, new = node // per_pod, node % per_pod == opened[node // per_pod]
            load[node] += 1
            opened[pod] += new
            step = edge_ms(nodes[i - 1], node, sends[i % S - 1]) if i % S else 0.0
            dfs(i + 1, partial + step)
            load[node] -= 1
            opened[pod] -= new

    dfs(0, 0.0)
    chosen_nodes = best["nodes"]
    taken = [0] * N
    device_of = []
    for node in chosen_nodes:
        device_of.append(node * d + taken[node])
        taken[node] += 1
    naive = naive_devices(n)
    naive_nodes = [cluster.node_of(r) for r in naive]
    naive_rows = _breakdown(naive_nodes, sends, grads, num_replicas, num_microbatches, cluster)
    naive_cost = sum(r["ms"] for r in naive_rows)
    if naive_cost <= best["cost"]:  # keep the familiar mapping when it is as good
        device_of, chosen_nodes = list(naive), naive_nodes
    rows = _breakdown(chosen_nodes, sends, grads, num_replicas, num_microbatches, cluster)
    return Placement(tuple(device_of), sum(r["ms"] for r in rows), rows, naive, naive_cost, naive_rows, S,
                     cluster.name)


def placed_schedule(schedule: Schedule, device_of: Sequence[int], cluster: ClusterSpec) -> Schedule:
    """``schedule`` with rank ``r``'s actions on device ``device_of[r]`` (other devices idle), for the simulator.

    Works on a compute schedule, with or without its gradient all-reduces, before the sends and receives
    are added (:func:`~workbench.scheduling.passes.lower`): its ``stage_to_rank`` and ``dp_groups`` are
    mapped to devices, so the sends, receives and all-reduces the simulator times use the devices' links.
    """
    if len(device_of) != schedule.num_ranks or len(set(device_of)) != len(device_of):
        raise ValueError(f"device_of must name {schedule.num_ranks} distinct devices, got {list(device_of)!r}")
    if "p2p" in schedule.meta.lowered:  # sends and receives name their peers; all-reduces use meta.dp_groups
        raise ValueError("placed_schedule needs the compute schedule, before lower() added sends and receives")
    if max(device_of) >= cluster.world_size or min(device_of) < 0:
        raise ValueError(f"devices must be in [0, {cluster.world_size - 1}] on cluster {cluster.name!r}, "
                         f"got {list(device_of)!r}")
    ranks: list[tuple] = [() for _ in range(max(device_of) + 1)]
    for r, dev in enumerate(device_of):
        ranks[dev] = schedule.actions(r)
    meta = replace(schedule.meta, **{key: tuple(tuple(device_of[r] for r in row) for row in getattr(schedule.meta, key))
                                     for key in ("stage_to_rank", "dp_groups")})
    return replace(schedule, ranks=tuple(ranks), meta=meta)
