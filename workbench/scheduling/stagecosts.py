"""Per-stage, per-micro-batch costs: what the simulator and the partitioners time.

A ``ModelCosts`` profile is measured at one batch size ``B``; a pipeline runs
micro-batches of size ``b``. Scaling time linearly (``t * b / B``) is wrong
for layers bound by reading their weights (large fully connected layers):
each extra micro-batch re-reads every weight, so a small micro-batch costs
nearly as much as the whole batch. The model used here is

    t(b) = max(t_B * b / B,  weight-read floor)

with the floor ``param_bytes / memory bandwidth`` for the forward and twice
that for the backward (weight and input gradients each read the weights).
The bandwidth comes from the device spec when given (``DeviceSpec.
memory_bandwidth_gbs``), else ``costs.meta["weight_read_gbs"]``; without
either, time scales linearly. A profile with a ``batch_fit`` (profiles at
several batch sizes, :mod:`workbench.core.batch_fit`) needs neither: its
times are the fit's at ``b``, which measured what a small micro-batch costs.
Activation and saved bytes scale linearly with ``b``; weights, gradients and
optimizer state do not.

Optimizer state defaults to Adam (two fp32-sized moments: ``2 x
param_bytes``) when a layer does not state ``optimizer_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ..core.costs import DeviceSpec, LayerCost, ModelCosts
from ..core.fields import check_int, check_number, number
from ..core.partition import Partition

__all__ = ["StageCosts", "layer_times_ms", "OPTIMIZER_STATE_FACTORS", "PROFILED_OPTIMIZERS", "optimizer_bytes", "for_optimizer"]

OPTIMIZER_STATE_FACTORS = {"adam": 2.0, "sgd-momentum": 1.0, "sgd": 0.0}


# the profiler's optimizer names (``workbench profile --optimizer``) -> the planner's, by the state they keep
PROFILED_OPTIMIZERS = {"adam": "adam", "adamw": "adam", "sgd": "sgd-momentum", "sgd-plain": "sgd", "none": "sgd"}


def for_optimizer(costs: ModelCosts, optimizer: str) -> ModelCosts:
    """``costs`` with the optimizer state the profile measured for another optimizer than ``optimizer`` left out
    (each layer's then derived from ``optimizer``, :func:`optimizer_bytes`): a profile taken for Adam costs an
    SGD run's memory and step as SGD's. A profile that does not say its optimizer is kept."""
    profiled = PROFILED_OPTIMIZERS.get(str(costs.meta.get("optimizer")))
    if profiled is None or profiled == optimizer or all(l.optimizer_bytes is None for l in costs.layers):
        return costs
    return replace(costs, layers=tuple(replace(l, optimizer_bytes=None) for l in costs.layers))


def optimizer_bytes(layer: LayerCost, optimizer: str = "adam") -> int:
    """Optimizer state bytes of one layer (the profile's value when it has one)."""
    if optimizer not in OPTIMIZER_STATE_FACTORS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATE_FACTORS)}, got {optimizer!r}")
    if layer.optimizer_bytes is not None:
        return layer.optimizer_bytes
    return int(OPTIMIZER_STATE_FACTORS[optimizer] * layer.param_bytes)


def _weight_read_gbs(costs: ModelCosts, device: DeviceSpec | None) -> float | None:
    if device is not None:
        return device.memory_bandwidth_gbs
    value = costs.meta.get("weight_read_gbs")
    if value is None:
        return None
    check_number("costs.meta['weight_read_gbs']", value, 0, strict=True, expected="a number > 0 (GB/s)")
    return float(value)


def layer_times_ms(costs: ModelCosts, microbatch_size: int | None = None, *,
                   device: DeviceSpec | None = None) -> tuple[list[float], list[float]]:
    """Forward and backward time of every layer for one micro-batch of ``microbatch_size``."""
    b = costs.batch_size if microbatch_size is None else microbatch_size
    check_int("microbatch_size", b, 1)
    if costs.batch_fit is not None:
        return costs.batch_fit.times_ms(b)
    scale = b / costs.batch_size
    gbs = _weight_read_gbs(costs, device)
    forward, backward = [], []
    for layer in costs.layers:
        floor = layer.param_bytes / (gbs * 1e9) * 1e3 if gbs else 0.0
        forward.append(max(layer.forward_ms * scale, floor))
        backward.append(max(layer.backward_ms * scale, 2 * floor))
    return forward, backward


