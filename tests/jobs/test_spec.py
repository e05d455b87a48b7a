import json

import pytest

from job_test_helpers import WORKER, WORKER_DIR, worker_spec
from workbench.jobs import LaunchSpec, SlurmOptions, launch


@pytest.mark.parametrize("kwargs, fragment", [
    ({"name": "bad name"}, "LaunchSpec.name"),
    ({"nproc_per_node": 0}, "LaunchSpec.nproc_per_node must be an int >= 1"),
    ({"nnodes": 0}, "LaunchSpec.nnodes"),
    ({"entry": "not a module"}, "LaunchSpec.entry must be a dotted module name"),
    ({"max_restarts": -1}, "LaunchSpec.max_restarts"),
    ({"dist_backend": "mpi"}, "LaunchSpec.dist_backend must be one of"),
    ({"env": {"1BAD": "x"}}, "LaunchSpec.env key"),
    ({"nnodes": 2, "hosts": ("a",)}, "LaunchSpec.hosts lists 1 hosts but nnodes is 2"),
    ({"config": object()}, "LaunchSpec.config must be a RunConfig or a dict"),
    ({"stall_after_s": 0}, "LaunchSpec.stall_after_s"),
])
def test_bad_fields_are_refused_with_the_field_name(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        LaunchSpec(**{"nproc_per_node": 1, "entry": WORKER, **kwargs})


@pytest.mark.parametrize("kwargs, fragment", [
    ({"time": "forever"}, "SlurmOptions.time"),
    ({"gpus_per_node": -1}, "SlurmOptions.gpus_per_node"),
    ({"rdzv_port": 80}, "SlurmOptions.rdzv_port"),
    ({"partition": "has space"}, "SlurmOptions.partition"),
    ({"extra_sbatch": ("qos=high",)}, "SlurmOptions.extra_sbatch"),
])
def test_bad_slurm_options(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        SlurmOptions(**kwargs)


def test_round_trip_through_json():
    spec = LaunchSpec(config={"world_size": 4, "x": [1, 2]}, nnodes=2, entry=WORKER, env={"A": "1"},
                      slurm=SlurmOptions(partition="gpu", setup=("module load cuda",)), name="rt")
    assert spec.nproc_per_node == 2
    again = LaunchSpec.from_dict(json.loads(spec.to_json()))
    assert again == spec


def test_world_size_mismatch_is_refused_before_anything_starts(tmp_path):
    spec = LaunchSpec(config={"world_size": 4}, nproc_per_node=3, entry=WORKER, env={"PYTHONPATH": str(WORKER_DIR)},
                      run_root=str(tmp_path))
    with pytest.raises(ValueError, match=r"LaunchSpec.nproc_per_node: world size 1 x 3 = 3 .* set nproc_per_node=4"):
        launch(spec)
    assert list(tmp_path.iterdir()) == []


def test_missing_entry_is_refused_naming_the_fix(tmp_path):
    spec = LaunchSpec(nproc_per_node=1, entry="no_such_module_here.entry", run_root=str(tmp_path))
    with pytest.raises(ValueError, match=r"LaunchSpec.entry 'no_such_module_here.entry' cannot be imported.*PATH"):
        launch(spec)
    assert list(tmp_path.iterdir()) == []


def test_unknown_backend_and_backend_mismatches(tmp_path):
    spec = worker_spec(tmp_path)
    with pytest.raises(ValueError, match="backend must be one of"):
        launch(spec, backend="kubernetes")
    with pytest.raises(ValueError, match="LaunchSpec.nnodes is 2 but the local backend runs one node"):
        launch(spec.replace(nnodes=2), backend="local")
    with pytest.raises(ValueError, match="LaunchSpec.slurm is None"):
        launch(spec, backend="slurm")
    assert list(tmp_path.iterdir()) == []


def test_dryrun_writes_the_run_directory_and_the_exact_command(tmp_path):
    job = launch(worker_spec(tmp_path, steps=3), backend="dryrun")
    command = job.commands[0]
    assert "--rdzv-endpoint localhost:0" in command and f"--rdzv-id {job.run_id}" in command
    assert f"-m {WORKER} --config {job.run_dir}/config.json" in command
    assert json.loads((job.run_dir / "config.json").read_text())["worker"]["steps"] == 3
    status = job.wait(timeout=1)
    assert status.state == "UNKNOWN" and "dry run" in status.reason
    assert not (job.run_dir / "status.json").exists()


def test_two_launches_get_distinct_run_directories(tmp_path):
    spec = worker_spec(tmp_path)
    first, second = launch(spec, backend="dryrun"), launch(spec, backend="dryrun")
    assert first.run_dir != second.run_dir and first.run_id != second.run_id


def test_multinode_dryrun_renders_one_command_per_node(tmp_path):
    spec = worker_spec(tmp_path, nproc=1).replace(nnodes=2, rdzv_port=29555)
    job = launch(spec, backend="dryrun")
    assert len(job.commands) == 2
    for command in job.commands:
        assert "--nnodes 2" in command and "--rdzv-endpoint 127.0.0.1:29555" in command
        assert f"--rdzv-id {job.run_id}" in command and "--rdzv-backend c10d" in command
    remote = spec.replace(hosts=("127.0.0.1", "gpu-node-7"))
    job = launch(remote, backend="dryrun")
    assert job.commands[1].startswith("ssh gpu-node-7 ") and "WORKBENCH_RUN_ID=" in job.commands[1]
    with pytest.raises(ValueError, match="LaunchSpec.rdzv_port is needed"):
        launch(spec.replace(hosts=("head-node", "gpu-node-7"), rdzv_port=None), backend="multinode")


def test_default_entry_config_is_validated_by_run_config(tmp_path):
    pytest.importorskip("workbench.core.config")
    ddp = {"name": "ddp", "model": "mlp", "plan": "dp2-m4", "training": {"steps": 2}}
    spec = LaunchSpec(config=ddp, run_root=str(tmp_path))
    assert spec.nproc_per_node == 2  # taken from the plan's world size
    with pytest.raises(ValueError, match="world size 1 x 3 = 3 does not match the 2 processes"):
        launch(spec.replace(nproc_per_node=3), backend="dryrun")
    with pytest.raises(ValueError, match="resume = false"):
        launch(spec.replace(max_restarts=1), backend="dryrun")
    with pytest.raises(ValueError, match="plan field 'name' = 'magic'"):
        LaunchSpec(config={**ddp, "plan": "magic"})
    with pytest.raises(ValueError, match="'strategy' has moved into the parallel plan"):  # the earlier flat format
        LaunchSpec(config={"name": "ddp", "model": "mlp", "strategy": "ddp", "groups": 2, "steps": 2})
    job = launch(spec.replace(max_restarts=1, config={**ddp, "training": {"steps": 2, "resume": True}}),
                 backend="dryrun")
    assert "-m workbench.runtime.entry" in job.commands[0]
