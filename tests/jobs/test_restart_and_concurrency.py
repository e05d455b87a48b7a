"""Fault tolerance and isolation with the real training entry.

A worker of a job that allows restarts is SIGKILLed mid-run: torchrun
restarts the workers, they resume from the latest checkpoint, and the run
ends with bit-for-bit the loss of an identical job launched at the same time
without a fault (which also shows two jobs at once do not collide).
"""

import importlib.util
import os
import signal

import psutil
import pytest

from job_test_helpers import assert_no_processes, wait_for
from workbench.core.rundir import events_path, parse_event_line
from workbench.jobs import LaunchSpec, launch
from workbench.widgets.job_monitor import JobMonitor

pytestmark = [pytest.mark.multiproc, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("workbench.runtime.entry") is None,
                                 reason="needs the training entry workbench.runtime.entry")]

CONFIG = {"name": "ft", "model": "mlp", "plan": "dp2", "data": {"kind": "synthetic"},
          "training": {"steps": 1200, "checkpoint_every": 20, "resume": True, "global_batch": 16},
          "run": {"collective_timeout_s": 20.0}}


def events(run_dir, rank, kind):
    path = events_path(run_dir, rank)
    if not path.is_file():
        return []
    return [e for e in map(parse_event_line, path.read_text().splitlines()) if e["kind"] == kind]


def test_killed_worker_restarts_from_checkpoint_and_matches_an_uninterrupted_twin(tmp_path):
    faulty = launch(LaunchSpec(config=CONFIG, name="faulty", max_restarts=1, run_root=str(tmp_path)))
    twin = launch(LaunchSpec(config=CONFIG, name="twin", run_root=str(tmp_path)))
    assert faulty.run_dir != twin.run_dir
    wait_for(lambda: events(faulty.run_dir, 0, "checkpoint") and
             max((e["step"] for e in events(faulty.run_dir, 1, "step")), default=-1) >= 30,
             timeout=180, poll=0.02, what="a checkpoint and step 30 on the faulty job")
    ports = set()
    for job in (faulty, twin):  # both rendezvous stores are live now: they must be on different ports
        pid = wait_for(lambda: events(job.run_dir, 0, "start"), timeout=60, what="rank 0 started")[0]["pid"]
        ports.add(psutil.Process(pid).environ()["MASTER_PORT"])
    assert len(ports) == 2
    os.kill(events(faulty.run_dir, 1, "start")[0]["pid"], signal.SIGKILL)
    done_faulty, done_twin = faulty.wait(timeout=240), twin.wait(timeout=240)
    assert done_twin.state == "SUCCEEDED", done_twin.text()
    assert done_faulty.state == "SUCCEEDED", done_faulty.text()
    assert done_faulty.restarts >= 1 and done_twin.restarts == 0
    assert done_faulty.final_loss == done_twin.final_loss  # bitwise: resumed from the checkpoint
    last_start = events(faulty.run_dir, 0, "start")[-1]
    assert last_start["restart"] >= 1 and last_start["resumed_from"] is not None
    steps = [e["step"] for e in events(faulty.run_dir, 0, "step")]
    assert steps.count(steps[0]) == 1  # the steps before the checkpoint were not run again
    assert last_start["resumed_from"] < CONFIG["training"]["steps"], "the kill landed after the last step"
    monitor = JobMonitor(faulty, mode="widget", start=False)
    monitor.update()
    assert f"restarts: {done_faulty.restarts}" in monitor.header.value
    assert len(monitor.loss_fig.layout.shapes) >= 1  # the restart is marked on the loss curve
    frame = faulty.metrics()
    assert frame["restart"].min() == 0 and frame["restart"].max() == done_faulty.restarts
    for job in (faulty, twin):
        assert_no_processes(job.run_id)
