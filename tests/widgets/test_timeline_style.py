"""Every widget's timeline is drawn by ``viz.timeline``: style colours, ranks from rank 0 down (no kernel)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "viz"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from figure_checks import assert_style_colours, rank_lanes  # noqa: E402
from job_test_helpers import write_synthetic_run  # noqa: E402

from workbench.core.costs import ModelCosts  # noqa: E402
from workbench.jobs import attach  # noqa: E402
from workbench.planning import SearchOptions, Workload, plan  # noqa: E402
from workbench.widgets.job_monitor import JobMonitor  # noqa: E402
from workbench.widgets.partition_editor import PartitionEditor  # noqa: E402
from workbench.widgets.plan_explorer import PlanExplorer  # noqa: E402
from workbench.widgets.schedule_explorer import ScheduleExplorer  # noqa: E402


def ranks(n: int) -> list[str]:
    return [f"rank {r}" for r in range(n)]


def test_schedule_explorer_lists_ranks_from_rank_0_alone_and_compared():
    explorer = ScheduleExplorer("1f1b", stages=11, microbatches=11)
    assert rank_lanes(explorer.figure_widget) == rank_lanes(explorer.figure()) == ranks(11)
    assert assert_style_colours(explorer.figure_widget) >= {"forward", "backward", "idle"}
    explorer.stages.value = 12  # redrawn in place: the lanes follow
    assert rank_lanes(explorer.figure_widget) == ranks(12)
    explorer.compare.value = "gpipe"
    assert rank_lanes(explorer.figure_widget) == rank_lanes(explorer.figure_widget, "yaxis2") == ranks(12)
    assert_style_colours(explorer.figure_widget)


def test_partition_editor_lists_ranks_from_rank_0():
    costs = ModelCosts.uniform(24, param_bytes=2**20, activation_bytes=2**20, batch_size=8)
    editor = PartitionEditor(costs, num_stages=8, num_microbatches=8, cluster="8xV100-PCIe")
    assert rank_lanes(editor.timeline_fig) == ranks(8)
    assert assert_style_colours(editor.timeline_fig) >= {"forward", "backward", "send/recv", "idle"}
    assert rank_lanes(editor.figures()[1]) == ranks(8)


def test_plan_explorer_lists_ranks_from_rank_0():
    costs = ModelCosts.uniform(16, param_bytes=2**20, activation_bytes=2**20, batch_size=32)
    explorer = PlanExplorer(costs, "4xV100-NVLink", 32, result=plan(Workload(costs, 32), "4xV100-NVLink",
                                                                    options=SearchOptions(top=4, recompute=(False,))))
    simulated = [p for p in explorer.result.plans if p.timeline() is not None]
    assert simulated, "the ranking has a pipeline plan to draw"
    explorer.select(simulated[0].name)
    assert rank_lanes(explorer.timeline_fig) == ranks(len(simulated[0].timeline().ranks))
    assert_style_colours(explorer.timeline_fig)


def test_job_monitor_overlays_prediction_and_run_from_rank_0(tmp_path):
    monitor = JobMonitor(attach(write_synthetic_run(tmp_path, steps=3)), mode="widget", start=False)
    monitor.update()
    assert rank_lanes(monitor.timeline_fig) == ranks(2)
    assert assert_style_colours(monitor.timeline_fig) >= {"forward", "backward", "all-reduce"}
    assert rank_lanes(monitor.summary_figure(), "yaxis3") == ranks(2)
