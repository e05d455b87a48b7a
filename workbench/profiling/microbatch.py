"""Micro-batch passes: what splitting a profiled batch into micro-batches costs.

Problem: a per-layer profile times each layer on the whole batch, hot in
cache, with its live weights; a pipeline rank runs the same layers on
micro-batches, often with the cache evicted by other ranks sharing its cores,
and an asynchronous pipeline on stashed weight versions. The planner needs
the factor between the two.

Approach: the batch runs through the layers as a pipeline rank runs them
(every layer a stage fed a fresh, detached buffer; the forward of every
micro-batch, then their backwards), for micro-batches of 1, 2, 4, ...
samples, in three modes: hot, with the last-level cache flushed before each
pass (cold), and with every forward on detached weight copies bound by
``torch.func.functional_call`` (bound). Rounds interleave sizes and modes so
drift hits all alike; each median is set against the profile's time for the
same samples. :func:`workbench.profiling.profiler.profile` runs this on
request (``microbatch_passes=True``, CPU only) into
``meta["microbatch_factors"]``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch.func import functional_call

from ..core.costs import LayerCost
from ..models import LayerSequence
from ..models.boundary import stage_input

__all__ = ["microbatch_factors"]


def _zero_grads(module: torch.nn.Module) -> None:
    for param in module.parameters():
        param.grad = None


def _cache_bytes() -> int:
    """The last-level cache of CPU 0 (sysfs), 32 MiB where it cannot be read."""
    from pathlib import Path

    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
            best = max(best, int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError, KeyError):
            continue
    return best or 32 << 20


def _microbatch_passes(seq: LayerSequence, inputs: torch.Tensor, targets: torch.Tensor, size: int,
                       flush: torch.Tensor | None, bound: bool = False) -> float:
    """Seconds of forward and backward for the batch in micro-batches of ``size``, every layer a stage
    (its input a fresh, detached buffer); ``flush``: a buffer written before each timed pass (the cache left
    cold); ``bound``: every forward runs on detached copies of the layer's weights bound by
    ``torch.func.functional_call``, whose gradients land in the parameters' own buffers, as an
    asynchronous pipeline binds a stashed weight version to each micro-batch."""
    total = 0.0
    graphs = []
    for x, y in zip(inputs.split(size), targets.split(size)):
        h, saved = x, []
        for i in range(len(seq)):
            # a fresh buffer, as a received activation is (a first in-place op must not touch the saved output)
            inp, box = stage_input(h.detach().clone()) if i > 0 and h.is_floating_point() else (h, None)
            if flush is not None:
                flush.add_(1.0)
            start = time.perf_counter()
            leaves = None
            if bound:
                named = [(n, p) for n, p in seq[i].named_parameters() if p.requires_grad]
                leaves = [(p.detach().requires_grad_(True), p) for _, p in named]
                out = functional_call(seq[i], {n: leaf for (n, _), (leaf, _) in zip(named, leaves)}, (inp,))
            else:
                out = seq.call_layer(i, inp)
            if i == len(seq) - 1:
                out = seq.loss_fn(out, y)
            total += time.perf_counter() - start
            saved.append((box, out, leaves))
            h = out
        graphs.append(saved)
    for saved in graphs:
        grad = None
        for box, out, leaves in reversed(saved):
            if flush is not None:
                flush.add_(1.0)
            start = time.perf_counter()
            for leaf, param in leaves or ():
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                leaf.grad = param.grad  # autograd accumulates into the live gradient in place
            if grad is None:
                out.backward()
            elif out.requires_grad:
                out.backward(grad)
            total += time.perf_counter() - start
            grad = box.grad if box is not None else None
    return total


_PASS_MODES = {"hot": (False, False), "cold": (True, False), "bound": (False, True)}


def microbatch_factors(seq: LayerSequence, inputs: torch.Tensor, targets: torch.Tensor, layers: list[LayerCost],
                        repeats: int) -> dict[str, Any]:
    """The batch split into micro-batches of 1, 2, 4, ... samples (those dividing it), run hot, with the
    cache flushed and with bound weight copies, each against the per-layer profile's time for the same
    samples (CPU only)."""
    batch = int(inputs.shape[0])
    profiled_s = sum(l.forward_ms + l.backward_ms for l in layers) / 1e3
    sizes = sorted({b for b in (1, 2, 4, 8, 16, 32, batch) if b <= batch and batch % b == 0})
    flush = torch.ones(int(_cache_bytes() * 1.5) // 4)
    runs: dict[tuple[int, str], list[float]] = {(size, mode): [] for size in sizes for mode in _PASS_MODES}
    for round_ in range(1 + max(3, repeats)):  # interleaved rounds (the first a warm-up), so drift hits all alike
        for (size, mode), times in runs.items():
            cold, bound = _PASS_MODES[mode]
            _zero_grads(seq)
            elapsed = _microbatch_passes(seq, inputs, targets, size, flush if cold else None, bound)
            if round_:
                times.append(elapsed)
    factors = {mode: [round(statistics.median(runs[size, mode]) / profiled_s, 4) for size in sizes]
               for mode in _PASS_MODES}
    _zero_grads(seq)
    return {"sizes": sizes, **factors, "flush_bytes": int(flush.numel() * 4)}
