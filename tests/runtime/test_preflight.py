"""Checks of a plan against its model run in the launching process, before any rank starts."""

import pytest

from workbench.cli import main
from workbench.core.config import RunConfig
from workbench.models.zoo import list_models
from workbench.runtime.preflight import check_run


@pytest.mark.parametrize("plan", ["tp1d-2-dp1", "tp2d-2x2-dp1"])
@pytest.mark.parametrize("model", ["bert-tiny", "mlp", "vgg-tiny"])
def test_uniform_tensor_parallelism_of_a_model_that_is_not_gpt2_is_refused(model, plan):
    config = RunConfig(model=model, plan=plan, training={"global_batch": 8, "steps": 1})
    with pytest.raises(ValueError, match=r"field 'model.name' = .* uniform tensor parallelism needs a GPT-2 model"):
        check_run(config)


@pytest.mark.parametrize("plan", ["tp1d-2-dp1", "tp2d-2x2-dp1"])
def test_uniform_tensor_parallelism_of_gpt2_passes(plan):
    check_run(RunConfig(model="gpt2-tiny", plan=plan, training={"global_batch": 8, "steps": 1}))


@pytest.mark.parametrize("model", list_models())
def test_the_planner_offers_uniform_tensor_parallelism_where_the_preflight_passes_it(model):
    """One rule (workbench.core.tensor_support): `workbench plan` gives a zoo model the shape that lets the planner
    offer tp1d-* / tp2d-* plans exactly where the preflight lets them run."""
    from workbench.cli.plan_commands import _shards_whole

    try:
        check_run(RunConfig(model=model, plan="tp1d-2-dp1", training={"global_batch": 8, "steps": 1}))
        passes = True
    except ValueError as exc:
        assert "uniform tensor parallelism needs a GPT-2 model" in str(exc)
        passes = False
    assert _shards_whole(model, {}) is passes
    assert passes is model.startswith("gpt2")


def test_the_layer_limits_are_the_rules_the_ranks_apply():
    from workbench.models.zoo import build_model
    from workbench.runtime.layer_parallel import tensor_parallel_limits

    limits = {name: dict(zip(build_model(name).layer_names, tensor_parallel_limits(build_model(name), cap=8)))
              for name in ("vgg-tiny", "toy-transformer", "gpt2-tiny")}
    assert limits["vgg-tiny"] == {"conv1": 1, "conv2": 1, "fc1": 8, "fc2": 8, "fc3": 8}
    assert set(limits["toy-transformer"].values()) == {1}
    assert limits["gpt2-tiny"] == {"embeddings": 8, "block_0": 2, "block_1": 2, "head": 8}  # 2 heads


def test_workbench_run_refuses_it_with_exit_2_and_one_line(tmp_path, capsys):
    config = tmp_path / "bert_tp.toml"
    config.write_text('model = "bert-tiny"\nplan = "tp1d-2-dp1"\n[training]\nglobal_batch = 8\nsteps = 1\n')
    assert main(["run", str(config), "--run-root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a GPT-2 model" in err[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# Every check of a plan against its model, through `workbench run`: exit 2, one line naming the field, no run
# directory and no process started (a zoo model is checked here; a factory in a child process, as the ranks
# would import it).
_REFUSED = {
    "split points of a zoo model": ('plan = "pp2-1f1b-m2"\n[model]\nname = "resnet18"\nsplit_points = ["layer2"]',
                                    "model.split_points"),
    "split points not in the factory's model": (
        'plan = "pp2-1f1b-m2"\n[model]\nname = "torchvision.models:resnet18"\nsplit_points = ["layer9"]',
        "are not submodules of ResNet"),
    "a partition past the last layer": (
        'model = "mlp"\n[plan]\nmesh = { pp = 2 }\nmicrobatches = 2\npartition = "0-1|2-40"\n'
        '[plan.pipeline]\nkind = "1f1b"', "plan field 'partition'"),
    "more stages than layers": ('model = "mlp"\nplan = "pp8-1f1b-m8"', "stages"),
    "a tensor-parallel degree the heads do not divide": (
        'plan = "tp1d-2-dp1"\n[model]\nname = "gpt2-tiny"\noverrides = { n_head = 3, n_embd = 96 }', "head"),
    "a per-layer degree the heads do not divide": (
        'model = "gpt2-tiny"\nplan = "tp1d-4-dp1-L[0=ddp;1-2=ddp.tp1d4;3=ddp]"',
        "plan field 'layers[1]' = 'ddp.tp1d4' does not fit layer 1 'block_0'"),
    "a layer the tensor-parallel rules do not split": (
        'model = "toy-transformer"\nplan = "tp1d-2-dp1-L[0=ddp;1=ddp.tp1d2;2-5=ddp]"', "this layer is a ToyBlock"),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_every_plan_check_against_the_model_refuses_before_any_process(case, tmp_path, capsys):
    text, needle = _REFUSED[case]
    config = tmp_path / "run.toml"
    config.write_text(f'name = "refused"\n{text}\n[training]\nglobal_batch = 8\nsteps = 1\n')
    assert main(["run", str(config), "--run-root", str(tmp_path / "runs")]) == 2, case
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
