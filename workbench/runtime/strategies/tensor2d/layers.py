"""Transformer building blocks on the q x q grid.

Problem: every tensor of a transformer has to be split so that no rank holds a
full activation or a full weight, while the result stays exactly the dense
layer's. Activations X[b, s, h] live as blocks X[b_i, :, h_j] ([b/q, s, h/q]
on rank (i, j)): the batch split along grid rows, the hidden size along grid
columns.

Approach, layer by layer (``row`` = the q ranks of grid row i, ``col`` = the
q ranks of grid column j):

- :class:`Linear2D` weight block W[k_i, n_j] ([k/q, n/q]), SUMMA product; the
  bias of column j is stored as n/q² slices and all-gathered along ``col``.
- :class:`LayerNorm2D` statistics over the split hidden size: two all-reduces
  along ``row`` (sum, then centred sum of squares); gamma / beta like a bias.
- :class:`Attention2D` a Linear2D(h -> 3h) whose output columns are laid out
  per grid column (column j holds q | k | v of its h/q hidden units, i.e. of
  heads j*H/q .. (j+1)*H/q - 1), so attention runs locally with no
  communication, then a Linear2D(h -> h).
- :class:`MLP2D` Linear2D -> activation -> Linear2D.
- :class:`Embedding2D` table [V, h/q²] all-gathered along ``col`` to [V, h/q].
- :class:`Head2D` logits of a classifier or a (tied) LM head: local partial
  products X_ij W_jᵀ summed along ``row``; the logits of batch slice i are then
  replicated within row i. :func:`cross_entropy_2d` averages over the batch
  slices with an all-reduce along ``col``.

A vector (bias, gamma, table column) whose length is not divisible by q² is
kept as the whole column slice, replicated along ``col``, with its gradient
summed along ``col`` instead.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .comm import Grid2D, all_reduce
from .ops import all_reduce_backward_only, all_reduce_forward_only, all_reduce_sum, gather_param, linear_2d

__all__ = [
    "splits_over_column", "ColumnVector", "Linear2D", "LayerNorm2D", "Attention2D", "MLP2D",
    "Embedding2D", "Head2D", "cross_entropy_2d", "causal_lm_loss_2d",
]


def splits_over_column(length: int, q: int) -> bool:
    """Whether a length-``length`` vector is stored as n/q² slices (else as the replicated n/q column slice)."""
    return length % (q * q) == 0


class ColumnVector(nn.Module):
    """A parameter whose dim ``dim`` is grid column j's hidden slice (n/q): each rank of the column stores
    1/q of that slice (n/q²) when q² divides n, else the whole slice; ``forward()`` returns the n/q slice."""

    def __init__(self, grid: Grid2D, shape: tuple[int, ...], dim: int, init: float | None = None) -> None:
        super().__init__()
        self.grid, self.dim = grid, dim
        full = shape[dim]
        if full % grid.q:
            raise ValueError(f"vector length {full} is not divisible by q={grid.q}")
        self.split = splits_over_column(full, grid.q)
        local = list(shape)
        local[dim] = full // (grid.q * grid.q) if self.split else full // grid.q
        self.shard = nn.Parameter(torch.full(local, init) if init is not None else torch.zeros(local))

    def forward(self) -> torch.Tensor:
        """The column slice: shape[dim] // q along ``dim``."""
        if self.split:
            return gather_param(self.grid.col, self.shard, self.dim)
        return all_reduce_backward_only(self.grid.col, self.shard)


