"""Baseline: ``torch.distributed.pipelining`` on the same partition and schedule.

The peer our interpreter is measured against: torch's own ``PipelineStage``
over the same stage module (cut from the same model by the same partition)
and its ``ScheduleGPipe`` / ``Schedule1F1B`` (``[plan.pipeline] schedule``) over the
same micro-batches. Two documented traps are avoided on purpose: every rank
gets ``loss_fn`` (without it earlier stages silently skip backward), and
the example input for shape inference is a real tensor with grad enabled.
torch scales the gradients by 1 / micro-batches itself (``scale_grads``),
which matches our loss scaling, so gradient accumulation over several
rounds is refused rather than scaled twice.

torch's schedule does not expose per-action timings, so this strategy
records no stage events.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ..batches import split_rounds
from .base import RunContext, Strategy, global_mean_loss, make_optimizer

__all__ = ["TorchPipelining"]

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class TorchPipelining(Strategy):
    """One stage per rank, executed by torch.distributed.pipelining."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        if config.grad_accum != 1 or config.plan.pp < 2:
            raise ValueError(f"torch's pipelining needs grad_accum = 1 and pp >= 2, got grad_accum = "
                             f"{config.grad_accum}, pp = {config.plan.pp}")
        if ctx.partition.num_stages != config.plan.pp:
            raise ValueError(f"partition {ctx.partition} has {ctx.partition.num_stages} stages, "
                             f"torch-pipelining needs {config.plan.pp}")
        self.module = ctx.model.stage(*ctx.partition.bounds[ctx.rank]).to(ctx.device)
        self.is_first, self.is_last = ctx.rank == 0, ctx.rank == config.plan.pp - 1
        self.stage = PipelineStage(self.module, ctx.rank, config.plan.pp, ctx.device)
        self.schedule = _SCHEDULES[config.plan.pipeline.schedule](self.stage, config.plan.microbatches,
                                                                  loss_fn=ctx.model.loss_fn)
        self._optimizer = make_optimizer([p for p in self.module.parameters() if p.requires_grad], config)

    def train_step(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        data = split_rounds(batch, self.config, 0)[0]
        device = self.ctx.device
        losses: list[torch.Tensor] = []
        if self.is_first:
            self.schedule.step(torch.cat(list(data.inputs)).to(device))
        elif self.is_last:
            self.schedule.step(target=torch.cat(list(data.targets)).to(device), losses=losses)
        else:
            self.schedule.step()
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        local = sum(float(loss.detach()) for loss in losses)
        return global_mean_loss(local, self.config.plan.microbatches, device)

    def modules(self) -> dict[str, nn.Module]:
        return {f"stage{self.ctx.rank}": self.module}

    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer
