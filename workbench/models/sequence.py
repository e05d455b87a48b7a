"""A model as an ordered chain of named layers, each passing one tensor on.

Pipeline partitioning, per-layer profiling and stage execution all need the
same view of a model: a list of units where unit ``i`` consumes exactly the
tensor unit ``i - 1`` produced. :class:`LayerSequence` is that view. It is an
``nn.Sequential`` over the *original* module objects (no copies), so a stage
cut from it shares weights with the dense model and stays comparable to it.

Three ways in:

* the zoo (:func:`workbench.models.build_model`) wraps torchvision and
  transformers models, knowing where their safe cut points are;
* :meth:`LayerSequence.from_sequential` takes any ``nn.Sequential``;
* :meth:`LayerSequence.from_module` traces an arbitrary module with
  ``torch.fx``, treats each top-level child as a unit, and *refuses* the model
  when a value crosses a cut point next to another (a skip connection from
  one unit to a later one), naming the values, instead of profiling a chain
  that does not compute what the model computes.

A layer that rejects its input (wrong shape or dtype) is reported by name,
with the per-sample shape it expects when the sequence knows its input spec.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from ..core.fields import check_int

__all__ = ["LayerSequence", "InputSpec", "TASKS", "token_cross_entropy", "synthetic_inputs"]

TASKS = ("image-classification", "classification", "causal-lm", "masked-lm", "custom")


@dataclass(frozen=True)
class InputSpec:
    """What one sample looks like: per-sample ``shape``, ``dtype`` and value range.

    ``high`` is the exclusive upper bound for integer inputs (vocabulary size);
    ``num_targets`` the number of classes (or the vocabulary) of the targets.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    high: int | None = None
    num_targets: int | None = None


