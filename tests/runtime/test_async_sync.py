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

from runtime_launch import dumped_params, run_ok, step_losses
from workbench.runtime.checkpoint import checkpoint_dir
from workbench.runtime.events import load_measured_timeline
from workbench.runtime.reference import reference_train

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def test_one_in_flight_equals_synchronous_after_every_step(tmp_path):
    config = run_ok(tmp_path, 4, plan="async-1x4-m4-if1", steps=3, checkpoint_every=1,
                    optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9})
    reference = reference_train(config)
    torch.testing.assert_close(step_losses(tmp_path), reference.losses, rtol=1e-6, atol=1e-6)
    for step in range(1, config.steps + 1):
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


def stashing_reference(config) -> dict[str, torch.Tensor]:
    """One process applying the async rule by hand: each micro-batch runs every stage on its planned version.

    Stage ``s``'s step of iteration ``t`` applies the gradients of iteration
    ``t``'s micro-batches, each taken through stage ``k`` at the version the
    schedule names for it; the versions are the stage's weights after each
    step, kept here as a history.
    """
    from torch.func import functional_call

    from workbench.core.partition import Partition
    from workbench.models import build_model
    from workbench.runtime.batches import global_batches, split_rounds
    from workbench.runtime.strategies.base import make_optimizer
    from workbench.scheduling.generators import async_1f1b

    S, m = config.plan.pp, config.plan.microbatches
    model = build_model(config.model, seed=config.seed, **config.model_overrides)
    torch.manual_seed(config.seed + 1)
    partition = Partition.uniform(len(model), S)
    blocks = [model.stage(*partition.bounds[s]) for s in range(S)]
    optimizers = [make_optimizer(list(b.parameters()), config) for b in blocks]
    history = [[{n: p.detach().clone() for n, p in b.named_parameters()}] for b in blocks]
    spec = config.plan.pipeline
    plan = async_1f1b(S, m, config.steps, mode=spec.mode, vertical_sync=spec.vertical_sync)
    version = {(s, a.iteration, a.microbatch): a.version for s in range(S) for a in plan.actions(s) if a.op.value == "F"}
    batches = global_batches(config, model, 0)
    for t in range(config.steps):
        data = split_rounds(next(batches), config, 0)[0]
        for mb, (x, y) in enumerate(zip(data.inputs, data.targets)):
            h, leaves = x, []
            for s, block in enumerate(blocks):
                leaves.append({n: w.clone().requires_grad_(True) for n, w in history[s][version[(s, t, mb)]].items()})
                h = functional_call(block, leaves[-1], (h,))
            (model.loss_fn(h, y) / m).backward()
            for block, bound in zip(blocks, leaves):
                for n, p in block.named_parameters():
                    p.grad = bound[n].grad.clone() if p.grad is None else p.grad + bound[n].grad
        for s, (block, optimizer) in enumerate(zip(blocks, optimizers)):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            history[s].append({n: p.detach().clone() for n, p in block.named_parameters()})
    return {n: p.detach() for b in blocks for n, p in b.named_parameters()}


@pytest.mark.parametrize("plan", ["async-1x4-m4-if4", "async-1x4-m4-2bw-if4"], ids=["stash", "2bw"])
def test_async_equals_the_weight_stashing_rule_applied_by_hand(tmp_path, plan):
    config = run_ok(tmp_path, 4, plan=plan, steps=4, optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9})
    expected = stashing_reference(config)
    params = dumped_params(tmp_path, [0, 1, 2, 3])
    assert sorted(params) == sorted(expected)
    for name, value in expected.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")
    synchronous = reference_train(config).params  # and it is not the synchronous result: staleness is real
    assert any((params[n] - synchronous[n]).abs().max() > 1e-4 for n in synchronous)
