"""2D tensor parallelism through the torchrun entry: launch/tensor2d_gpt2.toml on a 2 x 2 grid, and the config
checks that refuse a bad grid before any process starts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from workbench.core.config import RunConfig, merge_changes
from workbench.runtime.events import read_events

from runtime_launch import torchrun

LAUNCH = Path(__file__).resolve().parents[2] / "launch" / "tensor2d_gpt2.toml"


@pytest.mark.multiproc
def test_tensor2d_launch_runs_through_entry(tmp_path):
    data = tomllib.loads(LAUNCH.read_text())
    config = RunConfig.from_dict(data).replace(run={"dir": str(tmp_path), "collective_timeout_s": 60.0})
    config.save_json(tmp_path / "config.json")
    assert config.world_size == 4
    proc = torchrun(tmp_path, config.world_size, timeout=120.0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(4):
        events = read_events(tmp_path, rank)
        kinds = [e["kind"] for e in events]
        assert kinds.count("start") == 1 and kinds[-1] == "end", kinds
        assert events[-1]["status"] == "SUCCEEDED"
        steps = [e for e in events if e["kind"] == "step"]
        assert [e["step"] for e in steps] == list(range(1, config.training.steps + 1))
        assert {e["op"] for e in events if e["kind"] == "stage"} == {"F", "B", "STEP"}
        losses = [e["loss"] for e in steps]
        assert sum(losses[-5:]) / 5 < losses[0] - 0.3, losses
    rank0 = [e["loss"] for e in read_events(tmp_path, 0) if e["kind"] == "step"]
    rank3 = [e["loss"] for e in read_events(tmp_path, 3) if e["kind"] == "step"]
    assert rank0 == pytest.approx(rank3, rel=1e-5)


@pytest.mark.parametrize("fields, message", [
    ({"plan": {"mesh": {"dp": 1, "tp_row": 2, "tp_col": 3}}}, "a 2D tensor grid is square: tp_row = tp_col"),
    ({"plan": "tp2d-3x3-dp1"}, "q = 3 does not divide the 4 attention heads; nearest valid is tp_row = tp_col = 2"),
    ({"plan": "tp2d-4x4-dp1", "model": {"overrides": {"n_head": 6}}}, "nearest valid is tp_row = tp_col = 3"),
    ({"plan": "tp2d-2x2-dp1", "training": {"global_batch": 7}}, "grid rows = 2"),
])
def test_tensor2d_config_refuses_bad_grid(fields, message):
    base = {"model": {"name": "gpt2-tiny", "overrides": {"n_head": 4}}, "training": {"global_batch": 8}}
    with pytest.raises(ValueError, match="'mesh'|'layers.tp_degree'|'training.global_batch'") as info:
        RunConfig.from_dict(merge_changes(base, fields))
    assert message in str(info.value)


def test_tensor1d_config_layout():
    config = RunConfig.from_dict({"model": "gpt2-tiny", "plan": "tp1d-2-dp2", "training": {"global_batch": 8}})
    assert config.world_size == 4 and config.plan.family == "tp1d" and config.plan.microbatches == 1
    with pytest.raises(ValueError, match="nearest valid is tp = 2"):
        config.replace(plan="tp1d-3-dp2", model={"overrides": {"n_head": 4}})
