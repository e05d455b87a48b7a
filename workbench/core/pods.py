"""Clusters of two levels: nodes grouped in pods, the pods joined by a slower link.

A :class:`~workbench.core.costs.ClusterSpec` has one link inside a node and
one between nodes. Large machines add a level: nodes sit in pods (a DGX
SuperPOD's scalable units, the racks under one leaf-spine block), and a
message between two pods crosses a further tier of switches, often tapered.
:class:`PodClusterSpec` is a ``ClusterSpec`` with two fields more:
``nodes_per_pod`` (nodes are numbered pod-major: nodes ``[p*k, (p+1)*k)``
form pod ``p``) and ``inter_pod``, the link between pods, where
``inter_node`` is now the link between two nodes of one pod. Everything that
asks a cluster for a link (``link``, ``group_link``) gets the pod level from
it; code that works with node numbers asks :func:`nodes_link`, which answers
for both kinds.

A cluster's JSON object with ``nodes_per_pod`` or ``inter_pod`` is a
``PodClusterSpec`` (:func:`cluster_from_dict`); one without them is the
plain ``ClusterSpec`` it always was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .costs import ClusterSpec, LinkSpec
from .fields import check_int

__all__ = ["PodClusterSpec", "POD_FIELDS", "nodes_link", "span_level", "level_link", "cluster_from_dict"]

POD_FIELDS = ("nodes_per_pod", "inter_pod")


@dataclass(frozen=True)
class PodClusterSpec(ClusterSpec):
    """``num_nodes`` nodes in pods of ``nodes_per_pod``; ``inter_node`` joins nodes of a pod, ``inter_pod`` pods."""

    nodes_per_pod: int | None = None
    inter_pod: LinkSpec | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = f"PodClusterSpec[{self.name}]"
        per_pod = check_int(f"{owner}.nodes_per_pod", self.nodes_per_pod, 1)
        if self.num_nodes % per_pod:
            raise ValueError(f"{owner}.nodes_per_pod must divide num_nodes ({self.num_nodes}), got {per_pod}")
        if isinstance(self.inter_pod, dict):
            object.__setattr__(self, "inter_pod", LinkSpec.from_dict(self.inter_pod))
        if self.inter_pod is not None and not isinstance(self.inter_pod, LinkSpec):
            raise ValueError(f"{owner}.inter_pod must be a link (LinkSpec or JSON object), got {self.inter_pod!r}")
        if self.num_pods > 1 and self.inter_pod is None:
            raise ValueError(f"{owner} has {self.num_pods} pods but no inter_pod link")

    @property
    def num_pods(self) -> int:
        return self.num_nodes // self.nodes_per_pod  # type: ignore[operator]

    def pod_of_node(self, node: int) -> int:
        """The pod node ``node`` belongs to."""
        return node // self.nodes_per_pod  # type: ignore[operator]

    def link(self, a: int, b: int) -> LinkSpec:
        """The link two ranks talk over: inside a node, between nodes of a pod, or between pods."""
        return nodes_link(self, (self.node_of(a), self.node_of(b)))

    def group_link(self, ranks: list[int]) -> LinkSpec:
        """The slowest link a collective over ``ranks`` crosses."""
        return nodes_link(self, self.nodes_of(ranks))


def span_level(cluster: ClusterSpec, nodes: Iterable[int]) -> int:
    """How far a set of nodes spreads: 0 one node, 1 several nodes of one pod (or of a cluster without pods),
    2 several pods."""
    distinct = set(nodes)
    if len(distinct) <= 1:
        return 0
    if isinstance(cluster, PodClusterSpec) and len({cluster.pod_of_node(n) for n in distinct}) > 1:
        return 2
    return 1


def level_link(cluster: ClusterSpec, level: int) -> LinkSpec:
    """The link of a :func:`span_level`: the node's, the one between nodes (the node's on one node), between
    pods."""
    if level >= 2 and isinstance(cluster, PodClusterSpec) and cluster.inter_pod is not None:
        return cluster.inter_pod
    if level >= 1 and cluster.inter_node is not None:
        return cluster.inter_node
    return cluster.intra_node


def nodes_link(cluster: ClusterSpec, nodes: Iterable[int]) -> LinkSpec:
    """The slowest link among ``nodes`` (node numbers): the node's own for one node."""
    return level_link(cluster, span_level(cluster, nodes))


def cluster_from_dict(data: dict[str, Any]) -> ClusterSpec:
    """A ``ClusterSpec`` from its JSON object; a ``PodClusterSpec`` when it names a pod field."""
    if isinstance(data, dict) and any(name in data for name in POD_FIELDS):
        return PodClusterSpec.from_dict(data)
    return ClusterSpec.from_dict(data)
