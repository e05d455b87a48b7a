"""GroPipe 2x2 with the one-step-late update, a crash, and a resume, under real torchrun.

Three launches share one uninterrupted reference run:

1. delay = 1 for 5 steps: losses and parameters equal the dense reference
   with ``w_{t+1} = w_t - lr * g_{t-1}`` applied by hand;
2. the same config with a fault injected on rank 1 at step 3 (after the
   step-2 checkpoint): the job fails fast, rank 1's error event carries the
   traceback, and no process of the job is left;
3. a resume of (2) in its run directory from the step-2 checkpoint reaches
   exactly the losses and parameters of (1).
"""

from __future__ import annotations

import time

import pytest
import torch

from runtime_launch import dumped_params, make_config, processes_mentioning, run_ok, step_losses, torchrun
from workbench.core.config import merge_changes
from workbench.runtime.events import read_events
from workbench.runtime.reference import reference_train

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

GROPIPE = {"plan": "gropipe-2x2-1f1b-m4-d1",
           "training": {"checkpoint_every": 2, "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    config = run_ok(run_dir, 4, **GROPIPE)
    return run_dir, config


def test_delay1_equals_stale_update_reference(uninterrupted):
    run_dir, config = uninterrupted
    reference = reference_train(config, delay=1)
    exact = reference_train(config, delay=0)
    torch.testing.assert_close(step_losses(run_dir), reference.losses, rtol=1e-6, atol=1e-6)
    params = dumped_params(run_dir, [0, 1])
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")
    assert any((params[n] - exact.params[n]).abs().max() > 1e-4 for n in params), "delay 1 must differ from delay 0"


def test_fault_then_resume_reaches_uninterrupted_losses(uninterrupted, tmp_path):
    run_dir, _ = uninterrupted
    make_config(tmp_path, **GROPIPE, faults={"step": 3, "rank": 1})
    started = time.monotonic()
    failed = torchrun(tmp_path, 4, timeout=120)
    assert failed.returncode != 0
    assert time.monotonic() - started < 90, "the other ranks did not exit promptly"
    errors = [e for e in read_events(tmp_path, 1) if e["kind"] == "error"]
    assert errors and "fault injected" in errors[0]["message"] and "Traceback" in errors[0]["traceback"]
    assert not processes_mentioning(str(tmp_path)), "a process of the failed job is still running"
    assert (tmp_path / "checkpoints" / "step2" / "COMPLETE").is_file()
    assert not (tmp_path / "checkpoints" / "step4").exists()

    config = make_config(tmp_path, **merge_changes(GROPIPE, {"training": {"resume": True}}))
    resumed = torchrun(tmp_path, 4)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    starts = [e for e in read_events(tmp_path, 0) if e["kind"] == "start"]
    assert starts[-1]["resumed_from"] == 2
    all_losses = step_losses(tmp_path)  # 3 steps before the fault, then steps 3..5 after the resume
    assert len(all_losses) == 3 + config.training.steps - 2
    assert all_losses[3:] == step_losses(run_dir)[2:]
    for name, value in dumped_params(run_dir, [0, 1, 2, 3]).items():
        assert torch.equal(dumped_params(tmp_path, [0, 1, 2, 3])[name], value), name
