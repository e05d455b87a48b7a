"""Weight gradients accumulated inside their own matrix product (``training.fused_weight_grads``).

Problem. A pipeline adds up each stage's weight gradients over a step's
micro-batches. With plain autograd, every micro-batch's backward computes a
linear layer's weight gradient into a freshly allocated tensor, then adds it
to ``.grad`` (a second pass over it: read both, write one); the first
micro-batch of a step allocates ``.grad`` itself anew, because the optimizer
let go of it. On a CPU a fresh allocation of a few megabytes is served by new
pages, and writing them faults each page in (``bench/bench_fused_grads.py``
counts the faults and times both ways).

Approach (the gradient-accumulation fusion of large-model trainers). The
stage's ``nn.Linear`` layers (and Hugging Face's ``Conv1D``, GPT-2's
projection) run through an autograd function whose backward writes the
weight gradient itself, with the product's own accumulate: ``grad += g^T x``
is one ``addmm_`` into ``.grad``. The first micro-batch of a step, finding no
``.grad``, writes into a buffer this module keeps for the weight across
steps (pages already resident) and makes it the ``.grad``. So no micro-batch
allocates a weight gradient and none makes an extra pass over it. Biases and
every other parameter take autograd's usual path.

Where ``.grad`` is already a view of a flat buffer (GroPipe), the product
accumulates straight into that view. Under autocast the product runs in the
autocast dtype and is added to the full-precision ``.grad``.

The gradients are the same sums in another order of additions (within
float rounding of autograd's). What the backward returns for the weight is
nothing: hooks registered on a fused weight's gradient do not fire, which
is why only the pipeline runtimes, which register none, use it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["WeightGradBuffers", "fuse_weight_grads", "fusable"]


class WeightGradBuffers:
    """Per weight, the tensor its ``.grad`` is written into at a step's first micro-batch, kept across steps."""

    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}

    def accumulate(self, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """``weight.grad += a @ b`` in place; where ``weight.grad`` is None, the product becomes it (in the buffer)."""
        grad = weight.grad
        if grad is None:
            grad = self._buffers.get(id(weight))
            if grad is None:
                grad = self._buffers[id(weight)] = torch.empty_like(weight)
            grad.zero_()  # then accumulate: as fast as an overwriting product here, and one code path
            weight.grad = grad
        if a.dtype == grad.dtype:
            grad.addmm_(a, b)
        else:  # autocast: the product in its dtype, added at full precision
            grad.add_(torch.mm(a, b))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._buffers.values())


class _FusedLinear(torch.autograd.Function):
    """``y = x W^T + b`` (``nn.Linear``); ``transposed``: ``y = x W + b`` (Hugging Face ``Conv1D``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, buffers: WeightGradBuffers, transposed: bool):
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            xc, wc, bc = x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)
            with torch.autocast(device, enabled=False):
                out = _product(xc, wc, bc, transposed)
        else:
            xc, wc = x, weight
            out = _product(x, weight, bias, transposed)
        ctx.save_for_backward(xc, wc)
        ctx.buffers, ctx.transposed, ctx.weight = buffers, transposed, weight
        ctx.input_dtype, ctx.bias_dtype = x.dtype, None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        xc, wc = ctx.saved_tensors
        go = grad_out.to(wc.dtype).reshape(-1, grad_out.shape[-1])
        flat = xc.reshape(-1, xc.shape[-1])
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (go @ wc.t() if ctx.transposed else go @ wc).view(*xc.shape).to(ctx.input_dtype)
        if ctx.needs_input_grad[1]:
            with torch.no_grad():
                if ctx.transposed:  # W: (in, out), dW = x^T g
                    ctx.buffers.accumulate(ctx.weight, flat.t(), go)
                else:  # W: (out, in), dW = g^T x
                    ctx.buffers.accumulate(ctx.weight, go.t(), flat)
        grad_b = go.sum(0).to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[2] else None
        return grad_x, None, grad_b, None, None


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    if not transposed:
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    out = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
    return out.view(*x.shape[:-1], weight.shape[-1])


def _fused_forward(module: nn.Module, buffers: WeightGradBuffers, transposed: bool, x: torch.Tensor) -> torch.Tensor:
    return _FusedLinear.apply(x, module.weight, module.bias, buffers, transposed)


def _transposed(module: nn.Module) -> bool | None:
    """Whether a fusable layer stores its weight transposed: False for ``nn.Linear``, True for a ``Conv1D``;
    None for a layer that is not fusable."""
    if type(module) is nn.Linear:
        return False
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None \
            and module.weight.dim() == 2 and getattr(module, "nf", None) == module.weight.shape[1]:
        return True
    return None


def fusable(module: nn.Module) -> list[nn.Module]:
    """The layers of ``module`` whose weight gradients :func:`fuse_weight_grads` would fuse."""
    return [m for m in module.modules()
            if _transposed(m) is not None and type(m.weight) is nn.Parameter and m.weight.requires_grad]


def fuse_weight_grads(module: nn.Module, buffers: WeightGradBuffers) -> int:
    """Run ``module``'s linear layers through the fused product (module docstring); how many were changed."""
    layers = fusable(module)
    for layer in layers:
        layer.forward = functools.partial(_fused_forward, layer, buffers, _transposed(layer))
    return len(layers)
