"""Tensor-parallel GPT-2 (2D SUMMA grid or 1D Megatron split) as entry-module strategies.

Problem: the 2D and 1D tensor-parallel models live in their own package with
their own loop (``tensor2d.train.run_tensor_parallel``), but a run launched
from a config must go through the one torchrun entry, run directory and
event stream every other strategy uses.

Approach: a :class:`Strategy` per mode. It maps the run config onto a
:class:`TensorParallelConfig` (model sizes from the built ``gpt2-*`` model's
config, the plan's ``dp`` replicas, and its mesh's tensor-parallel ranks:
``tp_row`` x ``tp_col`` = q^2 grid ranks for 2D, ``tp`` for 1D), builds the
process groups for that topology and the sharded module with the
tensor-parallel package's own builder, and computes one step per
:meth:`train_step` on the entry's global batch: this replica's rows of
the token ids, forward and backward through the shards, gradient average
over replicas, optimizer step. Forward, backward, all-reduce and step are
returned as measured stage events on stage 0.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from ..groups import build_groups
from ..uniform_tp import GPT2_SIZES, check_tensor_parallel_model
from .base import RunContext, Strategy, make_optimizer
from .tensor2d.comm import CommCounter, all_reduce
from .tensor2d.train import (TensorParallelConfig, average_gradients, build_parallel_model, data_parallel_axis,
                             local_rows)

__all__ = ["TensorParallel2D", "TensorParallel1D", "tensor_parallel_config"]

def tensor_parallel_config(ctx: RunContext, mode: str) -> TensorParallelConfig:
    """The tensor-parallel config for this run: sizes from the built GPT-2, layout from groups and tp."""
    config = ctx.config
    sizes = getattr(ctx.model, "config", None) or {}
    check_tensor_parallel_model(config, sizes)  # refused before launch too (preflight)
    q = config.plan.q if mode == "2d" else config.plan.tp
    seq_len = int(ctx.example_input.shape[-1])
    training = config.training
    return TensorParallelConfig(mode=mode, q=q, dp=config.plan.dp, batch_size=training.global_batch, seq_len=seq_len,
                                steps=training.steps, lr=training.optimizer.lr, seed=training.seed,
                                device=config.run.device, **{k: int(sizes[k]) for k in GPT2_SIZES})


class _TensorParallel(Strategy):
    """One tensor-parallel GPT-2 training step per call; subclasses name the mode."""

    mode = "2d"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.tp_config = tensor_parallel_config(ctx, self.mode)
        self.groups = build_groups(self.tp_config.topology())
        self.counter = CommCounter()
        self.module, self.loss_fn, self.shard_rules, self.communicator = build_parallel_model(
            self.tp_config, self.groups, self.counter, ctx.device)
        self.dp = data_parallel_axis(self.groups, CommCounter())
        self.params = list(self.module.parameters())
        self._optimizer = make_optimizer(self.params, ctx.config)

    def train_step(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        ids = local_rows(batch[0], self.dp.index, self.dp.size).to(self.ctx.device)  # [B/dp, s]
        self._optimizer.zero_grad(set_to_none=True)
        began = time.perf_counter()
        loss = self.loss_fn(ids)  # mean over this replica's rows, same on every rank of the grid
        self.record_since("F", began, step, microbatch=0)
        mark = time.perf_counter()
        loss.backward()
        self.record_since("B", mark, step, microbatch=0)
        if self.dp.size > 1:
            mark = time.perf_counter()
            average_gradients(self.dp, self.params)
            self.record_since("AR", mark, step, microbatch=0)
        mark = time.perf_counter()
        self._optimizer.step()
        self.record_since("STEP", mark, step, microbatch=0)
        total = loss.detach().float().clone()
        all_reduce(self.dp, total)
        return float(total.item()) / self.dp.size

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.module}

    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer


class TensorParallel2D(_TensorParallel):
    """2D (SUMMA) tensor parallelism on a q x q grid per data-parallel replica (tp = q^2)."""

    mode = "2d"


class TensorParallel1D(_TensorParallel):
    """1D (Megatron) tensor parallelism over tp ranks per data-parallel replica."""

    mode = "1d"
