"""ipywidgets views over viz, scheduling, planning and jobs.

``PartitionEditor`` (move stage boundaries, see the pipeline change),
``ScheduleExplorer`` (bubbles for teaching), ``PlanExplorer`` (the
planner's ranking), ``TopologyView`` (the rank grid) and ``JobMonitor``
(a live run). None of them imports torch.
"""

from .job_monitor import JobMonitor
from .partition_editor import PartitionEditor
from .plan_explorer import PlanExplorer
from .schedule_explorer import ScheduleExplorer
from .topology_view import TopologyView

__all__ = ["PartitionEditor", "ScheduleExplorer", "PlanExplorer", "TopologyView", "JobMonitor"]