class Linear2D(nn.Module):
    """y = x W + b with x: [b/q, s, k/q] -> y: [b/q, s, n/q]; weight block [k/q, n/q]."""

    def __init__(self, grid: Grid2D, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if value % grid.q:
                raise ValueError(f"Linear2D {name}={value} is not divisible by q={grid.q}")
        self.grid = grid
        self.weight = nn.Parameter(torch.zeros(in_features // grid.q, out_features // grid.q))
        self.bias = ColumnVector(grid, (out_features,), 0) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear_2d(self.grid, x, self.weight)  # [..., n/q]
        return y + self.bias() if self.bias is not None else y


class LayerNorm2D(nn.Module):
    """LayerNorm over a hidden size split along grid row i: x [.., h/q] -> [.., h/q]."""

    def __init__(self, grid: Grid2D, hidden: int, eps: float) -> None:
        super().__init__()
        self.grid, self.hidden, self.eps = grid, hidden, eps
        self.weight = ColumnVector(grid, (hidden,), 0, init=1.0)
        self.bias = ColumnVector(grid, (hidden,), 0, init=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = all_reduce_sum(self.grid.row, x.sum(-1, keepdim=True)) / self.hidden  # [.., 1]
        centred = x - mean
        var = all_reduce_sum(self.grid.row, (centred * centred).sum(-1, keepdim=True)) / self.hidden  # [.., 1]
        return centred * torch.rsqrt(var + self.eps) * self.weight() + self.bias()


class Attention2D(nn.Module):
    """Multi-head self-attention with heads split across grid columns: [b/q, s, h/q] -> [b/q, s, h/q]."""

    def __init__(self, grid: Grid2D, hidden: int, num_heads: int, *, causal: bool, scale: float | None = None) -> None:
        super().__init__()
        if num_heads % grid.q:
            raise ValueError(f"num_heads={num_heads} is not divisible by q={grid.q}")
        self.grid, self.causal = grid, causal
        self.local_heads = num_heads // grid.q
        self.head_dim = hidden // num_heads
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.qkv = Linear2D(grid, hidden, 3 * hidden)
        self.proj = Linear2D(grid, hidden, hidden)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x [b/q, s, h/q]: this column's heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, seq, self.local_heads, self.head_dim).transpose(1, 2)  # [b/q, H/q, s, d]

        scores = heads(q) @ heads(k).transpose(-1, -2) * self.scale  # [b/q, H/q, s, s]
        if self.causal:
            future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
        if additive_mask is not None:
            scores = scores + additive_mask  # [b/q, 1, 1, s]
        context = scores.softmax(-1) @ heads(v)  # [b/q, H/q, s, d]
        context = context.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim)  # [b/q, s, h/q]
        return self.proj(context)


class MLP2D(nn.Module):
    """Linear2D(h -> f), activation, Linear2D(f -> h)."""

    def __init__(self, grid: Grid2D, hidden: int, inner: int, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fc = Linear2D(grid, hidden, inner)
        self.proj = Linear2D(grid, inner, hidden)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.activation(self.fc(x)))  # [b/q, s, h/q] -> [b/q, s, f/q] -> [b/q, s, h/q]


class Embedding2D(nn.Module):
    """Lookup table [V, h] as [V, h/q²] slices: ids [b/q, s] -> [b/q, s, h/q]."""

    def __init__(self, grid: Grid2D, num_embeddings: int, hidden: int, padding_idx: int | None = None) -> None:
        super().__init__()
        self.table = ColumnVector(grid, (num_embeddings, hidden), 1)
        self.padding_idx = padding_idx

    def column_table(self) -> torch.Tensor:
        """[V, h/q]: the table's hidden slice of this grid column."""
        return self.table()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.column_table(), padding_idx=self.padding_idx)


class Head2D(nn.Module):
    """Logits x Wᵀ (+ b) for a classifier or LM head: [.., h/q] -> [.., C], replicated within grid row i.

    ``tied_to``: share an :class:`Embedding2D`'s table (GPT-2's LM head) instead of owning a weight.
    """

    def __init__(self, grid: Grid2D, hidden: int, num_classes: int, *, bias: bool, tied_to: Embedding2D | None = None) -> None:
        super().__init__()
        self.grid = grid
        self.tied_to = [tied_to] if tied_to is not None else []  # a list keeps the shared module out of this one's parameters
        self.weight = None if tied_to is not None else ColumnVector(grid, (num_classes, hidden), 1)
        self.bias = nn.Parameter(torch.zeros(num_classes)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        table = self.tied_to[0].column_table() if self.tied_to else self.weight()  # [C, h/q]
        logits = all_reduce_forward_only(self.grid.row, x @ table.t())  # [.., C]
        if self.bias is not None:
            logits = logits + all_reduce_backward_only(self.grid.col, self.bias)
        return logits


def cross_entropy_2d(grid: Grid2D, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy over the whole grid batch.

    logits: [N_i, C] for batch slice i (replicated in row i); labels: [N_i]. Every rank returns the
    same global value; its gradient reaches only the local slice (the other slices' ranks do theirs).
    """
    local_sum = F.cross_entropy(logits.float(), labels, ignore_index=ignore_index, reduction="sum")
    count = (labels != ignore_index).sum().to(torch.float32)
    all_reduce(grid.col, count)
    return all_reduce_forward_only(grid.col, local_sum / count.clamp_min(1.0))


def causal_lm_loss_2d(grid: Grid2D, logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token loss: logits [b/q, s, V] predict input_ids [b/q, s] shifted by one."""
    vocab = logits.shape[-1]
    return cross_entropy_2d(grid, logits[:, :-1].reshape(-1, vocab), input_ids[:, 1:].reshape(-1))
