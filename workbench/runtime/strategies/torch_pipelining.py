"""Baseline: ``torch.distributed.pipelining`` on the same partition and schedule.

The peer our interpreter is measured against: torch's own ``PipelineStage``
over the same stage modules (cut from the same model by the same partition)
and its ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleavedZeroBubble``,
``ScheduleZBVZeroBubble`` or ``ScheduleDualPipeV`` (``[plan.pipeline]
schedule``) over the same micro-batches. The two-stage-per-rank schedules
put the stages where the workbench's kinds of the same name put them (a V:
stages ``r`` and ``2p - 1 - r`` on rank ``r``; looped: ``r`` and ``r + p``). Two documented traps are avoided on purpose: every rank
gets ``loss_fn`` (without it earlier stages silently skip backward), and
the example input for shape inference is a real tensor with grad enabled.
The baseline runs at its best setting: torch's default divides every
gradient by the micro-batch count after the schedule (``scale_grads``), a
pass over all of them; here its ``loss_fn`` scales each micro-batch's loss
by 1 / micro-batches instead (``scale_grads=False``), as our stages do, so
the gradients are the same without that pass. Gradient accumulation over
several rounds is refused (the schedule steps once per batch).

torch's schedule does not expose per-action timings, so this strategy
records no stage events.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                                          ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)

from ..batches import split_rounds
from .base import RunContext, Strategy, global_mean_loss, make_optimizer

__all__ = ["TorchPipelining"]

_SINGLE = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
_MULTI = {"interleaved-zb": ScheduleInterleavedZeroBubble, "zbv": ScheduleZBVZeroBubble,
          "dualpipev": ScheduleDualPipeV}


class TorchPipelining(Strategy):
    """The rank's stages, executed by torch.distributed.pipelining's schedule of the plan's name."""

    def __init__(self, ctx: RunContext) -> None:
        from ...scheduling.registry import schedule_for

        super().__init__(ctx)
        config = ctx.config
        plan = config.plan
        if config.training.grad_accum != 1 or plan.pp < 2:
            raise ValueError(f"torch's pipelining needs grad_accum = 1 and pp >= 2, got grad_accum = "
                             f"{config.training.grad_accum}, pp = {plan.pp}")
        stages = plan.num_virtual_stages
        if ctx.partition.num_stages != stages:
            raise ValueError(f"partition {ctx.partition} has {ctx.partition.num_stages} stages, "
                             f"torch-pipelining needs {stages}")
        self.indices = sorted(schedule_for(plan).stages_of(ctx.rank))
        self.modules_by_stage = {v: ctx.model.stage(*ctx.partition.bounds[v]).to(ctx.device) for v in self.indices}
        self.is_first, self.is_last = 0 in self.indices, stages - 1 in self.indices
        pipeline_stages = [PipelineStage(self.modules_by_stage[v], v, stages, ctx.device) for v in self.indices]
        name = plan.pipeline.schedule
        scale = 1.0 / plan.microbatches
        loss_fn = ctx.model.loss_fn

        def scaled_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return loss_fn(output, target) * scale

        stages_arg = pipeline_stages[0] if name in _SINGLE else pipeline_stages
        self.schedule = {**_SINGLE, **_MULTI}[name](stages_arg, plan.microbatches, loss_fn=scaled_loss,
                                                    scale_grads=False)
        self._optimizer = make_optimizer([p for m in self.modules_by_stage.values() for p in m.parameters()
                                          if p.requires_grad], config)

    def train_step(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        data = split_rounds(batch, self.config, 0)[0]
        device = self.ctx.device
        losses: list[torch.Tensor] = []
        args = (torch.cat(list(data.inputs)).to(device),) if self.is_first else ()
        kwargs = {"target": torch.cat(list(data.targets)).to(device), "losses": losses} if self.is_last else {}
        self.schedule.step(*args, **kwargs)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        local = sum(float(loss.detach()) for loss in losses) * self.config.plan.microbatches  # unscaled
        return global_mean_loss(local, self.config.plan.microbatches, device)

    def modules(self) -> dict[str, nn.Module]:
        return {f"stage{v}": module for v, module in self.modules_by_stage.items()}

    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer
