"""A researcher's own package: model and data factories run from a TOML, and bad configs refused before launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.core.config import RunConfig
from workbench.runtime.events import read_events

PACKAGE = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset


def net(width=32, classes=4):
    return nn.Sequential(nn.Flatten(), nn.Linear(16, width), nn.Tanh(), nn.Linear(width, classes))


def blobs(n=384, noise=1.0):
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 16, generator=g) * 2
    y = torch.randint(0, 4, (n,), generator=g)
    x = centers[y] + noise * torch.randn(n, 16, generator=g)
    return TensorDataset(x[:256], y[:256]), TensorDataset(x[256:], y[256:])


def wide_blobs():
    train, val = blobs()
    return (TensorDataset(torch.cat([train.tensors[0]] * 2, 1), train.tensors[1]),
            TensorDataset(torch.cat([val.tensors[0]] * 2, 1), val.tensors[1]))


def float_targets():
    train, val = blobs()
    return (TensorDataset(train.tensors[0], torch.rand(256, 7)), TensorDataset(val.tensors[0], torch.rand(128, 7)))


def a_dict():
    return {"layers": []}
'''

TOML = '''
name = "own"
model = { name = "labpkg.models:net", args = { width = 48 } }
data = "labpkg.models:blobs"
plan = "pp2-1f1b-m4"

[training]
global_batch = 32
steps = 12
seed = 5
optimizer = { lr = 0.1 }

[run]
dump_params = true
'''


@pytest.fixture()
def project(tmp_path):
    """A project folder holding the package ``labpkg`` and a run config, as a researcher would have it."""
    (tmp_path / "labpkg").mkdir()
    (tmp_path / "labpkg" / "__init__.py").write_text("")
    (tmp_path / "labpkg" / "models.py").write_text(textwrap.dedent(PACKAGE))
    (tmp_path / "run.toml").write_text(TOML)
    return tmp_path


def cli(project: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.multiproc
def test_own_package_runs_from_toml_and_matches_the_reference(project, monkeypatch):
    proc = cli(project, "run", "run.toml", "--run-root", "runs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    status = cli(project, "status", str(run_dir), "--json")
    assert json.loads(status.stdout.strip().splitlines()[-1])["state"] == "SUCCEEDED", status.stderr
    losses = [e["loss"] for e in read_events(run_dir, 0) if e["kind"] == "step"]
    monkeypatch.syspath_prepend(str(project))
    from workbench.runtime.reference import reference_train

    config = RunConfig.from_json(run_dir / "config.json")
    assert config.model.args == {"width": 48} and config.data.factory == "labpkg.models:blobs"
    reference = reference_train(config)
    assert losses == pytest.approx(reference.losses, rel=1e-5, abs=1e-6)
    assert losses[-1] < 0.5 * losses[0]  # it learns the blobs


REFUSALS = [
    ("model.args", 'model = { name = "labpkg.models:net", args = { width = 8, depth = 3 } }',
     "config field 'model.args' has unknown key 'depth' for factory 'labpkg.models:net'"),
    ("model", 'model = "labpkg.nothere:net"', "config field 'model.name' = 'labpkg.nothere:net': cannot import "
                                             "module"),
    ("model", 'model = "labpkg.models:a_dict"', "the factory returned a dict; it must return an nn.Module"),
    ("data", 'data = "labpkg.models:wide_blobs"', "config field 'data': data (labpkg.models:wide_blobs) does not fit"),
    ("data", 'data = "labpkg.models:float_targets"', "config field 'data': the targets of"),
    ("data.factory", 'data = "labpkg.models:net"', "config field 'data.factory' = 'labpkg.models:net' returned"),
    ("model.overrides", 'model = { name = "mlp", overrides = { hidden = 8, widht = 3 } }\ndata = { kind = "digits" }',
     "config field 'model.overrides': unknown config keys ['widht'] for model 'mlp'"),
]


@pytest.mark.slow
@pytest.mark.parametrize("field,change,message", REFUSALS, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSALS)])
def test_bad_configs_are_refused_before_launch(project, field, change, message):
    keys = {line.split("=")[0].strip() for line in change.splitlines()}
    text = "\n".join(line for line in TOML.splitlines() if line.split("=")[0].strip() not in keys)
    (project / "bad.toml").write_text(change + "\n" + text)
    proc = cli(project, "run", "bad.toml", "--run-root", "runs", timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert "Traceback" not in proc.stderr and "torchrun" not in proc.stderr
    assert not (project / "runs").exists()  # nothing left behind


@pytest.mark.multiproc
def test_job_launch_checks_the_factory_where_the_ranks_run(project, tmp_path, monkeypatch):
    """A factory that imports in the notebook but not in the run's processes is refused before launch."""
    from workbench.jobs import LaunchSpec, launch

    monkeypatch.syspath_prepend(str(project))  # the notebook can import it...
    monkeypatch.chdir(tmp_path.parent)  # ...but the ranks' working folder and PYTHONPATH cannot
    monkeypatch.delenv("PYTHONPATH", raising=False)
    config = RunConfig.from_toml(project / "run.toml").replace(training={"steps": 3}, run={"dump_params": False},
                                                               evaluation={"every": 3})
    root = tmp_path / "jobs"
    with pytest.raises(ValueError, match=r"config field '(model.name|data.factory)' = 'labpkg.models:(net|blobs)': "
                                         r"cannot import module 'labpkg.models' \(ModuleNotFoundError"):
        launch(LaunchSpec(config=config, name="own", run_root=str(root)))
    assert not root.exists()
    job = launch(LaunchSpec(config=config, name="own", run_root=str(root), env={"PYTHONPATH": str(project)}))
    status = job.wait(timeout=180)
    assert status.state == "SUCCEEDED", status.text()


@pytest.mark.multiproc
def test_each_replica_loads_its_share_with_workers(project, tmp_path, monkeypatch):
    """DDP on 2 replicas, each rank's DataLoader (2 workers) reading only its half: the reference's losses."""
    from runtime_launch import run_ok, step_losses

    from workbench.runtime.reference import reference_train

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(project))
    config = run_ok(tmp_path / "run", 2, model={"name": "labpkg.models:net", "args": {"width": 24}},
                    data={"kind": "factory", "factory": "labpkg.models:blobs", "workers": 2}, plan="dp2",
                    training={"global_batch": 32, "steps": 10, "optimizer": {"name": "sgd", "lr": 0.1}},
                    run={"dump_params": False})
    assert step_losses(tmp_path / "run") == pytest.approx(reference_train(config).losses, rel=1e-5, abs=1e-6)
