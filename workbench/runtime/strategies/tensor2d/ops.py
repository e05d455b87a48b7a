"""SUMMA matrix products and the autograd functions built on the 2D grid.

Problem: on a q x q grid rank (i, j) holds activation block X[b_i, k_j] and
weight block W[k_i, n_j]; the product block Y[b_i, n_j] = sum_t X[b_i, k_t]
W[k_t, n_j] needs blocks that live on other ranks, and so do the two gradient
products of the backward pass.

Approach (SUMMA, q steps each):

- ``summa_ab``   Y  = X W    : step t broadcasts X[b_i, k_t] along grid row i
                               (source column t) and W[k_t, n_j] along grid
                               column j (source row t), then accumulates.
- ``summa_abt``  dX = dY W^T : step t broadcasts W[k_t, n_j] along column j,
                               multiplies, and *reduces* the partial along row i
                               into its owner (i, t).
- ``summa_atb``  dW = X^T dY : step t broadcasts X[b_i, k_t] along row i,
                               multiplies, and reduces along column j into (t, j).

Broadcasts are double-buffered: step t+1's asynchronous broadcasts are issued
before step t's GEMM; reduces are asynchronous and awaited once at the end.
The ``allgather`` variants move the same elements in fewer, larger messages
(gather the q blocks, one GEMM, reduce-scatter the product): fewer collective
latencies, at the price of holding q blocks at once.
:class:`Linear2DFunction` wires the three into one autograd function (forward
uses AB, backward ABᵀ and AᵀB). The small collective functions below
(all-gather a parameter slice, all-reduce with either backward) are shared by
the layers here and by the 1D baseline.
"""

from __future__ import annotations

from typing import Any

import torch

from .comm import GroupAxis, Grid2D, all_gather, all_reduce, broadcast, reduce, reduce_scatter

__all__ = [
    "summa_ab", "summa_abt", "summa_atb", "gathered_ab", "gathered_abt", "gathered_atb", "Linear2DFunction", "linear_2d",
    "gather_param", "all_reduce_sum", "all_reduce_forward_only", "all_reduce_backward_only",
]


def _wait(works: list[Any]) -> None:
    for work in works:
        if work is not None:
            work.wait()


def _broadcast_block(axis: GroupAxis, mine: torch.Tensor, src_index: int) -> tuple[torch.Tensor, Any]:
    """Start broadcasting the block of peer ``src_index``; returns (buffer, work)."""
    buffer = mine if axis.index == src_index else torch.empty_like(mine)
    return buffer, broadcast(axis, buffer, src_index, async_op=True)


