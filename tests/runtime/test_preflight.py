"""Checks of a plan against its model run in the launching process, before any rank starts."""

import pytest

from workbench.cli import main
from workbench.core.config import RunConfig
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
