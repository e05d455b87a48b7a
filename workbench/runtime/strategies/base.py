"""What every training strategy offers the entry module, and what it is given.

The entry module builds the unmodified model once per rank and a
:class:`RunContext` around it; a strategy takes its share of the model from
there (a pipeline stage, a whole replica, ...) and trains one global batch
per :meth:`Strategy.train_step`. Checkpointing, event writing and the
training loop stay in the entry module, so a strategy is only about how one
step is computed and what state it must save.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...core.config import RunConfig
from ...core.partition import Partition
from ...core.timeline import Event

__all__ = ["RunContext", "Strategy", "make_optimizer", "global_mean_loss", "PendingLoss", "loss_value"]


@dataclass
class RunContext:
    """One rank's inputs: config, placement, the dense model and a micro-batch-sized example input."""

    config: RunConfig
    rank: int
    world_size: int
    device: torch.device
    autocast_dtype: torch.dtype | None
    model: nn.Module
    partition: Partition
    example_input: torch.Tensor
    record_events: bool = True
    stage_costs: Any = None  # the stages' measured StageCosts, for kinds whose schedule is built from them


def make_optimizer(params: list[nn.Parameter], config: RunConfig) -> torch.optim.Optimizer:
    opt = config.training.optimizer
    if opt.name == "sgd":
        return torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
    return torch.optim.Adam(params, lr=opt.lr, weight_decay=opt.weight_decay)


class PendingLoss:
    """A step's global mean loss whose all-reduce is still in flight; :meth:`value` waits for it.

    Strategies whose schedules run across iterations (the asynchronous
    pipeline) return one from ``train_step``: a blocking loss all-reduce at
    the end of every step would line all ranks up once per iteration, the
    flush their schedule exists to avoid. The entry module reads the value
    after the next step has been computed (by then every rank has issued
    the all-reduce), before a checkpoint and at the end.
    """

    def __init__(self, work: dist.Work | None, total: torch.Tensor, num_microbatches_total: int) -> None:
        self._work, self._total, self._n = work, total, num_microbatches_total

    def value(self) -> float:
        if self._work is not None:
            self._work.wait()
            self._work = None
        return float(self._total.item()) / self._n


def global_mean_loss(local_sum: float, num_microbatches_total: int, device: torch.device, *,
                     group: dist.ProcessGroup | None = None, wait: bool = True) -> float | PendingLoss:
    """Mean micro-batch loss over every rank's contribution (ranks without a loss add 0).

    ``wait=False`` starts the all-reduce and returns a :class:`PendingLoss`;
    give it a ``group`` of its own (every rank), so that it cannot interleave
    with the strategy's sends and receives on the default group.
    """
    total = torch.tensor([local_sum], dtype=torch.float64, device=device)
    if not wait:
        return PendingLoss(dist.all_reduce(total, group=group, async_op=True), total, num_microbatches_total)
    dist.all_reduce(total, group=group)
    return float(total.item()) / num_microbatches_total


def loss_value(loss: float | PendingLoss) -> float:
    """The loss a ``train_step`` returned, waiting for it if it is still being reduced."""
    return loss.value() if isinstance(loss, PendingLoss) else float(loss)


class Strategy(ABC):
    """One way to compute a training step across the ranks of a job."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.t0_perf, self.t0_unix = time.perf_counter(), time.time()
        self._events: list[Event] = []

    @abstractmethod
    def train_step(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> float | PendingLoss:
        """Train on one global batch; return the global mean loss (same on every rank), or a
        :class:`PendingLoss` when waiting for it now would synchronise the ranks."""

    @abstractmethod
    def modules(self) -> dict[str, nn.Module]:
        """This rank's trainable modules by a stable key (saved in checkpoints)."""

    @abstractmethod
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer over this rank's parameters."""

    @property
    def data_group(self) -> int | None:
        """The data-parallel replica whose share of each global batch this rank trains, or None when the
        rank reads whole global batches (datasets are then read only in that share; see ``global_batches``)."""
        return None

    def param_state(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under their dense-model names (for comparison with the reference)."""
        out: dict[str, torch.Tensor] = {}
        for module in self.modules().values():
            for name, p in module.named_parameters():
                out[name] = p.detach().float().cpu().clone()
        return out

    def buffer_state(self) -> dict[str, torch.Tensor]:
        """This rank's buffers (e.g. BatchNorm running statistics) under their dense-model names, as stored."""
        out: dict[str, torch.Tensor] = {}
        for module in self.modules().values():
            for name, b in module.named_buffers():
                out[name] = b.detach().cpu().clone()
        return out

    def extra_state(self) -> dict[str, Any]:
        """Strategy state beyond modules and optimizer (e.g. a delayed gradient)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"plan {self.config.plan.name!r} has no extra state, checkpoint has {sorted(state)}")

    def record_since(self, op: str, start: float, iteration: int, microbatch: int | None = None) -> None:
        """Record a measured event from ``start`` (a perf_counter reading) to now, if events are on."""
        if self.ctx.record_events:
            self._events.append(Event(rank=self.ctx.rank, stage=0, op=op, start=(start - self.t0_perf) * 1e3,
                                      end=(time.perf_counter() - self.t0_perf) * 1e3, microbatch=microbatch,
                                      iteration=iteration, source="measured"))

    def take_events(self) -> tuple[list[Event], float]:
        """Measured events since the last call, and the unix time their ms count from."""
        events, self._events = self._events, []
        return events, self.t0_unix

    def take_records(self) -> list[tuple[str, dict[str, Any]]]:
        """Run events of the strategy's own to write, ``(kind, fields)``, since the last call (none here)."""
        return []

    def close(self) -> None:
        """Wait for outstanding communication before the process group goes away."""