@dataclass(frozen=True)
class StageCosts:
    """Costs of every (virtual) stage for one micro-batch.

    ``send_bytes[s]`` is what stage ``s`` sends downstream per micro-batch
    (its last layer's output; the gradient sent back upstream has the same
    size); ``activation_bytes[s]`` what it keeps per micro-batch in flight.
    ``step_ms`` is the optimizer step of the stage. ``input_grad_ms`` and
    ``weight_grad_ms`` split ``backward_ms`` into the input gradient (I) and
    the weight gradient (W) that zero-bubble schedules run apart; left empty,
    each is half of the backward.
    """

    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    send_bytes: tuple[int, ...]
    param_bytes: tuple[int, ...]
    grad_bytes: tuple[int, ...]
    optimizer_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    step_ms: tuple[float, ...] = ()
    microbatch_size: int | None = None
    input_grad_ms: tuple[float, ...] = ()
    weight_grad_ms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.forward_ms)
        if n == 0:
            raise ValueError("StageCosts needs at least one stage, got none")
        if not self.step_ms:
            object.__setattr__(self, "step_ms", (0.0,) * n)
        if not self.input_grad_ms and not self.weight_grad_ms:
            half = tuple(b / 2 for b in self.backward_ms)
            object.__setattr__(self, "input_grad_ms", half)
            object.__setattr__(self, "weight_grad_ms", half)
        for name in ("forward_ms", "backward_ms", "send_bytes", "param_bytes", "grad_bytes", "optimizer_bytes",
                     "activation_bytes", "step_ms", "input_grad_ms", "weight_grad_ms"):
            values = tuple(getattr(self, name))
            if len(values) != n:
                raise ValueError(f"StageCosts.{name} has {len(values)} entries, expected one per stage ({n})")
            if not all(number(0).accepts(v) for v in values):
                raise ValueError(f"StageCosts.{name} must hold numbers >= 0, got {list(values)}")
            object.__setattr__(self, name, values)

    @property
    def num_stages(self) -> int:
        return len(self.forward_ms)

    def static_bytes(self, stage: int) -> int:
        """Weights + gradients + optimizer state of one stage."""
        return self.param_bytes[stage] + self.grad_bytes[stage] + self.optimizer_bytes[stage]

    @classmethod
    def uniform(cls, num_stages: int, *, forward_ms: float = 1.0, backward_ms: float = 2.0, send_bytes: int = 0,
                param_bytes: int = 0, activation_bytes: int = 0, optimizer: str = "adam",
                input_grad_ms: float | None = None, weight_grad_ms: float | None = None) -> "StageCosts":
        """Identical stages (the textbook case for bubble formulas); I and W default to half the backward each,
        and given, set the backward to their sum."""
        check_int("num_stages", num_stages, 1)
        opt = int(OPTIMIZER_STATE_FACTORS[optimizer] * param_bytes)
        i = backward_ms / 2 if input_grad_ms is None else input_grad_ms
        w = backward_ms / 2 if weight_grad_ms is None else weight_grad_ms
        return cls(forward_ms=(forward_ms,) * num_stages, backward_ms=(i + w,) * num_stages,
                   send_bytes=(send_bytes,) * (num_stages - 1) + (0,), param_bytes=(param_bytes,) * num_stages,
                   grad_bytes=(param_bytes,) * num_stages, optimizer_bytes=(opt,) * num_stages,
                   activation_bytes=(activation_bytes,) * num_stages, input_grad_ms=(i,) * num_stages,
                   weight_grad_ms=(w,) * num_stages)

    @classmethod
    def from_model(cls, costs: ModelCosts, partition: Partition, microbatch_size: int | None = None, *,
                   device: DeviceSpec | None = None, optimizer: str = "adam") -> "StageCosts":
        """Sum a profile over each stage's layers, scaled to ``microbatch_size`` (see the module docstring)."""
        partition.check_covers(costs.num_layers)
        b = costs.batch_size if microbatch_size is None else microbatch_size
        forward, backward = layer_times_ms(costs, b, device=device)
        scale = b / costs.batch_size
        layers = costs.layers

        def stage_sum(values: Sequence[float]) -> list[float]:
            return partition.stage_sums(values)

        params = [int(v) for v in stage_sum([l.param_bytes for l in layers])]
        grads = [int(v) for v in stage_sum([l.grad_bytes or 0 for l in layers])]
        opts = [int(v) for v in stage_sum([optimizer_bytes(l, optimizer) for l in layers])]
        saved = [int(v * scale) for v in stage_sum([l.saved_bytes or l.activation_bytes for l in layers])]
        sends = [int(layers[last].activation_bytes * scale) for _, last in partition.bounds]
        sends[-1] = 0
        gbs = device.memory_bandwidth_gbs if device else None
        steps = [((2 * p + g + 2 * o) / (gbs * 1e9) * 1e3) if gbs else 0.0 for p, g, o in zip(params, grads, opts)]
        inputs, weights = zip(*(_split(layer, t) for layer, t in zip(layers, backward)))
        input_ms, weight_ms, backward_ms = stage_sum(inputs), stage_sum(weights), stage_sum(backward)
        # the first stage's input needs no gradient: a split backward there is all weight gradient
        input_ms[0], weight_ms[0] = 0.0, backward_ms[0]
        return cls(forward_ms=tuple(stage_sum(forward)), backward_ms=tuple(backward_ms),
                   send_bytes=tuple(sends), param_bytes=tuple(params), grad_bytes=tuple(grads),
                   optimizer_bytes=tuple(opts), activation_bytes=tuple(saved), step_ms=tuple(steps),
                   microbatch_size=b, input_grad_ms=tuple(input_ms), weight_grad_ms=tuple(weight_ms))


def _split(layer: LayerCost, backward_ms: float) -> tuple[float, float]:
    """A layer's I and W at the micro-batch: the profile's, scaled as its fused backward was to ``backward_ms``
    (a measured split keeps what splitting costs beyond the fused backward; an unmeasured one sums to it)."""
    i, w = layer.split_backward_ms
    if layer.backward_ms <= 0:
        return (backward_ms, 0.0) if i + w <= 0 else (i, w)
    factor = backward_ms / layer.backward_ms
    return i * factor, w * factor
