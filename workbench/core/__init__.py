"""Core values every room exchanges (standard library only)."""

from .costs import ClusterSpec, DeviceSpec, LayerCost, LinkSpec, ModelCosts
from .ir import Action, Op, Schedule, parse_action
from .partition import Partition
from .plan import LayerPlan, ParallelPlan
from .timeline import Event, Timeline
from .topology import Topology

__all__ = [
    "Action", "Op", "Schedule", "parse_action",
    "Topology",
    "LayerCost", "ModelCosts", "DeviceSpec", "LinkSpec", "ClusterSpec",
    "Partition", "ParallelPlan", "LayerPlan",
    "Event", "Timeline",
]
