"""Activations between layer layouts, through the logical stage batch.

Every rank of the stage holds the whole stage micro-batch where it enters
the stage (and where it leaves it for the next stage); a layer's
data-parallel group ``d`` takes rows ``[d N / D, (d + 1) N / D)``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .meshes import Layout

__all__ = ["Relayout"]


class _RelayoutFn(torch.autograd.Function):
    """Rows of ``src``'s group -> rows of ``dst``'s group, through the whole stage batch.

    Forward: all-gather every rank's rows over the stage (skipped when the
    source is full), keep the destination's rows. Backward: the destination
    gradient of each distinct row block is contributed once (by the first
    rank of its tensor-parallel group, copies being equal), summed over the
    stage, and the source's rows are returned.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, src: Layout, dst: Layout, stage_rank: int, group: Any) -> torch.Tensor:
        ctx.src, ctx.dst, ctx.stage_rank, ctx.group = src, dst, stage_rank, group
        if src.full:
            full = x
        else:
            parts = [torch.empty_like(x) for _ in range(src.size)]
            dist.all_gather(parts, x.contiguous(), group=group)
            full = torch.cat([parts[row[0]] for row in src.rank_grid()])  # [N, ...] in data-group order
        ctx.rows = full.shape[0]
        if dst.full:
            return full
        block = ctx.rows // dst.dp
        return full.narrow(0, dst.coords(stage_rank)[0] * block, block).clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        src, dst = ctx.src, ctx.dst
        if dst.full:
            full = grad  # every rank holds the same gradient of the whole batch
        else:
            group_index, tp_index = dst.coords(ctx.stage_rank)
            block = ctx.rows // dst.dp
            full = grad.new_zeros((ctx.rows, *grad.shape[1:]))
            if tp_index == 0:
                full.narrow(0, group_index * block, block).copy_(grad)
            dist.all_reduce(full, group=ctx.group)
        if src.full:
            return full, None, None, None, None
        block = ctx.rows // src.dp
        return full.narrow(0, src.coords(ctx.stage_rank)[0] * block, block).contiguous(), None, None, None, None


class Relayout(nn.Module):
    """Moves a stage activation from one layer layout to the next (identity when they agree)."""

    def __init__(self, src: Layout, dst: Layout, stage_rank: int, group: Any) -> None:
        super().__init__()
        self.src, self.dst, self.stage_rank, self.group = src, dst, stage_rank, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.src == self.dst:
            return x
        return _RelayoutFn.apply(x, self.src, self.dst, self.stage_rank, self.group)
