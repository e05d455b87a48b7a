"""Every shipped launch/*.toml loads into a RunConfig and trains under real torchrun (2 steps each, gloo)."""

from pathlib import Path

import pytest

from workbench.core.config import RunConfig
from workbench.jobs import LaunchSpec, launch

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
CONFIGS = sorted(LAUNCH.glob("*.toml"))


def test_the_launch_folder_ships_configs():
    assert len(CONFIGS) >= 5


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_launch_config_trains(path, tmp_path):
    config = RunConfig.from_toml(path).replace(steps=2, checkpoint_every=0)
    job = launch(LaunchSpec(config=config, name=path.stem, run_root=str(tmp_path)))
    status = job.wait(timeout=240)
    assert status.state == "SUCCEEDED", status.text()
    metrics = job.metrics()
    assert sorted(metrics["step"].dropna().unique().tolist()) == [1, 2]
    assert metrics["loss"].notna().all()
