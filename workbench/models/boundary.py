"""The tensor a pipeline stage receives at a cut of the layer sequence, as autograd sees it.

Problem: a stage's input arrives from the previous stage (or from the
profiler's previous layer) detached from any graph, and the stage needs the
gradient of its loss with respect to it. The obvious boundary,
``received.detach().requires_grad_(True)``, is a *leaf* that requires grad,
and autograd forbids in-place operations on such leaves: a block that starts
with ``ReLU(inplace=True)`` (a flattened torchvision model), an in-place
dropout or ``x += bias`` fails with "a leaf Variable that requires grad is
being used in an in-place operation". In the dense model the same op is fine,
because there its input is the non-leaf output of the layer before.

Approach, without copying the activation: :func:`stage_input` passes the
received buffer (which does not require grad) through a tiny autograd
Function, :class:`_Received`, together with a scalar *anchor* leaf that
requires grad. The Function returns a ``detach()`` alias of the buffer: same
storage and same version counter, not an autograd view, so no data is
copied, but the result is a *non-leaf* with a ``grad_fn``; in-place ops on it
rebase its history exactly as they would on an intermediate of the dense
model. The Function's backward receives the gradient of the loss with respect
to the stage input (the value the block read, before any in-place change),
stores it on an :class:`InputGrad` box and returns nothing to the anchor.

Why not the alternatives: ``received.clone()`` (then ``requires_grad_``) costs
one activation copy per micro-batch on every stage; ``ctx.mark_dirty`` on the
buffer also avoids the copy but bumps the buffer's version counter, and when
two stages share a rank (a local hand-over of ``out.detach()``, which shares
its version counter with ``out``) that spuriously invalidates the previous
stage's graph if it saved its own output (tanh, softmax, ReLU). The alias
bumps nothing; an in-place op of the block bumps the shared counter exactly as
the dense model would.

What this does not do: keep the buffer's values. An in-place first op
overwrites the received data, as it overwrites its input in the dense model;
callers that must read the input again (a recomputing stage replays its
forward, the profiler times a layer several times) keep a pristine copy
themselves, and only when the block really does modify its input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["InputGrad", "stage_input"]


class InputGrad:
    """Where the backward of a stage input leaves the gradient of the loss with respect to it.

    Holds no reference to the input tensor itself (the tensor's ``grad_fn``
    refers to this box; the other way round would make a reference cycle that
    keeps activations alive until the garbage collector runs).
    """

    __slots__ = ("grad",)

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None


class _Received(torch.autograd.Function):
    """Identity from a buffer that needs no grad to a non-leaf alias that does (see the module docstring)."""

    @staticmethod
    def forward(ctx, buffer: torch.Tensor, anchor: torch.Tensor, box: InputGrad) -> torch.Tensor:  # type: ignore[override]
        ctx.box = box
        return buffer.detach()  # an alias, not a copy and not a view: in-place ops on it are allowed

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        box = ctx.box
        box.grad = grad if box.grad is None else box.grad + grad
        return None, None, None  # the anchor only makes the output require grad; it never gets a gradient


# One scalar leaf for every stage input: it is never written and never receives a gradient.
_ANCHOR = torch.zeros((), requires_grad=True)


def stage_input(received: torch.Tensor) -> tuple[torch.Tensor, InputGrad]:
    """Wrap a received stage input: returns the tensor the block runs on and the box its gradient lands in.

    ``received`` is detached if it is not already; it is not copied. Call this
    once per forward that builds a graph (again for each replay of a
    recomputed forward); ``box.grad`` is set by that graph's backward.
    """
    box = InputGrad()
    return _Received.apply(received.detach(), _ANCHOR, box), box
