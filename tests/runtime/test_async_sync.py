"""Strategy ``async`` with one micro-batch in flight per stage is the synchronous pipeline (real torchrun, gloo).

With one micro-batch in flight no forward of iteration ``t + 1`` can start
before iteration ``t``'s step, so every micro-batch runs on the newest
weights and the asynchronous strategy must compute exactly what one process
computes: the parameters saved after every step equal the single-process
reference's after the same number of steps, and so do the losses.
"""

from __future__ import annotations

import pytest
import torch

from runtime_launch import Sweep, dumped_params, stashing_reference, step_losses
from workbench.runtime.checkpoint import checkpoint_dir
from workbench.runtime.events import load_measured_timeline
from workbench.runtime.reference import reference_train

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9}
STASHING = {"stash": "async-1x4-m4-if4", "2bw": "async-1x4-m4-2bw-if4"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The module's three 4-rank runs in one sweep."""
    runs = {"if1": (4, {"plan": "async-1x4-m4-if1",
                        "training": {"steps": 3, "checkpoint_every": 1, "optimizer": SGD}})}
    runs.update({key: (4, {"plan": plan, "training": {"steps": 4, "optimizer": SGD}})
                 for key, plan in STASHING.items()})
    return Sweep(tmp_path_factory.mktemp("async_sync"), runs)


def test_one_in_flight_equals_synchronous_after_every_step(sweep):
    config, tmp_path = sweep.run("if1"), sweep.dir("if1")
    reference = reference_train(config)
    torch.testing.assert_close(step_losses(tmp_path), reference.losses, rtol=1e-6, atol=1e-6)
    for step in range(1, config.training.steps + 1):
        expected = reference_train(config, steps=step).params
        saved: dict[str, torch.Tensor] = {}
        for rank in range(4):
            state = torch.load(checkpoint_dir(tmp_path, step) / f"rank{rank}.pt", weights_only=True)
            saved.update({name: t for module in state["modules"].values() for name, t in module.items()})
        assert sorted(saved) == sorted(expected)
        for name, value in expected.items():
            torch.testing.assert_close(saved[name], value, rtol=0, atol=1e-5, msg=f"step {step} parameter {name}")
    forwards = [e for e in load_measured_timeline(tmp_path).events if e.op == "F"]
    assert all(e.version == e.iteration for e in forwards)  # always the newest weights: one version per iteration


@pytest.mark.parametrize("key", sorted(STASHING))
def test_async_equals_the_weight_stashing_rule_applied_by_hand(sweep, key):
    config, tmp_path = sweep.run(key), sweep.dir(key)
    expected = stashing_reference(config)
    params = dumped_params(tmp_path, [0, 1, 2, 3])
    assert sorted(params) == sorted(expected)
    for name, value in expected.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")
    synchronous = reference_train(config).params  # and it is not the synchronous result: staleness is real
    assert any((params[n] - synchronous[n]).abs().max() > 1e-4 for n in synchronous)
