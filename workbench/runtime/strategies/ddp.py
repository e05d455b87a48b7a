"""Baseline: torch DistributedDataParallel over whole-model replicas.

Every rank holds the full model and one 1/G slice of the global batch, split
into the same micro-batches the pipelines use; gradients accumulate locally
(``no_sync``) and DDP's bucketed all-reduce runs during the last
micro-batch's backward. This is the peer GroPipe is measured against, so it
is torch's own implementation, used as documented.

DDP runs at its best setting: gradients are views of its all-reduce buckets
(``gradient_as_bucket_view``), so no copy goes in or out of a bucket. One rank
alone has nothing to synchronise and trains the plain model (DDP would still
copy every gradient through its buckets and run a one-rank all-reduce).

Forwards and backwards are recorded as measured events on stage 0, so a DDP
run draws on the same timeline as a pipeline.

With the plan's ``recompute`` the replica keeps only its input per micro-batch: the
forward runs under a non-reentrant activation checkpoint of the whole model
(torch.utils.checkpoint, RNG state preserved), and the backward replays it
before back-propagating, as a pipeline stage does with its block.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from ..batches import split_rounds
from ..stage import autocast_context
from .base import RunContext, Strategy, global_mean_loss, make_optimizer

__all__ = ["DataParallel"]


class _Recomputed(nn.Module):
    """The model under one activation checkpoint: only the input is kept for backward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.model, x, use_reentrant=False)


class DataParallel(Strategy):
    """torch DDP with gradient accumulation over micro-batches."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.model = ctx.model.to(ctx.device)
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        replica = _Recomputed(self.model) if ctx.config.plan.recompute else self.model
        self.ddp = (DistributedDataParallel(replica, device_ids=ids, gradient_as_bucket_view=True)
                    if ctx.world_size > 1 else replica)
        self._optimizer = make_optimizer([p for p in self.model.parameters() if p.requires_grad], ctx.config)

    def _timed(self, op: str, iteration: int, microbatch: int | None, fn) -> object:
        start = time.perf_counter()
        out = fn()
        if self.ctx.record_events and self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        self.record_since(op, start, iteration, microbatch)
        return out

    @property
    def data_group(self) -> int:
        return self.ctx.rank

    def train_step(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        config, device = self.config, self.ctx.device
        rounds = split_rounds(batch, config, self.ctx.rank)
        scale = 1.0 / (config.plan.microbatches * config.training.grad_accum)
        local = 0.0
        for r, data in enumerate(rounds):
            iteration = step * config.training.grad_accum + r
            for m, (x, y) in enumerate(zip(data.inputs, data.targets)):
                last = r == len(rounds) - 1 and m == len(data.inputs) - 1
                sync = self.ddp.no_sync() if not last and isinstance(self.ddp, DistributedDataParallel) else \
                    contextlib.nullcontext()
                with sync:
                    def forward() -> torch.Tensor:
                        with autocast_context(device, self.ctx.autocast_dtype):
                            return self.model.loss_fn(self.ddp(x.to(device)), y.to(device)).float()
                    loss = self._timed("F", iteration, m, forward)
                    local += float(loss.detach())
                    self._timed("B", iteration, m, lambda: (loss * scale).backward())
        self._timed("STEP", step * config.training.grad_accum + len(rounds) - 1, None, self._step)
        return global_mean_loss(local, config.plan.dp * config.plan.microbatches * config.training.grad_accum, device)

    def _step(self) -> None:
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer
