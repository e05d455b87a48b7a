"""The q x q process grid and the collectives SUMMA needs on it.

Problem: 2D tensor parallelism places rank (i, j) on a q x q grid and talks
along two families of groups: the ranks of grid ROW i (same i, every j) and the
ranks of grid COLUMN j (every i, same j). ``runtime.groups`` creates the
process groups from a ``Topology(dp=D, tp_row=q, tp_col=q)``. Its naming is
per *axis*: the group along axis ``tp_col`` is the set of ranks that differ
only in their ``tp_col`` coordinate, i.e. one grid ROW; the group along axis
``tp_row`` is one grid COLUMN. :class:`Grid2D` resolves that once, so the rest
of the package only says ``grid.row`` and ``grid.col``.

Approach: thin wrappers around ``torch.distributed`` broadcast / reduce /
all-reduce / all-gather / reduce-scatter that (1) are no-ops on a group of
size 1 (the degenerate q = 1 grid), (2) address peers by their index along the
group instead of by global rank, and (3) count the elements each collective
moves for this rank in a :class:`CommCounter`, so the measured communication
volume can be compared with the cost model's formula. The count is the
algorithmic volume per rank: a broadcast counts the elements a non-source rank
receives, a reduce the elements a non-destination rank sends, a ring
all-reduce ``2 (n-1)/n`` of the tensor, a ring all-gather / reduce-scatter
``(n-1)/n`` of the full tensor.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# How a 2D linear moves its blocks: q SUMMA steps of broadcasts / reduces (overlapped), or one all-gather
# of the q blocks before a single GEMM and one reduce-scatter after it (same volume, fewer, larger messages).
LINEAR_ALGORITHMS = ("broadcast", "allgather")

__all__ = ["LINEAR_ALGORITHMS", "CommCounter", "GroupAxis", "Grid2D", "broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter"]


@dataclass
class CommCounter:
    """Elements moved per rank and collective calls issued, by collective kind (a plain tally, reset freely)."""

    elements: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, kind: str, num_elements: float) -> None:
        self.elements[kind] += num_elements
        self.calls[kind] += 1

    def reset(self) -> None:
        self.elements.clear()
        self.calls.clear()

    @property
    def total_elements(self) -> float:
        return float(sum(self.elements.values()))

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def snapshot(self) -> dict[str, Any]:
        return {"elements": dict(self.elements), "calls": dict(self.calls), "total_elements": self.total_elements,
                "total_calls": self.total_calls}


@dataclass
class GroupAxis:
    """One communicator seen from this rank: the group, its global ranks in order, this rank's index."""

    group: Any
    ranks: list[int]
    index: int
    counter: CommCounter

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass
class Grid2D:
    """This rank's place (i, j) on the q x q grid and its ROW / COLUMN communicators.

    ``row`` is grid row ``i`` (peers indexed by column ``j``); ``col`` is grid
    column ``j`` (peers indexed by row ``i``); ``algorithm`` one of
    ``LINEAR_ALGORITHMS``.
    """

    q: int
    i: int
    j: int
    row: GroupAxis
    col: GroupAxis
    counter: CommCounter
    algorithm: str = "broadcast"

    def __post_init__(self) -> None:
        if self.algorithm not in LINEAR_ALGORITHMS:
            raise ValueError(f"Grid2D.algorithm must be one of {LINEAR_ALGORITHMS}, got {self.algorithm!r}")

    @classmethod
    def from_groups(cls, groups: Any, counter: CommCounter | None = None, algorithm: str = "broadcast") -> "Grid2D":
        """Build from ``runtime.groups.ParallelGroups`` of a ``Topology(..., tp_row=q, tp_col=q)``."""
        q_rows, q_cols = groups.size("tp_row"), groups.size("tp_col")
        if q_rows != q_cols:
            raise ValueError(f"a 2D grid must be square; got tp_row={q_rows}, tp_col={q_cols} (use tp_row == tp_col = q)")
        counter = counter or CommCounter()
        i, j = groups.coord("tp_row"), groups.coord("tp_col")
        # Axis "tp_col" varies the column index with the row fixed: that is grid ROW i.
        row_group = groups.group("tp_col") if "tp_col" in groups.topology else None
        col_group = groups.group("tp_row") if "tp_row" in groups.topology else None
        row = GroupAxis(row_group, groups.ranks("tp_col") if "tp_col" in groups.topology else [groups.rank], j, counter)
        col = GroupAxis(col_group, groups.ranks("tp_row") if "tp_row" in groups.topology else [groups.rank], i, counter)
        return cls(q=q_rows, i=i, j=j, row=row, col=col, counter=counter, algorithm=algorithm)

    @classmethod
    def single(cls) -> "Grid2D":
        """The degenerate 1 x 1 grid (no communication at all)."""
        counter = CommCounter()
        rank = dist.get_rank() if dist.is_initialized() else 0
        return cls(q=1, i=0, j=0, row=GroupAxis(None, [rank], 0, counter), col=GroupAxis(None, [rank], 0, counter), counter=counter)


def broadcast(axis: GroupAxis, tensor: torch.Tensor, src_index: int, *, async_op: bool = False) -> Any:
    """Broadcast ``tensor`` from the peer at ``src_index`` along ``axis`` (in place)."""
    if axis.size == 1:
        return None
    axis.counter.add("broadcast", tensor.numel() if axis.index != src_index else 0)
    return dist.broadcast(tensor, src=axis.ranks[src_index], group=axis.group, async_op=async_op)


def reduce(axis: GroupAxis, tensor: torch.Tensor, dst_index: int, *, async_op: bool = False) -> Any:
    """Sum ``tensor`` over ``axis`` into the peer at ``dst_index`` (others' buffers become undefined)."""
    if axis.size == 1:
        return None
    axis.counter.add("reduce", tensor.numel() if axis.index != dst_index else 0)
    return dist.reduce(tensor, dst=axis.ranks[dst_index], group=axis.group, async_op=async_op)


def all_reduce(axis: GroupAxis, tensor: torch.Tensor, *, op: Any = None, async_op: bool = False) -> Any:
    """In-place all-reduce (sum by default) over ``axis``."""
    if axis.size == 1:
        return None
    axis.counter.add("all_reduce", 2 * (axis.size - 1) / axis.size * tensor.numel())
    return dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=axis.group, async_op=async_op)


def all_gather(axis: GroupAxis, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate every peer's ``tensor`` along ``dim``, in peer-index order."""
    if axis.size == 1:
        return tensor
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(axis.size)]
    axis.counter.add("all_gather", (axis.size - 1) * tensor.numel())
    dist.all_gather(parts, tensor, group=axis.group)
    return torch.cat(parts, dim=dim)


def reduce_scatter(axis: GroupAxis, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Sum ``tensor`` over ``axis`` and keep this peer's chunk along ``dim``."""
    if axis.size == 1:
        return tensor
    if tensor.shape[dim] % axis.size:
        raise ValueError(f"reduce_scatter: size {tensor.shape[dim]} of dim {dim} is not divisible by the group size {axis.size}")
    moved = tensor.movedim(dim, 0).contiguous()  # [n * chunk, ...]
    out = torch.empty((moved.shape[0] // axis.size, *moved.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    axis.counter.add("reduce_scatter", (axis.size - 1) / axis.size * tensor.numel())
    dist.reduce_scatter_tensor(out, moved, group=axis.group)
    return out.movedim(0, dim)
