"""Timing a layer's backward split into its input gradient (I) and its weight gradient (W).

Problem: zero-bubble pipeline schedules run a layer's backward as two
passes: I, the gradient of the layer's input, which the previous stage is
waiting for, and W, the gradients of its parameters, which only the
optimizer step needs and which can therefore fill a pipeline bubble. A
schedule needs the time of each, and the fused backward's time does not say
how it divides.

Approach: both passes are taken from the same graph, by the very code a
stage that splits its backward runs
(:class:`~workbench.models.split_backward.SplitBackward`), so the profile
says what the runtime pays. Per run, untimed: a fresh stage input
(:meth:`~workbench.profiling.profiler._LayerRunner.prepare`, which builds it
through :func:`workbench.models.boundary.stage_input` and copies it for a
layer that modifies its input in place), the gradient edge of that input,
taken before the forward (a layer that starts with an in-place op rebases
the input tensor's history, so the edge, not the tensor, points at the
boundary), and the layer's forward. Then, on the profiler's clock, I (the
input gradient, with the gradients of the layer's vectors, which the same
nodes compute) and W (the matrices' gradients, from where their branches
join the activation path).

With fused weight-gradient accumulation (``profile(...,
fused_weight_grads=True)``), the layer's linear layers run through
:mod:`~workbench.models.fused_grads`: I queues their weight products and W
runs them, as such a stage does.

Zero cases, not timed: the first layer has I = 0 (its input is data, with no
gradient to compute); a layer without trainable parameters has W = 0; a
layer whose output needs no gradient has neither.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import torch
from torch.autograd.graph import get_gradient_edge

from ..models.fused_grads import WeightGradBuffers, fuse_weight_grads, split_input_pass, split_weight_pass, unfused
from ..models.split_backward import SplitBackward

__all__ = ["time_split_run", "SPLIT_FIELDS", "fused_copy"]

SPLIT_FIELDS = ("input_grad_ms", "weight_grad_ms")


def fused_copy(module: torch.nn.Module) -> tuple[torch.nn.Module, WeightGradBuffers]:
    """A copy of ``module`` whose linear layers accumulate their weight gradients inside their products."""
    module = copy.deepcopy(module)
    buffers = WeightGradBuffers()
    fuse_weight_grads(module, buffers)
    return module, buffers


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


def time_split_run(runner: _Runner, clock: _Clock, buffers: WeightGradBuffers | None = None) -> tuple[float, float]:
    """One run of the split backward: ``(I ms, W ms)``; forward and setup are not timed (module docstring).
    ``buffers``: the layer's linear layers are fused into them, and I queues their products for W, as a
    stage with ``training.fused_weight_grads`` runs them."""
    runner.prepare()
    edge = get_gradient_edge(runner.x) if runner.needs_grad else None
    out = runner.forward()
    if not out.requires_grad:
        return 0.0, 0.0
    grad = runner.output_grad(out)
    params = [p for p in runner.layer.parameters() if p.requires_grad]
    split = SplitBackward(out, edge, unfused(buffers, params))
    clock.sync()
    start = clock.mark()
    split_input_pass(buffers, "profile", split, grad)
    middle = clock.mark()
    split_weight_pass(buffers, "profile", split)
    end = clock.mark()
    for p in params:  # the timing runs leave no gradients behind
        p.grad = None
    input_ms = clock.ms(start, middle) if edge is not None else 0.0
    weight_ms = clock.ms(middle, end) if params else 0.0
    return input_ms, weight_ms
