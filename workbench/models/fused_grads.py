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
is one in-place ``addmm`` into ``.grad``. The first micro-batch of a step, finding no
``.grad``, writes into a buffer this module keeps for the weight across
steps (pages already resident) and makes it the ``.grad``. So no micro-batch
allocates a weight gradient and none makes an extra pass over it. Biases and
every other parameter take autograd's usual path.

Where ``.grad`` is already a view of a flat buffer (GroPipe), the product
accumulates straight into that view. Under autocast the product runs in the
autocast dtype and is added to the full-precision ``.grad``.

Split backward (zero-bubble kinds). While a stage runs a micro-batch's
input gradient (I) inside :meth:`WeightGradBuffers.deferring`, each fused
layer's backward computes its input gradient and queues its weight product
instead of running it; :meth:`WeightGradBuffers.flush` runs the queue in
the micro-batch's W. So W is those products alone, with no second walk of
the graph for them (:mod:`~workbench.models.split_backward` keeps the
other parameters' W).

The gradients are the same sums in another order of additions (within
float rounding of autograd's). What the backward returns for the weight is
nothing: hooks registered on a fused weight's gradient do not fire, which
is why only the pipeline runtimes, which register none, use it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Hashable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from .split_backward import SplitBackward

__all__ = ["WeightGradBuffers", "fuse_weight_grads", "fusable", "unfused", "split_input_pass", "split_weight_pass"]


class WeightGradBuffers:
    """Per weight, the tensor its ``.grad`` is written into at a step's first micro-batch, kept across steps;
    and the weight products a split backward's I left for its W, per micro-batch key."""

    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}
        self._fused: set[int] = set()  # ids of the weights whose layers fuse
        # per key, (graph node, weight, a, b) of each queued product weight.grad += a @ b; the open queue
        self._pending: dict[Hashable, list[tuple[object, torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        self._queue: list[tuple[object, torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def fuses(self, weight: torch.Tensor) -> bool:
        """Whether ``weight``'s layer runs through the fused product (autograd then gives it no gradient)."""
        return id(weight) in self._fused

    @contextlib.contextmanager
    def deferring(self, key: Hashable) -> Iterator[None]:
        """Inside: the fused layers' weight products are queued under ``key`` for :meth:`flush`, not run."""
        if key in self._pending or self._queue is not None:
            raise RuntimeError(f"weight products of {key!r} are already deferred" if key in self._pending
                               else "deferring weight products inside another deferral")
        self._queue = self._pending[key] = []
        try:
            yield
        finally:
            self._queue = None

    def flush(self, key: Hashable, nodes: set[int] | None = None) -> None:
        """Run the weight products queued under ``key``, in the order they were queued; ``nodes``: only those
        of the graph nodes with these ids, the others dropped."""
        with torch.no_grad():  # outside a backward (GroPipe's .grad views were made without grad)
            for node, weight, a, b in self._pending.pop(key, ()):
                if nodes is None or id(node) in nodes:
                    self._accumulate(weight, a, b)

    def queued_nodes(self, key: Hashable) -> set[int]:
        """Ids of the graph nodes whose products are queued under ``key``."""
        return {id(node) for node, _, _, _ in self._pending.get(key, ())}

    @property
    def pending(self) -> int:
        """Keys (micro-batches) whose weight products wait for their W."""
        return len(self._pending)

    def accumulate(self, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, node: object = None) -> None:
        """``weight.grad += a @ b`` in place; where ``weight.grad`` is None, the product becomes it (in the buffer).
        Inside :meth:`deferring`, queued instead, with the graph ``node`` whose backward computed it."""
        if self._queue is not None:
            self._queue.append((node, weight, a, b))
            return
        self._accumulate(weight, a, b)

    def _accumulate(self, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        grad = weight.grad
        if grad is None:
            grad = self._buffers.get(id(weight))
            if grad is None:
                grad = self._buffers[id(weight)] = torch.empty_like(weight)
            grad.zero_()  # then accumulate: as fast as an overwriting product here, and one code path
            weight.grad = grad
        if a.dtype == grad.dtype:
            torch.addmm(grad, a, b, out=grad)  # in place; as an addmm, which FLOP counters see
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
                    ctx.buffers.accumulate(ctx.weight, flat.t(), go, ctx)
                else:  # W: (out, in), dW = g^T x
                    ctx.buffers.accumulate(ctx.weight, go.t(), flat, ctx)
        grad_b = go.sum(0).to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[2] else None
        return grad_x, None, grad_b, None, None


def unfused(buffers: WeightGradBuffers | None, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters a split backward's graph walk differentiates: every one, or (``buffers``) all but the
    fused weights, whose products :func:`split_input_pass` queues."""
    return list(params) if buffers is None else [p for p in params if not buffers.fuses(p)]


def split_input_pass(buffers: WeightGradBuffers | None, key: Hashable, split: "SplitBackward",
                     grad_output: torch.Tensor | None) -> torch.Tensor | None:
    """I of a split backward made over :func:`unfused` parameters; with ``buffers``, the fused layers' weight
    products queued under ``key`` for :func:`split_weight_pass`."""
    if buffers is None:
        return split.backward_input(grad_output)
    with buffers.deferring(key):
        return split.backward_input(grad_output)


def split_weight_pass(buffers: WeightGradBuffers | None, key: Hashable, split: "SplitBackward") -> None:
    """W of a split backward whose I ran through :func:`split_input_pass`: every fused layer's product once.

    The products I queued run. A fused layer that I did not pass through
    (off the input's path) gets its product from a pass from the output to
    its weight, which may also run layers I already covered: only the
    uncovered nodes' products are kept. ``split``'s own W then runs for the
    other parameters; any fused product its passes make is a repeat and is
    dropped. On a first stage I ran nothing and W is one whole backward, in
    which the fused layers accumulate directly. Without ``buffers``, ``split``'s own W.
    """
    if buffers is None:
        split.backward_weight()
        return
    if split.input_node is None:
        buffers.flush(key)  # nothing queued
        split.backward_weight()
        return
    covered = buffers.queued_nodes(key)
    missed = [n for n in split.nodes if getattr(n, "_forward_cls", None) is _FusedLinear and id(n) not in covered]
    if missed:
        with buffers.deferring(("missed", key)):
            torch.autograd.grad(split.output, [n.weight for n in missed], grad_outputs=split.output_grad(),
                                retain_graph=True, allow_unused=True)
        buffers.flush(("missed", key), nodes={id(n) for n in missed})
    buffers.flush(key)
    with buffers.deferring(("repeat", key)):
        split.backward_weight()
    buffers.flush(("repeat", key), nodes=set())


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
        buffers._fused.add(id(layer.weight))
        layer.forward = functools.partial(_fused_forward, layer, buffers, _transposed(layer))
    return len(layers)
