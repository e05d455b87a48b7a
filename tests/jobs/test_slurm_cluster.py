"""The Slurm backend against a real one-host cluster: slurmctld, slurmd and munge on this machine.

``scripts/ensure_slurm.sh`` installs and starts the cluster for the session
(the ``slurm_cluster`` fixture); where it cannot, these tests skip with its
reason. Every job is submitted as a notebook would, ``launch(LaunchSpec(...),
backend="slurm")``, and goes through sbatch, srun and torchrun. The jobs are
submitted together at the start of the module and run side by side, the
time-limited one first (Slurm enforces limits in whole minutes, checked every
30 s, so it needs 60 to 90 s whatever we do).
"""

import json
import subprocess
import sys
import time

import pytest

from job_test_helpers import assert_no_processes, wait_for
from workbench.core.rundir import events_path, parse_event_line
from workbench.jobs import LaunchSpec, SlurmOptions, launch
from workbench.jobs.spec import check_launchable, check_run_configs
from workbench.widgets.job_monitor import JobMonitor

pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.slurm]

CONFIG = {"name": "sl", "model": "mlp", "plan": "pp2-1f1b-m2",
          "data": {"kind": "synthetic"},
          "training": {"steps": 300, "global_batch": 16, "checkpoint_every": 25, "resume": True}}
POLL_S = 0.2  # how often these tests let the backend ask Slurm (a notebook's default is 5 s)


def config(**training):
    return {**CONFIG, "training": {**CONFIG["training"], **training}}


def events(job, rank, kind):
    path = events_path(job.run_dir, rank)
    if not path.is_file():
        return []
    return [e for e in map(parse_event_line, path.read_text().splitlines()) if e["kind"] == kind]


def last_step(job, rank=0):
    return max((e["step"] for e in events(job, rank, "step")), default=-1)


def slurm(*argv):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True).stdout


def in_queue(job_id):
    """What plain ``squeue`` lists: pending, running and completing jobs only."""
    return bool(slurm("squeue", "-h", "-j", job_id, "-o", "%i").strip())


def attach_in_a_fresh_process(run_dir):
    """``attach(run_dir).status()`` from a new Python, as a restarted kernel would."""
    code = ("import json, sys; from workbench.jobs import attach; job = attach(sys.argv[1]); "
            f"job.backend.min_poll_s = {POLL_S}; s = job.status(); "
            "print(json.dumps({'state': s.state, 'reason': s.reason, 'job_id': job.launch_info['slurm_job_id']}))")
    out = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm-runs")

    specs = {
        # the batch script sleeps past its one-minute limit before torchrun would start
        "timeout": (config(), {"time": "1", "setup": ("sleep 300",)}),
        "plain": (config(), {}),
        "requeue": (config(), {"requeue": True}),
        "cancel": (config(steps=100_000, checkpoint_every=0), {}),
        "failure": ({**config(steps=40), "faults": {"step": 5, "rank": 1}}, {}),
        "local": (config(), None),
    }
    specs = {name: LaunchSpec(config=cfg, nproc_per_node=2, run_root=str(root), name=name,
                              slurm=None if options is None else SlurmOptions(**{"time": "5", **options}))
             for name, (cfg, options) in specs.items()}
    check_launchable(specs["plain"])  # what launch checks, for all six configs in one preflight process
    check_run_configs(list(specs.values()))
    submitted = {}
    for name, spec in specs.items():
        submitted[name] = launch(spec, backend="local" if spec.slurm is None else "slurm", check_entry=False)
        if spec.slurm is not None:
            submitted[name].backend.min_poll_s = POLL_S
    yield submitted
    for job in submitted.values():
        if not job.status().finished:
            job.cancel()


