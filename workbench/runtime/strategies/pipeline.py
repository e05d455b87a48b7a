"""Scheduled pipelines: GPipe, 1F1B and interleaved 1F1B, executed from data.

The schedule comes from :mod:`workbench.scheduling.generators` (the same
value the simulator times) and is lowered to per-rank action lists with
explicit sends and receives. This rank holds the stages its list mentions
(one, or several virtual stages for interleaved), each cut from the
unmodified model by the partition, and the interpreter executes the list
once per accumulation round. Gradients accumulate over micro-batches (with
``training.fused_weight_grads``, inside the linear layers' own products:
:mod:`~workbench.models.fused_grads`); the ``STEP`` action applies the
optimizer (after the schedule when it has none).

:class:`ScheduledPipeline` is also the base of GroPipe, which only adds the
data-parallel axis and its ``AR``/``STEP`` handlers.
"""

from __future__ import annotations

import torch
from torch import nn

from ...core.ir import Op, Schedule
from ...core.timeline import Event
from ..batches import split_rounds
from ...models.fused_grads import WeightGradBuffers, fuse_weight_grads
from ..groups import ParallelGroups, build_groups
from ..interpreter import Interpreter
from ..stage import Stage, output_shapes
from .base import RunContext, Strategy, global_mean_loss, make_optimizer

__all__ = ["ScheduledPipeline", "build_schedule"]


def build_schedule(config, iteration: int = 0, stage_costs=None) -> Schedule:
    """The compute schedule a config asks for (see ``scheduling.from_config``); ``stage_costs`` for kinds built
    from the stages' measured costs (the start event records them)."""
    from ...scheduling.from_config import schedule_for_config

    return schedule_for_config(config, iteration, stage_costs)


def lowered_schedule(config, iteration: int = 0, stage_costs=None) -> Schedule:
    """The schedule with its sends and receives: what the interpreter executes."""
    from ...scheduling.passes import lower

    return lower(build_schedule(config, iteration, stage_costs))


class ScheduledPipeline(Strategy):
    """Runs this rank's lowered action list; stages and optimizer are local to the rank."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        self.topology = config.plan.mesh
        self.groups: ParallelGroups = build_groups(self.topology)
        self.schedule = lowered_schedule(config, stage_costs=ctx.stage_costs)
        if self.schedule.num_ranks != ctx.world_size:
            raise ValueError(f"schedule {self.schedule.name!r} has {self.schedule.num_ranks} ranks but the job has "
                             f"{ctx.world_size}; launch with --nproc {self.schedule.num_ranks}")
        num_virtual = config.plan.num_virtual_stages
        if ctx.partition.num_stages != num_virtual:
            raise ValueError(f"partition {ctx.partition} has {ctx.partition.num_stages} stages, plan "
                             f"{config.plan.name!r} needs {num_virtual} (stages x chunks)")
        self.actions = self.schedule.actions(ctx.rank)
        blocks = [ctx.model.stage(*ctx.partition.bounds[v]) for v in range(num_virtual)]
        shapes = output_shapes(blocks, ctx.example_input, ctx.device, ctx.autocast_dtype)
        self.stages: dict[int, Stage] = {}
        loss_scale = 1.0 / (config.plan.microbatches * config.training.grad_accum)
        for v in self.schedule.stages_of(ctx.rank):
            self.stages[v] = Stage(
                index=v, module=blocks[v].to(ctx.device), device=ctx.device, is_first=v == 0,
                is_last=v == num_virtual - 1, loss_fn=ctx.model.loss_fn, loss_scale=loss_scale,
                autocast_dtype=ctx.autocast_dtype, recompute=config.plan.recompute)
        self.fused_layers = 0
        if config.training.fused_weight_grads:
            self.weight_grads = WeightGradBuffers()
            self.fused_layers = sum(fuse_weight_grads(s.module, self.weight_grads) for s in self.stages.values())
            for stage in self.stages.values():  # a split backward's I queues the fused products for its W
                stage.weight_grads = self.weight_grads
        self._optimizer = make_optimizer([p for s in self.stages.values() for p in s.parameters()], config)
        # schedules without STEP actions step once the action list is done
        self.step_after_schedule = not any(a.op is Op.STEP for a in self.actions)
        self.interpreter = Interpreter(
            rank=ctx.rank, actions=self.actions, stages=self.stages, num_microbatches=config.plan.microbatches,
            boundary_shapes={v: shapes[v] for v in range(num_virtual)}, device=ctx.device,
            handlers={Op.STEP: self._on_step, Op.ALL_REDUCE: self._on_all_reduce}, record=ctx.record_events)

    # -- handlers the interpreter calls -------------------------------------------------
    def _on_step(self, action) -> None:
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)

    def _on_all_reduce(self, action) -> None:
        raise ValueError(f"plan {self.config.plan.name!r} has one pipeline and no gradient all-reduce; "
                         f"action {action} belongs to a grouped (GroPipe) schedule")

    def actions_for(self, step: int) -> list | None:
        """This rank's actions for ``step`` when they differ per step; ``None`` keeps the current list."""
        return None

    # -- Strategy -----------------------------------------------------------------------
    @property
    def data_group(self) -> int:
        return self.groups.coord("dp")

    def train_step(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        rounds = split_rounds(batch, self.config, self.groups.coord("dp"))
        accumulate_only = frozenset({Op.ALL_REDUCE, Op.STEP})
        actions = self.actions_for(step)
        for r, data in enumerate(rounds):
            last = r == len(rounds) - 1
            self.interpreter.run(step * self.config.training.grad_accum + r, data,
                                 skip=frozenset() if last else accumulate_only, actions=actions)
        if self.step_after_schedule:
            self._on_step(None)
        local = sum(sum(s.take_losses()) for s in self.stages.values())
        total_mb = self.config.plan.dp * self.config.plan.microbatches * self.config.training.grad_accum
        return global_mean_loss(local, total_mb, self.ctx.device)

    def modules(self) -> dict[str, nn.Module]:
        return {f"stage{v}": s.module for v, s in self.stages.items()}

    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def take_events(self) -> tuple[list[Event], float]:
        return self.interpreter.take_events(), self.interpreter.t0_unix
