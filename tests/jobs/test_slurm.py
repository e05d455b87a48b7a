import json
import os
import stat
import sys
from pathlib import Path

import pytest

from job_test_helpers import WORKER, WORKER_DIR
from workbench.jobs import LaunchSpec, SlurmOptions, attach, launch
from workbench.jobs.backends.slurm import map_slurm_state, render_sbatch

GOLDEN = Path(__file__).parent / "golden"


def golden_spec(**changes):
    base = dict(config={"world_size": 8}, nnodes=2, entry="workbench.runtime.entry_alt", dist_backend="nccl",
                env={"HF_HOME": "/shared/hf cache"}, max_restarts=2, run_root="/shared/runs", name="gpt2-pp",
                python="/shared/venv/bin/python",
                slurm=SlurmOptions(partition="gpu", time="02:00:00", account="proj1", gpus_per_node=4,
                                   cpus_per_task=16, setup=("module load cuda/12.4",),
                                   extra_sbatch=("--exclusive",)))
    base.update(changes)
    return LaunchSpec(**base)


def test_sbatch_script_matches_golden():
    text = render_sbatch(golden_spec(), Path("/shared/runs/gpt2-pp-1"), "gpt2-pp-1")
    assert text == (GOLDEN / "slurm_2x4_nccl.sbatch").read_text()


def test_dry_run_gives_back_the_whole_batch_script(tmp_path):
    spec = golden_spec(run_root=str(tmp_path), name="dry", nnodes=1, dist_backend="gloo",
                       slurm=SlurmOptions(partition="cpu", setup=("module load python",)))
    job = launch(spec, backend="dryrun", check_entry=False)
    assert len(job.commands) == 1
    script = job.commands[0]
    assert script.startswith("#!") and "\n\n" in script  # blank lines inside the script keep it whole
    assert "#SBATCH" in script and "srun" in script and "torchrun" in script


@pytest.mark.parametrize("changes, fragment", [
    ({"slurm": SlurmOptions(gpus_per_node=2)}, "SlurmOptions.gpus_per_node is 2 but NCCL needs one GPU per process"),
    ({"dist_backend": "gloo", "slurm": SlurmOptions(cpus_per_task=2)}, "SlurmOptions.cpus_per_task is 2"),
    ({"run_root": "/tmp/runs"}, "node-local storage"),
    ({"hosts": ("a", "b")}, "Slurm chooses the nodes"),
])
def test_options_that_cannot_work_are_refused(changes, fragment):
    with pytest.raises(ValueError, match=fragment):
        launch(golden_spec(**changes), backend="slurm", check_entry=False)


@pytest.mark.parametrize("raw, state", [("PENDING", "PENDING"), ("RUNNING", "RUNNING"), ("COMPLETED", "SUCCEEDED"),
                                        ("CANCELLED by 1000", "CANCELLED"), ("TIMEOUT", "FAILED"),
                                        ("OUT_OF_MEMORY", "FAILED"), ("NODE_FAIL", "FAILED"), ("WEIRD", "UNKNOWN")])
def test_state_mapping(raw, state):
    assert map_slurm_state(raw) == state


# Fake client commands, only for what the one-host cluster of test_slurm_cluster.py cannot produce: other Slurm
# versions' output (squeue 23.02+'s JSON, an squeue without --json) and states a single host does not reach
# (NODE_FAIL, PREEMPTED), read from accounting (sacct), which that cluster does not keep. Each answers what the
# test wrote into files named after it.
FAKE = """#!{python}
import sys
from pathlib import Path
root = Path({root!r})
name = Path(sys.argv[0]).name
with open(root / "calls.log", "a") as f:
    f.write(name + " " + " ".join(sys.argv[1:]) + "\\n")
if name == "sbatch":
    print("4242;cluster")
    sys.exit(0)
answer = root / (name + ".out")
if not answer.exists():
    sys.exit(1)
print(answer.read_text())
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "squeue", "scontrol", "sacct", "scancel"):
        path = bin_dir / name
        path.write_text(FAKE.format(python=sys.executable, root=str(tmp_path)))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def calls(root):
    return (root / "calls.log").read_text().splitlines()


def submitted(root):
    spec = LaunchSpec(config={}, nproc_per_node=1, entry=WORKER, env={"PYTHONPATH": str(WORKER_DIR)},
                      run_root=str(root / "runs"), name="sl", slurm=SlurmOptions())
    job = attach(launch(spec, backend="slurm").run_dir)  # as a later kernel finds it
    job.backend.min_poll_s = 0.0
    return job


def test_squeue_json_of_slurm_23_and_later_is_read(fake_slurm):
    job = submitted(fake_slurm)
    (fake_slurm / "squeue.out").write_text(json.dumps({"jobs": [{"job_id": 4242, "job_state": ["FAILED"],
                                                                 "exit_code": {"status": ["EXITED"],
                                                                               "return_code": {"number": 3}}}]}))
    status = job.status()
    assert (status.state, status.reason, status.exit_codes) == ("FAILED", "Slurm state FAILED", {"slurm": 3})


def test_an_squeue_without_json_falls_back_to_scontrol(fake_slurm):
    job = submitted(fake_slurm)
    (fake_slurm / "scontrol.out").write_text("JobId=4242 JobName=sl JobState=PENDING Reason=Priority ExitCode=0:0")
    assert job.status().state == "PENDING"
    (fake_slurm / "scontrol.out").write_text("JobId=4242 JobName=sl JobState=COMPLETED Reason=None ExitCode=0:0")
    status = job.status()
    assert (status.state, status.exit_codes) == ("SUCCEEDED", {"slurm": 0})
    assert [c.split()[0] for c in calls(fake_slurm)[1:]] == ["squeue", "scontrol", "squeue", "scontrol"]


@pytest.mark.parametrize("raw", ["NODE_FAIL", "PREEMPTED"])
def test_states_a_single_host_cannot_reach_are_read_from_accounting(fake_slurm, raw):
    job = submitted(fake_slurm)
    (fake_slurm / "sacct.out").write_text(f"4242|{raw}|0:0\n4242.batch|{raw}|0:0")
    status = job.status()
    assert (status.state, status.reason) == ("FAILED", f"Slurm state {raw}")
    assert any(c.startswith("sacct -j 4242") for c in calls(fake_slurm))


def test_a_job_no_command_knows_is_unknown(fake_slurm):
    status = submitted(fake_slurm).status()
    assert status.state == "UNKNOWN" and "unknown to squeue, scontrol and sacct" in status.reason
