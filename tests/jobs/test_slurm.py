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


FAKE = """#!{python}
import json, os, sys
from pathlib import Path
root = Path({root!r})
name = Path(sys.argv[0]).name
with open(root / "calls.log", "a") as f:
    f.write(name + " " + " ".join(sys.argv[1:]) + "\\n")
state = (root / "state").read_text().strip() if (root / "state").exists() else "PENDING"
if name == "sbatch":
    print("4242;cluster")
elif name == "squeue":
    if state in ("PENDING", "RUNNING"):
        print(json.dumps({{"jobs": [{{"job_id": 4242, "job_state": [state]}}]}}))
    else:
        print(json.dumps({{"jobs": []}}))
elif name == "sacct":
    print("4242|" + state + "|0:0")
    print("4242.batch|" + state + "|0:0")
elif name == "scancel":
    (root / "state").write_text("CANCELLED by 1000")
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "squeue", "sacct", "scancel"):
        path = bin_dir / name
        path.write_text(FAKE.format(python=sys.executable, root=str(tmp_path)))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def calls(root):
    return (root / "calls.log").read_text().splitlines()


def test_submit_poll_and_cancel_through_slurm_commands(fake_slurm):
    spec = LaunchSpec(config={}, nproc_per_node=2, entry=WORKER, env={"PYTHONPATH": str(WORKER_DIR)},
                      run_root=str(fake_slurm / "runs"), name="sl", slurm=SlurmOptions(time="10"))
    job = launch(spec, backend="slurm")
    assert job.status().state == "PENDING"
    (fake_slurm / "state").write_text("RUNNING")
    assert job.status().state == "PENDING"  # the answer is reused for min_poll_s: squeue was asked once
    assert sum(c.startswith("squeue") for c in calls(fake_slurm)) == 1
    job.backend.min_poll_s = 0.0
    assert job.launch_info["slurm_job_id"] == "4242"
    script = (job.run_dir / "submit.sbatch").read_text()
    assert "srun --kill-on-bad-exit=1" in script and '"$HEAD_NODE:29400"' in script
    assert calls(fake_slurm)[0] == f"sbatch --parsable {job.run_dir}/submit.sbatch"
    assert job.status().state == "PENDING"  # running in Slurm, but no rank has started yet
    (job.run_dir / "events" / "rank0.jsonl").write_text(json.dumps(
        {"v": 1, "kind": "start", "t": 1.0e12, "rank": 0, "world_size": 2}) + "\n")
    assert job.status().state == "RUNNING"
    status = job.cancel()
    assert "scancel 4242" in calls(fake_slurm)
    assert status.state == "CANCELLED"
    assert json.loads((job.run_dir / "status.json").read_text())["state"] == "CANCELLED"
    assert any(c.startswith("sacct -j 4242") for c in calls(fake_slurm))


def test_finished_job_is_read_from_sacct_after_attach(fake_slurm):
    spec = LaunchSpec(config={}, nproc_per_node=1, entry=WORKER, env={"PYTHONPATH": str(WORKER_DIR)},
                      run_root=str(fake_slurm / "runs"), name="sl", slurm=SlurmOptions())
    job = launch(spec, backend="slurm")
    (fake_slurm / "state").write_text("COMPLETED")
    again = attach(job.run_dir)
    assert again.status().state == "SUCCEEDED"
    assert again.handle.startswith("slurm://")
