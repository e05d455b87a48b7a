"""Profiling identical layers once: which layers are the same computation, and the times they share.

Problem: a transformer repeats one block dozens of times (GPT-2 small with
48 layers has 48 identical blocks), and timing each of them (warm-up and
repeats of a forward, a fused backward and a split one) is nearly all of a
profile's time, spent measuring the same thing again. Galvatron profiles
one layer per type.

Approach: a layer's *signature* says what its timing depends on: its module
tree in order (each module's class, training mode, ``extra_repr`` and plain
attributes such as a head count, except its position in the model:
``layer_idx``, which Hugging Face attention keeps for its KV cache), the
shapes, dtypes and ``requires_grad`` of its parameters and buffers, its
hooks, and its input (shape, dtype, strides, whether a gradient flows back
into it, whether the loss follows it). The layers of a signature are
counted on their own (FLOPs, saved bytes and peak memory, parameter bytes:
:func:`workbench.profiling.profiler._count_layer`), and those counts and the
output's shape and dtype join the signature, so two layers that only look
alike are never merged. Counting runs a forward and a backward, so once a
signature has all its timed layers and they were counted alike, the next
layers of it run only a forward without autograd (to pass their output on)
and take those counts when their output's shape and dtype are the same
(``meta["counts_borrowed"]`` lists them; any other layer is counted). Layers with one key share one measurement: it is
taken on the first of them and, while the key has fewer than
:data:`SHARED_TIMED_LAYERS` timed layers, on the next ones too, their
samples pooled (so a shared time rests on up to 3 x ``repeats`` samples
from several positions in the model); the other layers take the pooled
median and spread. ``meta["identical_layers"]`` lists each group of two or
more layers with the ones actually timed.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["layer_signature", "TimingGroups", "SHARED_TIMED_LAYERS"]

# How many layers of one signature are timed; their samples are pooled into the measurement the group shares.
SHARED_TIMED_LAYERS = 3
_PLAIN = (bool, int, float, str, type(None))
_POSITION = re.compile(r"^(layer|block)_?(idx|index|id|number)$")  # where a layer sits, not what it computes


def _plain_attributes(module: nn.Module) -> tuple:
    """The module's public plain attributes (numbers, strings, tuples of them), its position left out."""
    out = []
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or _POSITION.match(name):
            continue
        if isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)):
            out.append((name, value))
    return tuple(out)


def _hooks(module: nn.Module) -> tuple[int, ...]:
    return tuple(len(getattr(module, name, None) or ()) for name in
                 ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))


def layer_signature(layer: nn.Module, x: torch.Tensor, *, needs_grad: bool, is_last: bool) -> str:
    """What ``layer``'s timing on input ``x`` depends on, as a short digest (see the module docstring)."""
    modules = tuple((name, f"{type(m).__module__}.{type(m).__qualname__}", m.training, m.extra_repr(),
                     _plain_attributes(m), _hooks(m)) for name, m in layer.named_modules())
    params = tuple((name, tuple(p.shape), str(p.dtype), p.requires_grad, p.device.type)
                   for name, p in layer.named_parameters())
    buffers = tuple((name, tuple(b.shape), str(b.dtype), b.device.type) for name, b in layer.named_buffers())
    inputs = (tuple(x.shape), str(x.dtype), tuple(x.stride()), x.device.type, needs_grad, is_last)
    return hashlib.sha256(repr((modules, params, buffers, inputs)).encode()).hexdigest()[:20]


@dataclass
class _Group:
    members: list[int] = field(default_factory=list)
    timed: list[int] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)


class TimingGroups:
    """Layers grouped by their signature and counts; which to time, and the samples each gets.

    With ``share`` False every layer is its own group and is timed, as a
    profile of every layer is.
    """

    def __init__(self, share: bool, most_timed: int = SHARED_TIMED_LAYERS) -> None:
        self.share = share
        self.most_timed = most_timed if share else 1
        self._groups: dict[Any, _Group] = {}
        self._of: dict[int, _Group] = {}

    def full(self, signature: str) -> bool:
        """Whether layers of this signature already have all their timed layers (the next one is likely to join
        them: it is counted first, and timed only when its counts set it apart)."""
        return self.share and any(key[0] == signature and len(group.timed) >= self.most_timed
                                  for key, group in self._groups.items())

    def join(self, index: int, signature: str, counted: Any = None) -> bool:
        """Put layer ``index`` in the group of its signature and counts; True when it is to be timed (:meth:`add`
        its samples)."""
        key = (signature, counted) if self.share else ("layer", index)
        group = self._groups.setdefault(key, _Group())
        group.members.append(index)
        self._of[index] = group
        if len(group.timed) >= self.most_timed:
            return False
        group.timed.append(index)
        return True

    def add(self, index: int, times: dict[str, list[float]]) -> None:
        """The samples layer ``index`` was timed at, pooled into its group's."""
        group = self._of[index]
        for name, values in times.items():
            group.samples.setdefault(name, []).extend(values)

    def samples(self, index: int) -> dict[str, list[float]]:
        """The samples layer ``index``'s times are taken from: its group's, pooled."""
        return self._of[index].samples

    def shared(self) -> list[dict[str, list[int]]]:
        """Every group of two or more layers: its layers and the ones timed, for ``meta["identical_layers"]``."""
        return [{"layers": list(g.members), "timed": list(g.timed)} for g in self._groups.values()
                if len(g.members) > 1]
