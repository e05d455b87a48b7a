"""Recomputation: ``torch.utils.checkpoint`` (non-reentrant) around exactly the marked layers."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["Recomputed"]


class _Keep(torch.autograd.Function):
    """Identity that saves its input for backward, so that the input a recomputed layer keeps (which the
    checkpoint holds outside autograd's saved tensors) is seen, and released, like any saved tensor."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


class Recomputed(nn.Module):
    """A layer that keeps only its input for backward and re-runs its forward there (torch.utils.checkpoint).

    The replay reads the kept input, so a layer that modifies its input in
    place (starts with ``ReLU(inplace=True)`` or ``x += b``) runs on a copy made
    inside the checkpointed region (freed with the layer's other
    intermediates). Whether it does is read from the copy's version counter
    at the first call; layers that do not are never copied.
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.modifies_input: bool | None = None

    def _call(self, x: torch.Tensor) -> torch.Tensor:
        if self.modifies_input is False:
            return self.layer(x)
        copy = x.clone()
        version = copy._version
        out = self.layer(copy)
        if self.modifies_input is None:
            self.modifies_input = copy._version != version
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            x = _Keep.apply(x)
        return checkpoint(self._call, x, use_reentrant=False)
