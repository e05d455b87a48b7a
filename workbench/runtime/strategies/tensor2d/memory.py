"""Per-rank memory: parameter bytes and the activation bytes autograd keeps for backward.

Problem: the point of 2D tensor parallelism is memory per rank (activations
O(1/q²) instead of the 1D form's O(1)), and on CPU there is no allocator
high-water mark to read.

Approach: count what a forward pass actually saves for the backward pass with
``torch.autograd.graph.saved_tensors_hooks``: every saved tensor's storage,
counted once (views such as q / k / v chunks share one storage), parameters
excluded. That is the activation memory a training step must hold at its peak
(before any backward frees it), independent of the allocator.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

__all__ = ["parameter_bytes", "SavedBytes", "measure_saved_bytes"]


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of this rank's parameters (shared parameters once)."""
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in module.parameters()}.values())


class SavedBytes:
    """Running total of distinct storages saved for backward (``.bytes``)."""

    def __init__(self, exclude: nn.Module | None = None) -> None:
        self.bytes = 0
        self._seen: set[int] = set()
        self._excluded = {p.untyped_storage().data_ptr() for p in exclude.parameters()} if exclude is not None else set()

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._seen and key not in self._excluded:
            self._seen.add(key)
            self.bytes += storage.nbytes()
        return tensor


@contextmanager
def measure_saved_bytes(module: nn.Module | None = None) -> Iterator[SavedBytes]:
    """Within the block, tally the activation bytes saved for backward (``module``'s parameters excluded)."""
    tally = SavedBytes(module)
    with torch.autograd.graph.saved_tensors_hooks(tally.pack, lambda tensor: tensor):
        yield tally