def summa_ab(grid: Grid2D, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [m, k/q] block (i, j) of X; w: [k/q, n/q] block (i, j) of W -> [m, n/q] block (i, j) of X W."""
    x, w = x.contiguous(), w.contiguous()
    out = x.new_zeros(x.shape[0], w.shape[1])  # [m, n/q]
    pending = (_broadcast_block(grid.row, x, 0), _broadcast_block(grid.col, w, 0))
    for t in range(grid.q):
        (x_t, x_work), (w_t, w_work) = pending
        if t + 1 < grid.q:
            pending = (_broadcast_block(grid.row, x, t + 1), _broadcast_block(grid.col, w, t + 1))
        _wait([x_work, w_work])
        out.addmm_(x_t, w_t)  # [m, k/q] @ [k/q, n/q]
    return out


def summa_abt(grid: Grid2D, dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dy: [m, n/q] block (i, j); w: [k/q, n/q] block (i, j) of W -> [m, k/q] block (i, j) of dY Wᵀ."""
    dy, w = dy.contiguous(), w.contiguous()
    result = None
    reduces: list[Any] = []
    pending = _broadcast_block(grid.col, w, 0)
    for t in range(grid.q):
        w_t, w_work = pending
        if t + 1 < grid.q:
            pending = _broadcast_block(grid.col, w, t + 1)
        _wait([w_work])
        partial = dy @ w_t.t()  # [m, n/q] @ [n/q, k/q]: contribution to block (i, t)
        reduces.append(reduce(grid.row, partial, t, async_op=True))
        if t == grid.j:
            result = partial
    _wait(reduces)
    assert result is not None
    return result


def summa_atb(grid: Grid2D, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """x: [m, k/q] block (i, j) of X; dy: [m, n/q] block (i, j) -> [k/q, n/q] block (i, j) of Xᵀ dY."""
    x, dy = x.contiguous(), dy.contiguous()
    result = None
    reduces: list[Any] = []
    pending = _broadcast_block(grid.row, x, 0)
    for t in range(grid.q):
        x_t, x_work = pending
        if t + 1 < grid.q:
            pending = _broadcast_block(grid.row, x, t + 1)
        _wait([x_work])
        partial = x_t.t() @ dy  # [k/q, m] @ [m, n/q]: contribution to block (t, j)
        reduces.append(reduce(grid.col, partial, t, async_op=True))
        if t == grid.i:
            result = partial
    _wait(reduces)
    assert result is not None
    return result


def gathered_ab(grid: Grid2D, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """As :func:`summa_ab`: X[b_i, :] (row all-gather) @ W[:, n_j] (column all-gather)."""
    return all_gather(grid.row, x, dim=1) @ all_gather(grid.col, w, dim=0)  # [m, k] @ [k, n/q]


def gathered_abt(grid: Grid2D, dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """As :func:`summa_abt`: dY_ij W[:, n_j]ᵀ ([m, k]) reduce-scattered along the row into k/q slices."""
    return reduce_scatter(grid.row, dy @ all_gather(grid.col, w, dim=0).t(), dim=1)


def gathered_atb(grid: Grid2D, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """As :func:`summa_atb`: X[b_i, :]ᵀ dY_ij ([k, n/q]) reduce-scattered along the column into k/q slices."""
    return reduce_scatter(grid.col, all_gather(grid.row, x, dim=1).t() @ dy, dim=0)


_KERNELS = {"broadcast": (summa_ab, summa_abt, summa_atb), "allgather": (gathered_ab, gathered_abt, gathered_atb)}


class Linear2DFunction(torch.autograd.Function):
    """Y = X W on the grid; backward dX = dY Wᵀ (ABᵀ) and dW = Xᵀ dY (AᵀB)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, grid: Grid2D) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])  # [b/q * s, k/q]
        ctx.grid, ctx.lead = grid, lead
        ctx.save_for_backward(x2, w)
        product = _KERNELS[grid.algorithm][0]
        return product(grid, x2, w).reshape(*lead, w.shape[1])  # [b/q, s, n/q]

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x2, w = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()  # [b/q * s, n/q]
        _, abt, atb = _KERNELS[ctx.grid.algorithm]
        dx = abt(ctx.grid, dy2, w).reshape(*ctx.lead, w.shape[0]) if ctx.needs_input_grad[0] else None
        dw = atb(ctx.grid, x2, dy2) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def linear_2d(grid: Grid2D, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [..., k/q], w: [k/q, n/q] -> [..., n/q]."""
    return Linear2DFunction.apply(x, w, grid)


class _GatherParam(torch.autograd.Function):
    """All-gather a parameter slice along ``axis`` (dim 0 of the slice); backward reduce-scatters."""

    @staticmethod
    def forward(ctx: Any, piece: torch.Tensor, axis: GroupAxis, dim: int) -> torch.Tensor:
        ctx.axis, ctx.dim = axis, dim
        return all_gather(axis, piece, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return reduce_scatter(ctx.axis, grad, ctx.dim), None, None


def gather_param(axis: GroupAxis, piece: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """[.., n/q², ..] slices -> [.., n/q, ..]; gradients summed over the axis and scattered back."""
    return _GatherParam.apply(piece, axis, dim)


class _AllReduce(torch.autograd.Function):
    """All-reduce (sum) in forward; in backward all-reduce too, or pass the gradient through."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, axis: GroupAxis, reduce_grad: bool) -> torch.Tensor:
        ctx.axis, ctx.reduce_grad = axis, reduce_grad
        out = x.clone()
        all_reduce(axis, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.reduce_grad:
            grad = grad.clone()
            all_reduce(ctx.axis, grad)
        return grad, None, None


class _CopyReduceGrad(torch.autograd.Function):
    """Identity in forward; all-reduce (sum) of the gradient in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, axis: GroupAxis) -> torch.Tensor:
        ctx.axis = axis
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        all_reduce(ctx.axis, grad)
        return grad, None


def all_reduce_sum(axis: GroupAxis, x: torch.Tensor) -> torch.Tensor:
    """Sum of partial values that every peer then consumes differently (backward sums too)."""
    return _AllReduce.apply(x, axis, True) if axis.size > 1 else x


def all_reduce_forward_only(axis: GroupAxis, x: torch.Tensor) -> torch.Tensor:
    """Sum of partials whose consumer is replicated over the axis (backward: identity)."""
    return _AllReduce.apply(x, axis, False) if axis.size > 1 else x


def all_reduce_backward_only(axis: GroupAxis, x: torch.Tensor) -> torch.Tensor:
    """A replicated value consumed by partitioned work (forward identity, backward sum)."""
    return _CopyReduceGrad.apply(x, axis) if axis.size > 1 else x
