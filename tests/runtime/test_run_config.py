"""Run configs and ``workbench run`` refuse bad input before any process starts, naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench.cli import main
from workbench.cli.run_commands import prepare_run
from workbench.core.config import RunConfig
from workbench.runtime.events import read_events
from workbench.runtime.reference import reference_train

LAUNCH = Path(__file__).resolve().parents[2] / "launch"


def test_toml_round_trip_and_world_size(tmp_path):
    config = RunConfig.from_toml(LAUNCH / "gropipe_vgg.toml")
    assert (config.strategy, config.world_size, config.microbatch_size) == ("gropipe", 4, 8)
    config.save_json(tmp_path / "c.json")
    assert RunConfig.from_json(tmp_path / "c.json") == config
    assert RunConfig.from_toml(LAUNCH / "1f1b_resnet18.toml").world_size == 4
    assert RunConfig.from_toml(LAUNCH / "ddp_vgg.toml").world_size == 4


@pytest.mark.parametrize(("fields", "words"), [
    ({"strategy": "zigzag"}, ["'strategy'", "'zigzag'", "gropipe"]),
    ({"strategy": "1f1b", "groups": 2, "stages": 2}, ["'groups'", "groups = 1"]),
    ({"strategy": "ddp", "groups": 2, "stages": 2}, ["'stages'", "stages = 1"]),
    ({"strategy": "gpipe", "stages": 2, "global_batch": 30}, ["'global_batch'", "30", "divisible"]),
    ({"strategy": "gpipe", "stages": 2, "optimizer": {"name": "lamb"}}, ["'optimizer.name'", "sgd, adam"]),
    ({"strategy": "gpipe", "stages": 2, "data": {"kind": "imagenet"}}, ["'data.kind'", "digits"]),
    ({"strategy": "gpipe", "stages": 2, "delay": 1}, ["'delay'", "gropipe"]),
    ({"strategy": "interleaved", "stages": 2}, ["'chunks'", ">= 2"]),
    ({"strategy": "gpipe", "stages": 2, "microbatchs": 4}, ["'microbatchs'", "unknown field"]),
    ({"strategy": "gropipe", "groups": 2, "stages": 2, "tp": 2}, ["'tp'", "tp = 1"]),
])
def test_bad_fields_are_named(fields, words):
    with pytest.raises(ValueError) as info:
        RunConfig.from_dict({"model": "mlp", **fields})
    for word in words:
        assert word in str(info.value)


def test_world_size_mismatch_names_the_fix(tmp_path):
    config = RunConfig.from_dict({"model": "mlp", "strategy": "gropipe", "groups": 2, "stages": 2})
    with pytest.raises(ValueError, match="--nproc 4"):
        prepare_run(config, tmp_path, nproc=2)
    assert not list(tmp_path.iterdir()), "nothing may be created for a refused config"


def test_partition_must_cover_the_model(tmp_path):
    config = RunConfig.from_dict({"model": "mlp", "strategy": "gpipe", "stages": 2, "partition": "0-1|2-2"})
    with pytest.raises(ValueError, match=r"uncovered|4 layers"):
        prepare_run(config, tmp_path)
    config = RunConfig.from_dict({"model": "mlp", "strategy": "gpipe", "stages": 2, "partition": "0|1|2-3"})
    with pytest.raises(ValueError, match="needs 2"):
        prepare_run(config, tmp_path)


def test_unknown_model_is_refused_by_the_cli(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('model = "alexnet-9000"\nstrategy = "gpipe"\nstages = 2\n')
    assert main(["run", str(path), "--run-root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "alexnet-9000" in err and "vgg-tiny" in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_prepare_run_writes_the_contract(tmp_path):
    config = RunConfig.from_dict({"model": "mlp", "strategy": "1f1b", "stages": 2, "name": "t"})
    run_dir, command = prepare_run(config, tmp_path)
    saved = RunConfig.from_json(run_dir / "config.json")
    assert saved.run_dir == str(run_dir) and saved.replace(run_dir="") == config
    text = (run_dir / "command.txt").read_text()
    assert "--standalone" in text and "workbench.runtime.entry" in text and "29500" not in text
    assert command[-1] == str(run_dir / "config.json")


@pytest.mark.multiproc
@pytest.mark.slow
def test_workbench_run_1f1b_two_stages_equals_reference(tmp_path):
    """``workbench run`` end to end: run directory printed last, and 1F1B on 2 stages equals the reference."""
    import os
    import subprocess
    import sys

    path = tmp_path / "tiny.toml"
    path.write_text('model = "mlp"\nstrategy = "1f1b"\nstages = 2\nsteps = 4\nglobal_batch = 16\n'
                    'microbatches = 4\ndump_params = true\n[optimizer]\nname = "adam"\nlr = 0.01\n'
                    '[data]\nkind = "digits"\n')
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(path), "--run-root", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert run_dir.parent == (tmp_path / "r").resolve()
    assert '"SUCCEEDED"' in (run_dir / "status.json").read_text()
    assert sorted(p.name for p in (run_dir / "events").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    config = RunConfig.from_json(run_dir / "config.json")
    reference = reference_train(config)
    losses = [e["loss"] for e in read_events(run_dir, 0) if e["kind"] == "step"]
    torch.testing.assert_close(losses, reference.losses, rtol=1e-6, atol=1e-6)
    params = {}
    for rank in (0, 1):
        params.update(torch.load(run_dir / "params" / f"rank{rank}.pt", weights_only=True))
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")
