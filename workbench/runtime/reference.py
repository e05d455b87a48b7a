"""Single-process reference training: the dense model on the same micro-batches.

Every distributed strategy must compute what one process computes on the
whole global batch. This module is that one process: the same model (same
seed), the same global batches, cut into the same micro-batches and
accumulation rounds in the same order, and the same optimizer. Tests compare
a run's losses and final parameters with it; benchmarks use it as the dense
baseline.

``delay=1`` applies GroPipe's one-step-stale rule by hand: the step after
iteration ``t`` applies iteration ``t - 1``'s gradient (none after the first
iteration), i.e. ``w_{t+1} = w_t - lr * g_{t-1}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.config import RunConfig
from .batches import global_batches, run_model, split_rounds
from .strategies.base import make_optimizer

__all__ = ["ReferenceResult", "reference_train"]


@dataclass
class ReferenceResult:
    losses: list[float]  # mean micro-batch loss per step
    params: dict[str, torch.Tensor]  # final parameters by dense-model name
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # final buffers (BatchNorm statistics, ...)


def reference_train(config: RunConfig, *, steps: int | None = None, delay: int | None = None) -> ReferenceResult:
    """Train ``steps`` steps (default ``config.training.steps``) in this process, fp32 on CPU."""
    steps = config.training.steps if steps is None else steps
    delay = (config.plan.pipeline.delay if config.plan.delayed_update else 0) if delay is None else delay
    model = run_model(config)
    torch.manual_seed(config.training.seed + 1)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, config)
    batches = global_batches(config, model, 0)
    total_mb = config.plan.dp * config.plan.microbatches * config.training.grad_accum
    previous: list[torch.Tensor] | None = None
    losses = []
    for _ in range(steps):
        batch = next(batches)
        loss_sum = 0.0
        for r in range(config.training.grad_accum):
            for g in range(config.plan.dp):
                data = split_rounds(batch, config, g)[r]
                for x, y in zip(data.inputs, data.targets):
                    loss = model.loss_fn(model(x), y)
                    (loss / total_mb).backward()
                    loss_sum += float(loss.detach())
        losses.append(loss_sum / total_mb)
        if delay == 0:
            optimizer.step()
        else:
            current = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
            if previous is not None:
                for p, grad in zip(params, previous):
                    p.grad = grad
                optimizer.step()
            previous = current
        optimizer.zero_grad(set_to_none=True)
    return ReferenceResult(losses, {n: p.detach().clone() for n, p in model.named_parameters()},
                           {n: b.detach().clone() for n, b in model.named_buffers()})