def test_a_job_runs_through_sbatch_srun_and_torchrun_and_ends_with_the_local_loss(jobs):
    job = jobs["plain"]
    job_id = job.launch_info["slurm_job_id"]
    script = (job.run_dir / "submit.sbatch").read_text()
    assert "srun --kill-on-bad-exit=1" in script and "torch.distributed.run" in script
    wait_for(lambda: not in_queue(job_id), timeout=180, poll=0.5, what="the job to leave the queue")
    # a fresh process finds the ended job by its id (the controller still holds its record)
    answer = attach_in_a_fresh_process(job.run_dir)
    assert answer == {"state": "SUCCEEDED", "reason": "Slurm state COMPLETED", "job_id": job_id}
    status = job.status()
    local = jobs["local"].wait(timeout=180)
    assert local.state == "SUCCEEDED", local.text()
    assert status.state == "SUCCEEDED" and status.step == CONFIG["training"]["steps"]
    assert status.final_loss == local.final_loss  # bitwise: the same run, launched by Slurm
    output = (job.run_dir / "logs" / f"slurm-{job_id}.out").read_text()
    assert "[rank0]:step 300/300" in output  # the ranks' console reached Slurm's output file
    start = events(job, 0, "start")[0]
    assert start["host"] and start["world_size"] == 2 and start["restart"] == 0


def test_a_running_job_streams_attaches_from_a_fresh_process_and_cancels(jobs):
    job = jobs["cancel"]
    wait_for(lambda: last_step(job) >= 3, timeout=180, poll=0.1, what="the job's first steps")
    assert job.status().state == "RUNNING"
    monitor = JobMonitor(job, mode="widget", start=False)
    monitor.update()
    first = len(monitor.loss_fig.data[0].x)
    assert first >= 1 and "RUNNING" in monitor.header.value
    wait_for(lambda: last_step(job) >= max(30, first + 10), timeout=120, poll=0.1, what="more steps")
    monitor.update()
    assert len(monitor.loss_fig.data[0].x) > first  # the widget follows the job while Slurm runs it
    answer = attach_in_a_fresh_process(job.run_dir)
    assert answer["state"] == "RUNNING" and answer["job_id"] == job.launch_info["slurm_job_id"]
    status = job.cancel()
    assert status.state == "CANCELLED" and status.reason == "cancelled on request"
    wait_for(lambda: not in_queue(job.launch_info["slurm_job_id"]), timeout=60, poll=0.25,
             what="scancel to take the job out of the queue")
    assert_no_processes(job.run_id, timeout=30)
    assert "CANCELLED" in slurm("scontrol", "show", "job", "-o", job.launch_info["slurm_job_id"])


def test_a_rank_that_raises_fails_the_job_with_its_error(jobs):
    status = jobs["failure"].wait(timeout=180)
    assert status.state == "FAILED", status.text()
    assert status.reason.startswith("rank 1 raised"), status.reason
    assert "injected" in status.reason.lower() or "fault" in status.reason.lower(), status.reason
    assert status.exit_codes == {"slurm": 1}


def test_a_requeued_job_resumes_from_its_checkpoint_and_ends_with_the_loss_of_its_twin(jobs):
    job = jobs["requeue"]
    job_id = job.launch_info["slurm_job_id"]
    wait_for(lambda: events(job, 0, "checkpoint") and last_step(job) >= 30, timeout=180, poll=0.02,
             what="a checkpoint and step 30")
    slurm("scontrol", "requeue", job_id)
    wait_for(lambda: "Restarts=1" in slurm("scontrol", "show", "job", "-o", job_id), timeout=60, poll=0.25,
             what="Slurm to requeue the job")
    # Slurm holds a requeued job back for two minutes before it may start again; let it go now. The hold can be
    # set after a first release (while the old attempt is still completing), so release it until it runs.
    def running_again() -> bool:
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True)
        return "JobState=RUNNING" in slurm("scontrol", "show", "job", "-o", job_id)

    wait_for(running_again, timeout=200, poll=1.0, what="the requeued job to run again")
    status = job.wait(timeout=240)
    twin = jobs["local"].wait(timeout=180)
    assert status.state == "SUCCEEDED", status.text()
    starts = events(job, 0, "start")
    assert [s["restart"] for s in starts] == [0, 1] and status.restarts == 1
    assert starts[1]["resumed_from"] is not None and starts[1]["resumed_from"] >= 25
    assert status.final_loss == twin.final_loss  # bitwise: resumed from the checkpoint
    assert "Restarts=1" in slurm("scontrol", "show", "job", "-o", job_id)


def test_a_job_past_its_time_limit_fails_with_the_reason_timeout(jobs):
    job = jobs["timeout"]
    status = job.wait(timeout=200)
    assert status.state == "FAILED", status.text()
    assert status.reason.startswith("TIMEOUT"), status.reason
    assert "JobState=TIMEOUT" in slurm("scontrol", "show", "job", "-o", job.launch_info["slurm_job_id"])
