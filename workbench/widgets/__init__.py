"""ipywidgets views over viz, scheduling, planning and jobs.

``PartitionEditor`` (move stage boundaries, see the pipeline change),
``ScheduleExplorer`` (bubbles for teaching), ``PlanExplorer`` (the
planner's ranking), ``TopologyView`` and ``JobMonitor``. Each is imported
when first used, so ``import workbench.widgets`` stays cheap.
"""

from importlib import import_module as _import_module

_LAZY = {
    "PartitionEditor": "partition_editor",
    "ScheduleExplorer": "schedule_explorer",
    "PlanExplorer": "plan_explorer",
    "TopologyView": "topology_view",
    "JobMonitor": "job_monitor",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.widgets' has no attribute {name!r}")
    value = getattr(_import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = list(_LAZY)
