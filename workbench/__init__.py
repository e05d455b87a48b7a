"""The workbench: profile, partition, simulate, plan and launch hybrid-parallel training.

Importing ``workbench`` is cheap and never imports torch: the core values are
re-exported here, and the torch-backed rooms (``models``, ``profiling``,
``runtime``) are imported only when you use them.
"""

from importlib import import_module as _import_module

from .core import (
    Action,
    ClusterSpec,
    DeviceSpec,
    Event,
    LayerCost,
    LayerPlan,
    LinkSpec,
    ModelCosts,
    Op,
    ParallelPlan,
    Partition,
    Schedule,
    Timeline,
    Topology,
    parse_action,
)

__version__ = "0.1.0"

# Public names served lazily from their rooms: name -> "module:attribute".
_LAZY: dict[str, str] = {
    "RunConfig": "workbench.core.config:RunConfig",
    "launch": "workbench.jobs:launch",
    "attach": "workbench.jobs:attach",
    "LaunchSpec": "workbench.jobs:LaunchSpec",
    "Job": "workbench.jobs:Job",
    "simulate": "workbench.scheduling:simulate",
    "partition": "workbench.planning:partition",
    "plan": "workbench.planning:plan",
    "Workload": "workbench.planning:Workload",
    "Budget": "workbench.planning:Budget",
    "SearchOptions": "workbench.planning:SearchOptions",
    "place": "workbench.planning.partitioning.placement:place",
    "choose_inflight": "workbench.scheduling.adaptive:choose_inflight",
    "build_model": "workbench.models:build_model",
    "list_models": "workbench.models:list_models",
    "LayerSequence": "workbench.models:LayerSequence",
    "sample_batch": "workbench.models:sample_batch",
    "profile": "workbench.profiling:profile",
    "project": "workbench.profiling.projection:project",
    "PartitionEditor": "workbench.widgets.partition_editor:PartitionEditor",
    "ScheduleExplorer": "workbench.widgets.schedule_explorer:ScheduleExplorer",
    "PlanExplorer": "workbench.widgets.plan_explorer:PlanExplorer",
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(_import_module(module, __name__), attr)
    globals()[name] = value
    return value


__all__ = [
    "Action", "Op", "Schedule", "parse_action", "Topology", "LayerCost", "ModelCosts",
    "DeviceSpec", "LinkSpec", "ClusterSpec", "Partition", "ParallelPlan", "LayerPlan", "Event", "Timeline",
    "__version__",
    *_LAZY,
]
