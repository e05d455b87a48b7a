"""Timing a layer's backward split into its input gradient (I) and its weight gradient (W).

Problem: zero-bubble pipeline schedules run a layer's backward as two
passes: I, the gradient of the layer's input, which the previous stage is
waiting for, and W, the gradients of its parameters, which only the
optimizer step needs and which can therefore fill a pipeline bubble. A
schedule needs the time of each, and the fused backward's time does not say
how it divides.

Approach: both passes are taken from the same graph, as a stage that splits
its backward runs them. Per run, untimed: a fresh stage input
(:meth:`~workbench.profiling.profiler._LayerRunner.prepare`, which builds it
through :func:`workbench.models.boundary.stage_input` and copies it for a
layer that modifies its input in place), the gradient edge of that input,
and the layer's forward. Then, on the profiler's clock, I is
``torch.autograd.grad(output, [edge], grad_output, retain_graph=True)`` and
W is ``torch.autograd.grad(output, params, grad_output)``. ``autograd.grad``
runs only the nodes on a path to what it is asked for, and each node only
the outputs needed (a linear layer's backward node computes one matrix
product for I and the other for W).

Why a gradient edge and not the input tensor: a layer that starts with an
in-place op (``ReLU(inplace=True)`` as its own layer) rebases the input
tensor's history, so a gradient taken with respect to the tensor after the
forward would skip that op. The edge, taken before the forward, still points
at the stage boundary, so I includes every op of the layer.

What W includes: in a layer of several ops (a transformer block, a residual
block) the parameter gradients of its first ops need the output gradient
carried back through the later ones, so W walks that chain again after I
walked it, and I + W exceeds the fused backward. That is what a stage running
the two passes as two ``autograd.grad`` calls pays; a runtime that keeps the
intermediate gradients of I for W would pay less.

Zero cases, not timed: the first layer has I = 0 (its input is data, with no
gradient to compute); a layer without trainable parameters has W = 0; a
layer whose output needs no gradient has neither.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.autograd.graph import get_gradient_edge

__all__ = ["time_split_run", "SPLIT_FIELDS"]

SPLIT_FIELDS = ("input_grad_ms", "weight_grad_ms")


class _Runner(Protocol):  # what profiler._LayerRunner offers
    layer: torch.nn.Module
    x: torch.Tensor
    needs_grad: bool

    def prepare(self) -> None: ...
    def forward(self) -> torch.Tensor: ...
    def output_grad(self, out: torch.Tensor) -> torch.Tensor | None: ...


class _Clock(Protocol):  # what profiler.DeviceClock offers
    def sync(self) -> None: ...
    def mark(self) -> Any: ...
    def ms(self, start: Any, end: Any) -> float: ...


def time_split_run(runner: _Runner, clock: _Clock) -> tuple[float, float]:
    """One run of the split backward: ``(I ms, W ms)``; forward and setup are not timed (module docstring)."""
    runner.prepare()
    edge = get_gradient_edge(runner.x) if runner.needs_grad else None
    out = runner.forward()
    if not out.requires_grad:
        return 0.0, 0.0
    grad = runner.output_grad(out)
    params = [p for p in runner.layer.parameters() if p.requires_grad]
    clock.sync()
    start = clock.mark()
    if edge is not None:
        torch.autograd.grad(out, [edge], grad, retain_graph=True, allow_unused=True)
    middle = clock.mark()
    if params:  # a parameter this layer does not use (none in the zoo) gets no gradient rather than an error
        torch.autograd.grad(out, params, grad, allow_unused=True)
    end = clock.mark()
    input_ms = clock.ms(start, middle) if edge is not None else 0.0
    weight_ms = clock.ms(middle, end) if params else 0.0
    del out
    return input_ms, weight_ms
