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
