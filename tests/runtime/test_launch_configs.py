"""Every shipped launch/*.toml loads into a RunConfig, passes the checks before launch, and trains under real
torchrun (2 steps each, gloo; the configs of one process count in one sweep)."""

import math
from pathlib import Path

import pytest

from runtime_launch import Sweep
from workbench.core.config import RunConfig
from workbench.runtime.events import read_events

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
CONFIGS = sorted(LAUNCH.glob("*.toml"))


def test_the_launch_folder_ships_configs():
    assert len(CONFIGS) >= 5


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    runs = {}
    for path in CONFIGS:
        config = RunConfig.from_toml(path).replace(training={"steps": 2, "checkpoint_every": 0})
        runs[path.stem] = (config.world_size, config.to_dict())
    return Sweep(tmp_path_factory.mktemp("launch_configs"), runs, base={})


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_launch_config_trains(path, sweep):
    from workbench.runtime.preflight import check_run

    check_run(RunConfig.from_toml(path))  # what `workbench run` and jobs.launch check before any process starts
    config, run_dir = sweep.run(path.stem), sweep.dir(path.stem)
    for rank in range(config.world_size):
        events = read_events(run_dir, rank)
        steps = [e for e in events if e["kind"] == "step"]
        assert [e["step"] for e in steps] == [1, 2], rank
        assert all(math.isfinite(e["loss"]) for e in steps), rank
        assert events[-1]["kind"] == "end" and events[-1]["status"] == "SUCCEEDED", rank
