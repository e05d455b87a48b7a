"""A sweep: several runs trained one after another in the same torchrun processes, each exactly as alone."""

from __future__ import annotations

import pytest
import torch

from runtime_launch import dumped_params, make_config, step_losses, torchrun
from workbench.runtime.events import read_events
from workbench.runtime.reference import reference_train

pytestmark = pytest.mark.multiproc

def _errors(folder, ranks=(0, 1)) -> list[str]:
    """Every rank's error messages (torchrun stops the other ranks when one fails, so not every rank writes)."""
    return [e["message"] for r in ranks if (folder / "events" / f"rank{r}.jsonl").exists()
            for e in read_events(folder, r) if e["kind"] == "error"]


PLANS = {"pp2-1f1b-m4": {}, "dp2": {"model": "vgg-tiny", "training": {"global_batch": 8}},
         "pp2-zbh1-m4": {"training": {"seed": 5}},
         "tp1d-2-dp1": {"model": "gpt2-tiny", "training": {"global_batch": 4}, "run": {"dump_params": False}}}


def test_each_run_of_a_sweep_equals_its_reference_and_keeps_its_own_directory(tmp_path):
    dirs = [tmp_path / name for name in PLANS]
    configs = [make_config(d, plan=name, **fields) for d, (name, fields) in zip(dirs, PLANS.items())]
    proc = torchrun(dirs, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for folder, config in zip(dirs, configs):
        events = read_events(folder, 0)
        assert [e["kind"] for e in events if e["kind"] in ("start", "end")] == ["start", "end"]
        assert next(e for e in events if e["kind"] == "start")["strategy"] == config.plan.name
        assert [e["step"] for e in events if e["kind"] == "step"] == list(range(1, config.training.steps + 1))
        if config.plan.tp_kind != "none":
            continue  # the tensor-parallel shards have their own equality tests; here: it ran after the others
        reference = reference_train(config)
        torch.testing.assert_close(step_losses(folder), reference.losses, rtol=1e-6, atol=1e-6)
        ranks = [0] if config.plan.pp == 1 else [0, 1]
        params = dumped_params(folder, ranks)
        for name, value in reference.params.items():
            torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"{folder.name}: {name}")


def test_a_failed_run_stops_the_sweep_and_the_runs_after_it_say_why(tmp_path):
    failing, after = tmp_path / "failing", tmp_path / "after"
    make_config(failing, plan="pp2-1f1b-m4", faults={"step": 2, "rank": 1})
    make_config(after, plan="dp2")
    proc = torchrun([failing, after], 2)
    assert proc.returncode != 0
    assert any("fault injected" in message for message in _errors(failing))
    skipped = _errors(after)
    assert skipped and all("not run: the run before it in the same processes" in m for m in skipped)
    assert not (after / "events" / "rank0.jsonl").exists() or not [
        e for e in read_events(after, 0) if e["kind"] == "step"]


def test_runs_that_need_other_processes_cannot_share_a_sweep(tmp_path):
    two, four = tmp_path / "two", tmp_path / "four"
    make_config(two, plan="pp2-1f1b-m4")
    make_config(four, plan="pp4-1f1b-m4")
    proc = torchrun([two, four], 2)
    assert proc.returncode != 0
    errors = _errors(two)
    assert errors and all("must agree on world_size" in m and "launch them apart" in m for m in errors)
