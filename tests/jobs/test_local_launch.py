"""Real torchrun jobs on this machine: success, failure with root cause, stall, cancel, reap, kernel death."""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from job_test_helpers import assert_no_processes, wait_for, worker_spec
from workbench.core.rundir import events_path, parse_event_line
from workbench.jobs import attach, launch, list_runs, reap
from workbench.jobs.process import run_processes

pytestmark = pytest.mark.multiproc


def events(run_dir, rank, kind):
    path = events_path(run_dir, rank)
    if not path.is_file():
        return []
    return [e for e in map(parse_event_line, path.read_text().splitlines()) if e["kind"] == kind]


def test_successful_run_streams_metrics_timeline_logs_and_reattaches(tmp_path):
    job = launch(worker_spec(tmp_path, steps=8, step_s=0.02, name="ok"))
    assert job.status().state in ("PENDING", "RUNNING")
    status = job.wait(timeout=90)
    assert status.state == "SUCCEEDED", status.text()
    assert status.exit_codes == {"node0": 0}
    assert [r.state for r in status.ranks] == ["SUCCEEDED", "SUCCEEDED"] and status.step == 7
    frame = job.metrics()
    assert sorted(frame["rank"].unique()) == [0, 1] and len(frame) == 16
    assert frame.groupby("rank")["step"].max().tolist() == [7, 7]
    assert frame["loss"].iloc[-1] == pytest.approx(status.final_loss)
    timeline = job.timeline()
    assert timeline.ranks == [0, 1] and {e.op for e in timeline} == {"F", "B", "AR"}
    assert timeline.start == 0.0 and all(e.source == "measured" for e in timeline)
    assert json.loads((job.run_dir / "status.json").read_text())["state"] == "SUCCEEDED"
    assert (job.run_dir / "launch.json").is_file() and (job.run_dir / "command.txt").is_file()
    figure = job.summary_figure()
    assert {t.name for t in figure.data if t.type == "scatter"} == {"rank 0", "rank 1"}
    # another process (a restarted kernel) sees the same run through the CLI
    out = subprocess.run([sys.executable, "-m", "workbench.cli", "status", str(job.run_dir), "--json"],
                         capture_output=True, text=True, timeout=60)
    data = json.loads(out.stdout)
    assert data["state"] == "SUCCEEDED" and [r["step"] for r in data["ranks"]] == [7, 7]
    again = attach(job.run_dir)
    assert again.status().final_loss == status.final_loss and len(again.metrics()) == 16
    assert [r["run_id"] for r in list_runs(tmp_path)] == [job.run_id]
    assert_no_processes(job.run_id)


def test_failing_rank_is_reported_with_its_traceback_and_keeps_metrics(tmp_path):
    job = launch(worker_spec(tmp_path, steps=50, step_s=0.05, fail_rank=1, fail_step=4, name="fail"))
    error = wait_for(lambda: events(job.run_dir, 1, "error"), timeout=90, what="the error event")[0]
    status = wait_for(lambda: (s := job.status()).state == "FAILED" and s, timeout=10, poll=0.1,
                      what="FAILED within 10 s of the error")
    assert time.time() - error["t"] < 10.0
    assert status.root_cause["rank"] == 1
    assert "RuntimeError: injected failure on rank 1 at step 4" in status.root_cause["traceback"]
    assert "rank 1 raised RuntimeError" in status.reason
    frame = job.metrics()
    assert sorted(frame[frame["rank"] == 1]["step"].tolist()) == [0, 1, 2, 3]
    assert_no_processes(job.run_id)
    assert any("injected failure" in line for line in job.logs(rank=1))


def test_stalled_rank_is_detected_and_cancel_leaves_nothing(tmp_path):
    job = launch(worker_spec(tmp_path, steps=500, step_s=0.05, stall_rank=1, stall_step=3, stall_after_s=1.5,
                             name="stall"))
    status = wait_for(lambda: (s := job.status()).ranks and s.stalled_ranks == [1] and s, timeout=90,
                      what="rank 1 to be STALLED")
    assert status.state == "RUNNING" and status.rank(0).state == "RUNNING"
    assert status.rank(1).heartbeat_age_s > 1.5 and "rank 1 stalled" in status.reason
    pids = [e["pid"] for r in (0, 1) for e in events(job.run_dir, r, "start")]
    assert all(psutil.pid_exists(p) for p in pids)
    began = time.monotonic()
    final = job.cancel(grace_s=3.0)
    assert final.state == "CANCELLED" and time.monotonic() - began < 20
    assert_no_processes(job.run_id)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_guard_cleans_up_after_a_killed_torchrun(tmp_path):
    job = launch(worker_spec(tmp_path, steps=2000, step_s=0.1, name="killed"))
    wait_for(lambda: all(events(job.run_dir, r, "step") for r in (0, 1)), timeout=90, what="both ranks stepping")
    torchrun = psutil.Process(job.launch_info["agents"][0]["pid"]).children()[0]
    assert "torch.distributed.run" in " ".join(torchrun.cmdline())
    torchrun.kill()
    status = job.wait(timeout=15)
    assert status.state == "FAILED" and status.exit_codes == {"node0": 137}
    assert_no_processes(job.run_id)


