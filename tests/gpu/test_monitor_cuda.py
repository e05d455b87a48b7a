"""The live monitor's data from a run of ranks sharing the GPU at hand.

One 2-rank 1F1B pipeline with stage events on: while it runs and when it
is done, the job's state (what the monitor widget draws) holds each rank's
step metrics with the allocator's memory, a measured timeline of both
ranks with every micro-batch's forward and backward, the simulator's
prediction beside it, and the devices line that says which GPU the ranks
shared; the widget's header shows the same line.
"""

from __future__ import annotations

import html

import pytest
import torch

from gpu_tier import COMMON, DEVICE, DIGITS, ON_GPU, REHEARSAL, assert_ran_where_expected
from workbench.core.config import RunConfig, merge_changes
from workbench.jobs import LaunchSpec, attach, launch

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_monitor_state_of_a_shared_gpu_run(tmp_path):
    fields = merge_changes(merge_changes(COMMON, DIGITS), {
        "plan": "pp2-1f1b-m4", "training": {"steps": 6}, "run": {"device": DEVICE}, "name": "monitor",
        "events": {"stage_events": True, "heartbeat_s": 0.5}})
    job = launch(LaunchSpec(config=fields, name="monitor", run_root=str(tmp_path),
                            dist_backend="staged" if REHEARSAL else "auto"))
    status = job.wait(timeout=240)
    assert status.state == "SUCCEEDED", "\n".join(job.logs(tail=60))
    config = RunConfig.from_json(job.run_dir / "config.json").replace(run={"dir": str(job.run_dir)})
    assert_ran_where_expected(config)

    fresh = attach(job.run_dir)  # a new handle reads the run directory from the start, as a restarted kernel does
    state = fresh.refresh()
    for rank in (0, 1):
        steps = state.metrics[rank]
        assert len(steps) == 6 and (steps.column("memory_bytes") > 0).all()
    timeline = fresh.timeline()
    assert timeline.ranks == [0, 1]
    for rank in (0, 1):
        ops = sorted((e.op, e.microbatch) for e in timeline.events if e.rank == rank and e.op in ("F", "B"))
        assert ops == sorted([("B", m) for m in range(4)] + [("F", m) for m in range(4)]), (rank, ops)
        assert all(e.end > e.start for e in timeline.events if e.rank == rank)
    predicted = fresh.predicted_timeline(timeline)
    assert predicted is not None and predicted.ranks == [0, 1]

    devices = fresh.status().devices_text()
    if ON_GPU and config.world_size > torch.cuda.device_count():
        assert "cuda:0 shared by 2 ranks (0, 1)" in devices and "staged" in devices, devices
    monitor = fresh.monitor(start=False, mode="widget")
    assert monitor.update() is True  # one refresh of a finished run
    assert html.escape(devices) in monitor.header.value, monitor.header.value
