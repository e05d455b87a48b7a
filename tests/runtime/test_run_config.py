"""Run configs and ``workbench run`` refuse bad input before any process starts, naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench.cli import main
from workbench.cli.run_commands import prepare_run
from workbench.core.config import MOVED_TO_PLAN, RunConfig
from workbench.core.plan import GroPipe, ParallelPlan
from workbench.runtime.events import read_events
from workbench.runtime.reference import reference_train

LAUNCH = Path(__file__).resolve().parents[2] / "launch"


def test_toml_round_trip_and_world_size(tmp_path):
    config = RunConfig.from_toml(LAUNCH / "gropipe_vgg.toml")
    assert (config.plan.family, config.world_size, config.microbatch_size) == ("gropipe", 4, 8)
    assert config.plan.name == "gropipe-2x2-1f1b-m4-d1@0-2|3-4"
    assert config.plan.pipeline == GroPipe(inner="1f1b", delay=1)
    config.save_json(tmp_path / "c.json")
    assert RunConfig.from_json(tmp_path / "c.json") == config
    (tmp_path / "c.toml").write_text(config.to_toml())
    assert RunConfig.from_toml(tmp_path / "c.toml") == config
    assert RunConfig.from_toml(LAUNCH / "1f1b_resnet18.toml").world_size == 4
    assert RunConfig.from_toml(LAUNCH / "ddp_vgg.toml").world_size == 4


def test_plan_by_name_table_or_value_is_the_same_config():
    by_name = RunConfig.from_dict({"model": "mlp", "plan": "gropipe-2x2-1f1b-m4-d1"})
    table = {"mesh": {"dp": 2, "pp": 2}, "microbatches": 4,
             "pipeline": {"kind": "gropipe", "inner": "1f1b", "delay": 1}}
    assert RunConfig.from_dict({"model": "mlp", "plan": table}) == by_name
    assert RunConfig(model="mlp", plan=ParallelPlan.parse("gropipe-2x2-1f1b-m4-d1")) == by_name
    assert RunConfig.from_dict({"model": "mlp", "plan": {"name": "gropipe-2x2-1f1b-m4-d1"}}) == by_name
    assert (by_name.plan.dp, by_name.plan.pp, by_name.plan.microbatches, by_name.world_size) == (2, 2, 4, 4)


def _pipe(kind: str, pp: int = 2, dp: int = 1, **options) -> dict:
    return {"mesh": {"dp": dp, "pp": pp}, "microbatches": 4, "pipeline": {"kind": kind, **options}}


# every check of the flat format still exists, now in the plan (``plan field ...``) or the config (``config field``)
@pytest.mark.parametrize(("fields", "words"), [
    ({"plan": "zigzag"}, ["plan field 'name'", "'zigzag'", "gropipe"]),
    ({"plan": {"mesh": {"dp": 1}, "pipeline": {"kind": "zigzag"}}}, ["'pipeline.kind'", "'zigzag'", "gropipe"]),
    ({"plan": 5}, ["'plan'", "plan name"]),
    ({"plan": {"pipeline": {"kind": "1f1b"}}}, ["'mesh'", "missing"]),
    ({"plan": _pipe("1f1b", dp=2)}, ["'mesh.dp'", "set dp = 1"]),
    ({"plan": {"mesh": {"dp": 2, "pp": 2}}}, ["'mesh.pp'", "set pp = 1"]),
    ({"plan": {"mesh": {"dp": 0}}}, ["'dp'", "int >= 1"]),
    ({"plan": "pp2-gpipe-m4", "training": {"global_batch": 30}}, ["'training.global_batch'", "30", "divisible"]),
    ({"plan": "pp2-gpipe-m4", "training": {"optimizer": {"name": "lamb"}}},
     ["'training.optimizer.name'", "sgd, adam"]),
    ({"plan": "pp2-gpipe-m4", "data": {"kind": "imagenet"}}, ["'data.kind'", "digits"]),
    ({"plan": _pipe("gpipe", delay=1)}, ["'pipeline.delay'", "'gpipe' has no such field"]),
    ({"plan": _pipe("gropipe", dp=2, delay=2)}, ["'pipeline.delay'", "0, 1"]),
    ({"plan": _pipe("gropipe", dp=2, inner="zb")}, ["'pipeline.inner'", "gpipe, 1f1b"]),
    ({"plan": _pipe("interleaved", chunks=1)}, ["'pipeline.chunks'", ">= 2"]),
    ({"plan": {**_pipe("interleaved", chunks=2), "microbatches": 3}, "training": {"global_batch": 30}},
     ["'microbatches'", "multiple of pp (2)"]),
    ({"plan": {**_pipe("1f1b"), "microbatches": 0}}, ["'microbatches'", "int >= 1"]),
    ({"plan": "pp2-gpipe-m4", "microbatchs": 4}, ["'microbatchs'", "unknown field"]),
    ({"plan": {**_pipe("gpipe"), "microbatchs": 4}}, ["'microbatchs'", "unknown field of [plan]"]),
    ({"plan": {"mesh": {"dp": 2, "pp": 2, "tp": 2}, "pipeline": {"kind": "gropipe"}}},
     ["'pipeline.kind'", "tensor parallelism inside a pipeline"]),
    ({"plan": _pipe("torch", pp=1)}, ["'mesh.pp'", "pp >= 2"]),
    ({"plan": "torchpp2-1f1b-m4", "training": {"grad_accum": 2}}, ["'training.grad_accum'", "set grad_accum = 1"]),
    ({"plan": "tp1d-2-dp2", "training": {"grad_accum": 2}}, ["'training.grad_accum'", "set grad_accum = 1"]),
    ({"plan": "tp2d-2x2-dp1-rc"}, ["'layers.recompute'", "set recompute = false"]),
    ({"plan": {"mesh": {"dp": 2}, "layers": [{"layers": "all", "recompute": "yes"}]}},
     ["'layers.recompute'", "true or false"]),
    ({"plan": "tp2d-2x2-dp1-fsdp", "training": {"global_batch": 8}},
     ["'layers.dp'", "'fsdp'", "sharded data parallelism"]),
    ({"plan": "gropipe-2x2-1f1b-m4-d0-L[0-1=ddp.rc;2-3=ddp]"}, ["'pipeline.kind'", "per-layer options"]),
    ({"plan": "tp2d-2x2-dp1-L[0-1=ddp.tp2d4;2-3=ddp]", "training": {"global_batch": 8}},
     ["'layers[2]'", "2D tensor-parallel mesh"]),
    ({"plan": "tp1d-4-dp1-L[0-1=ddp;2-3=ddp.tp1d4]", "model": {"name": "mlp", "overrides": {"n_head": 2}}},
     ["'layers[2].tp_degree'", "does not divide the 2 attention heads", "[2]"]),
    ({"plan": "tp1d-2-dp1-L[0-1=fsdp;2-3=ddp.tp1d2]", "training": {"global_batch": 3}},
     ["'training.global_batch'", "layers[0]", "multiple of 2"]),
    ({"plan": {**_pipe("1f1b"), "partition": ""}}, ["'partition'", "'uniform', 'ampa'"]),
    ({"plan": "pp2-1f1b-m4@0|1|2-3"}, ["'partition'", "3 stages", "this plan has 2"]),
    ({"plan": "dp2", "faults": {"step": 1, "rank": 2}}, ["'faults.rank'", "below world size 2"]),
    ({"plan": "dp2", "training": {"precision": "fp8"}}, ["'training.precision'", "fp32"]),
    ({"plan": "dp2", "training": {"grad_accum": 0}}, ["'training.grad_accum'", "int >= 1"]),
    ({"plan": "dp2", "training": {"resume": "yes"}}, ["'training.resume'", "true or false"]),
    ({"plan": "dp2", "run": {"device": "tpu"}}, ["'run.device'", "cuda:N"]),
    ({}, ["'plan'", "missing"]),
])
def test_bad_fields_are_named(fields, words):
    with pytest.raises(ValueError) as info:
        RunConfig.from_dict({"model": "mlp", **fields})
    for word in words:
        assert word in str(info.value)


# where each flat key of the earlier format lives now, as a user looking for it would search the message
MOVED = {
    "strategy": ("gpipe", "[plan]"), "groups": (2, "mesh.dp"), "stages": (2, "mesh.pp"), "tp": (2, "mesh.tp"),
    "chunks": (2, "[plan.pipeline] chunks"), "inner": ("1f1b", "[plan.pipeline] inner"),
    "delay": (1, "[plan.pipeline] delay"), "stash": (False, "[plan.pipeline] stash"),
    "vertical_sync": (True, "[plan.pipeline] vertical_sync"), "mode": ("2bw", "[plan.pipeline] mode"),
    "inflight": (2, "[plan.pipeline] inflight"), "memory_cap_mb": (64.0, "[plan.pipeline] memory_cap_mb"),
    "partition": ("0-1|2-3", "[plan] partition"), "microbatches": (4, "[plan] microbatches"),
    "recompute": (True, "recompute"),
}


def test_every_old_key_is_listed():
    assert set(MOVED) == set(MOVED_TO_PLAN)


@pytest.mark.parametrize("key", sorted(MOVED))
def test_old_flat_keys_are_refused_saying_where_they_moved(key, tmp_path, capsys):
    value, where = MOVED[key]
    with pytest.raises(ValueError) as info:
        RunConfig.from_dict({"model": "mlp", "plan": "pp2-1f1b-m4", key: value})
    message = str(info.value)
    assert f"config field {key!r} has moved into the parallel plan" in message and where in message
    with pytest.raises(ValueError, match=f"'{key}' has moved"):  # also without a plan: the old format as a whole
        RunConfig.from_dict({"model": "mlp", key: value})
    with pytest.raises(ValueError, match=f"'{key}' has moved"):  # and as a change to a valid config
        RunConfig.from_dict({"model": "mlp", "plan": "pp2-1f1b-m4"}).replace(**{key: value})
    path = tmp_path / "old.toml"  # the CLI reads the same message from a TOML file
    path.write_text(f'model = "mlp"\nplan = "pp2-1f1b-m4"\n{key} = {value!r}\n'.replace("True", "true")
                    .replace("False", "false").replace("'", '"'))
    assert main(["run", str(path), "--run-root", str(tmp_path / "runs")]) == 2
    assert f"'{key}' has moved" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_world_size_mismatch_names_the_fix(tmp_path):
    config = RunConfig.from_dict({"model": "mlp", "plan": "gropipe-2x2-1f1b-m4-d0"})
    with pytest.raises(ValueError, match="--nproc 4"):
        prepare_run(config, tmp_path, nproc=2)
    assert not list(tmp_path.iterdir()), "nothing may be created for a refused config"


def test_partition_must_cover_the_model(tmp_path):
    config = RunConfig.from_dict({"model": "mlp", "plan": "pp2-gpipe-m4@0-1|2-2"})
    with pytest.raises(ValueError, match=r"uncovered|4 layers"):
        prepare_run(config, tmp_path)
    # a partition with the wrong number of stages is refused with the plan, before the model is built
    with pytest.raises(ValueError, match=r"'partition'.*has 3 stages; this plan has 2"):
        RunConfig.from_dict({"model": "mlp", "plan": "pp2-gpipe-m4@0|1|2-3"})
    assert not list(tmp_path.iterdir())


def test_unknown_model_is_refused_by_the_cli(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('model = "alexnet-9000"\nplan = "pp2-gpipe-m4"\n')
    assert main(["run", str(path), "--run-root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "alexnet-9000" in err and "vgg-tiny" in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_prepare_run_writes_the_contract(tmp_path):
    config = RunConfig.from_dict({"model": "mlp", "plan": "pp2-1f1b-m4", "name": "t"})
    run_dir, command = prepare_run(config, tmp_path)
    saved = RunConfig.from_json(run_dir / "config.json")
    assert saved.run.dir == str(run_dir) and saved.replace(run={"dir": ""}) == config
    assert saved.plan == ParallelPlan.parse("pp2-1f1b-m4")
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
    path.write_text('model = "mlp"\nplan = "pp2-1f1b-m4"\n[training]\nsteps = 4\nglobal_batch = 16\n'
                    '[training.optimizer]\nname = "adam"\nlr = 0.01\n[run]\ndump_params = true\n'
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