def synthetic_inputs(spec: InputSpec, batch_size: int, *, seed: int = 0,
                     device: torch.device | str = "cpu") -> torch.Tensor:
    """Random inputs [batch_size, *spec.shape] of ``spec.dtype`` (token ids below ``spec.high``)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch_size, *spec.shape)
    if spec.dtype.is_floating_point:
        x = torch.randn(shape, generator=generator).to(spec.dtype)
    else:
        x = torch.randint(0, spec.high or 2, shape, generator=generator, dtype=spec.dtype)
    return x.to(device)


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over tokens: logits [B, T, V], targets [B, T] (-100 ignored).

    ``targets[:, t]`` is the token expected at position ``t`` (for causal LMs
    the data already holds the next token there, see ``workbench.models.data``).
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or "." in name:
        raise ValueError(f"layer name must be a non-empty str without '.', got {name!r}")


class LayerSequence(nn.Sequential):
    """Ordered, named, partitionable layers whose composition is the model.

    ``loss_fn(output, target)`` turns the last layer's output into a scalar
    (cross-entropy by default); ``task`` says what the targets are;
    ``input_spec`` (may be None for user models) lets :func:`sample_batch`
    synthesise inputs and lets shape errors say what was expected.
    """

    def __init__(
        self,
        layers: "OrderedDict[str, nn.Module] | Iterable[tuple[str, nn.Module]]",
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        name: str = "custom",
        task: str = "custom",
        input_spec: InputSpec | None = None,
        config: dict | None = None,
    ) -> None:
        layers = OrderedDict(layers)
        if not layers:
            raise ValueError("a LayerSequence needs at least one layer, got none")
        for layer_name, module in layers.items():
            _check_name(layer_name)
            if not isinstance(module, nn.Module):
                raise ValueError(f"layer {layer_name!r} must be an nn.Module, got {type(module).__name__}")
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        super().__init__(layers)
        self.model_name = name
        self.task = task
        self.input_spec = input_spec
        self.config = dict(config or {})
        object.__setattr__(self, "_loss_fn", loss_fn)  # a loss nn.Module must not become a layer

    # -- views ------------------------------------------------------------------------
    @property
    def layer_names(self) -> list[str]:
        return list(self._modules.keys())

    def stage(self, first: int, last: int) -> nn.Sequential:
        """Layers ``first..last`` (inclusive) as an ``nn.Sequential`` of the same module objects."""
        n = len(self)
        for field_name, value in (("first", first), ("last", last)):
            check_int(field_name, value, 0, n - 1, expected=f"a layer index in [0, {n - 1}]")
        if first > last:
            raise ValueError(f"first ({first}) must be <= last ({last})")
        items = list(self._modules.items())[first:last + 1]
        return nn.Sequential(OrderedDict(items))

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return nn.Sequential(OrderedDict(list(self._modules.items())[index]))
        return super().__getitem__(index)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def loss_fn(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Scalar training loss of the last layer's output against ``target``."""
        if self._loss_fn is not None:
            return self._loss_fn(output, target)
        if output.dim() == 3:
            return token_cross_entropy(output, target)
        return F.cross_entropy(output, target)

    # -- running ----------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for index in range(len(self)):
            x = self.call_layer(index, x)
        return x

    def call_layer(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Run layer ``index`` on ``x``; a rejected input or a non-tensor output is a ValueError naming the layer."""
        layer_name, layer = list(self._modules.items())[index]
        try:
            out = layer(x)
        except (RuntimeError, IndexError, TypeError) as exc:
            raise ValueError(self._rejection(index, layer_name, x, exc)) from exc
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"layer {index} {layer_name!r} returned {type(out).__name__}, not a tensor; every layer of a "
                "sequence must pass exactly one tensor to the next (wrap it to return one)")
        return out

    def expected_input_shapes(self) -> list[tuple[int, ...]] | None:
        """Per-sample input shape of every layer, from a 1-sample run of the input spec."""
        if self.input_spec is None:
            return None
        x = synthetic_inputs(self.input_spec, 1, seed=0, device=next(self.parameters(), torch.empty(0)).device)
        shapes = []
        with torch.no_grad():
            for layer in self._modules.values():
                shapes.append(tuple(x.shape[1:]))
                x = layer(x)
        return shapes

    def _rejection(self, index: int, layer_name: str, x: object, exc: Exception) -> str:
        got = f"shape {tuple(x.shape)} dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        expected = ""
        try:
            shapes = self.expected_input_shapes()
        except (RuntimeError, ValueError):
            shapes = None
        if shapes is not None:
            want = shapes[index]
            dtype = self.input_spec.dtype if index == 0 else "a float tensor"
            expected = f"; expected [batch, {', '.join(map(str, want))}] ({dtype})"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (f"layer {index} {layer_name!r} of {self.model_name!r} rejected its input ({got}){expected}: "
                f"{first_line}")

    # -- constructors -----------------------------------------------------------------
    @classmethod
    def from_sequential(cls, sequential: nn.Sequential, loss_fn=None, name: str = "custom",
                        input_spec: InputSpec | None = None) -> "LayerSequence":
        """Wrap a user ``nn.Sequential``; its children become the layers, same objects."""
        if isinstance(sequential, LayerSequence):
            return sequential
        if not isinstance(sequential, nn.Sequential):
            raise ValueError(f"from_sequential needs an nn.Sequential, got {type(sequential).__name__}; "
                             "use LayerSequence.from_module for other modules")
        layers = [(key if key.isidentifier() else f"layer{key}", module) for key, module in sequential._modules.items()]
        return cls(layers, loss_fn=loss_fn, name=name, task="custom", input_spec=input_spec)

    @classmethod
    def from_module(cls, module: nn.Module, loss_fn=None, name: str | None = None,
                    input_spec: InputSpec | None = None) -> "LayerSequence":
        """Cut ``module`` at its top-level children, refusing it if that changes what it computes.

        The module is traced with ``torch.fx`` (children kept opaque). Glue
        operations between children (``torch.flatten``, ``x + y``) join the unit
        of their latest input. The chain is valid when the input feeds only the
        first unit and after every unit exactly one value is needed later.
        """
        if isinstance(module, nn.Sequential):
            return cls.from_sequential(module, loss_fn=loss_fn, name=name or "custom", input_spec=input_spec)
        from .tracing import split_at_children

        units = split_at_children(module)
        return cls(units, loss_fn=loss_fn, name=name or type(module).__name__.lower(), task="custom",
                   input_spec=input_spec)