def test_reap_kills_workers_orphaned_by_a_killed_guard_and_torchrun(tmp_path):
    job = launch(worker_spec(tmp_path, steps=2000, step_s=0.1, name="orphan"))
    wait_for(lambda: all(events(job.run_dir, r, "step") for r in (0, 1)), timeout=90, what="both ranks stepping")
    guard = psutil.Process(job.launch_info["agents"][0]["pid"])
    torchrun = guard.children()[0]
    torchrun.kill()  # first: a guard that dies first makes torchrun stop its workers (parent-death signal)
    guard.kill()
    assert job.wait(timeout=10).state in ("FAILED", "UNKNOWN")
    orphans = run_processes(job.run_id)
    assert len(orphans) >= 2  # torchrun and its guard are gone, the workers are not
    reaped = reap(tmp_path)
    assert [r["run_id"] for r in reaped] == [job.run_id] and reaped[0]["killed"] >= 2
    assert_no_processes(job.run_id)
    assert reap(tmp_path) == []


KERNEL_CODE = """
import sys
sys.path.insert(0, {helpers!r})
from job_test_helpers import worker_spec
from workbench.jobs import launch
job = launch(worker_spec({root!r}, steps=2000, step_s=0.1, name="kernel"))
print(job.run_dir)
"""


def test_shutting_the_kernel_down_leaves_no_process(tmp_path):
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    outputs = []
    try:
        helpers = os.path.dirname(__file__)
        reply = client.execute_interactive(KERNEL_CODE.format(helpers=helpers, root=str(tmp_path)), timeout=60,
                                           output_hook=lambda msg: outputs.append(msg))
    except Exception:
        manager.shutdown_kernel(now=True)
        raise
    assert reply["content"]["status"] == "ok"
    run_dir = next(m["content"]["text"] for m in outputs if m["msg_type"] == "stream").strip()
    job = attach(run_dir)
    wait_for(lambda: all(events(job.run_dir, r, "step") for r in (0, 1)), timeout=90, what="both ranks stepping")
    assert len(run_processes(job.run_id)) >= 3
    client.stop_channels()
    manager.shutdown_kernel(now=True)
    assert_no_processes(job.run_id, timeout=20)



def test_logs_split_by_rank_where_torchrun_has_no_prefix_template(tmp_path, monkeypatch):
    """torch 2.11's torchrun lacks --log-line-prefix-template: its own [default<r>]: prefix still splits the logs."""
    from workbench.jobs.backends import local

    monkeypatch.setattr(local, "prefix_template_supported", lambda python: False)
    job = launch(worker_spec(tmp_path, steps=20, step_s=0.01, fail_rank=1, fail_step=2, name="plain-prefix"))
    assert "--log-line-prefix-template" not in (job.run_dir / "command.txt").read_text()
    assert job.wait(timeout=90).state == "FAILED"
    console = (job.run_dir / "logs" / "node0" / "console.log").read_text()
    assert "[default1]:" in console and not any(line.startswith("[rank") for line in console.splitlines())
    assert any("injected failure" in line for line in job.logs(rank=1))
    assert not any("injected failure" in line for line in job.logs(rank=0))
    assert_no_processes(job.run_id)


def test_torchrun_options_are_read_from_the_ranks_torch_without_importing_torch():
    """The launcher asks the ranks' interpreter where its torch lives and reads its torchrun's options there."""
    from workbench.jobs.backends import local

    local.prefix_template_supported.cache_clear()
    assert local.prefix_template_supported(sys.executable) is True  # torch 2.14's torchrun has the option
    # an interpreter not on this machine (a Slurm script's) is taken to have this process's torch
    assert local.prefix_template_supported("/nonexistent/python") is True
    probe = ("import sys; from workbench.jobs.backends import local; "
             "local.prefix_template_supported(sys.executable); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
