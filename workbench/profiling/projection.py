"""Project a measured profile onto hardware you do not have (roofline).

A profile taken here holds, per layer, FLOPs and the bytes a layer touches;
those do not depend on the device. On a target device a layer pass takes
``max(flops / (peak * efficiency), bytes / bandwidth)`` plus a small fixed
per-pass overhead (kernel launches): compute-bound convolutions and large
matmuls follow the first term, weight-bound fully connected layers at small
batch and element-wise layers the second. Bytes moved per pass:

* forward: parameters + input + output activation;
* backward: parameters (read) + gradients (written) + saved tensors +
  output gradient + input gradient.

Backward FLOPs come from the profile (``meta["backward_flops"]``) when
present, else 2x forward. The FLOPs of 3x3 stride-1 convolutions
(``meta["winograd_flops"]``) count ``DeviceSpec.winograd_reduction(dtype)``
times less on a device whose library runs them by Winograd (cuDNN in float32:
2.25x); a profile without that record is projected at the direct count.
A measured split backward (input gradient I, weight gradient W) is projected
by ratio, as the roofline counts no FLOPs or bytes for I and W apart: each is
the projected backward times its measured ratio to the measured backward, so
I + W keeps its ratio to the backward and I : W stays as measured.
When the target dtype differs from the profiled one, parameter, gradient and
activation bytes scale with the element size (optimizer state stays as
profiled: float32 master state).

``efficiency`` (fraction of peak a real layer reaches) defaults to the
device's; :func:`fit_efficiency` derives it from a profile measured on that
same device, which is how ``local-cpu`` projections are checked.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.batch_fit import BatchFit
from ..core.costs import DeviceSpec, LayerCost, ModelCosts
from ..core.fields import check_number
from .devices import get_device

__all__ = ["project", "fit_efficiency", "DTYPE_BYTES"]

DTYPE_BYTES = {"float64": 8, "float32": 4, "tfloat32": 4, "float16": 2, "bfloat16": 2, "float8": 1}


def _dtype_bytes(dtype: str, field_name: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"{field_name} must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


def _backward_flops(costs: ModelCosts) -> list[int]:
    recorded = costs.meta.get("backward_flops")
    if isinstance(recorded, list) and len(recorded) == len(costs.layers):
        return [int(f) for f in recorded]
    return [2 * layer.flops for layer in costs.layers]


def _effective_flops(costs: ModelCosts, spec: DeviceSpec, dtype: str) -> tuple[list[float], list[float]]:
    """Forward and backward FLOPs per layer as the device executes them (Winograd convolutions reduced)."""
    forward = [float(layer.flops) for layer in costs.layers]
    backward = [float(f) for f in _backward_flops(costs)]
    reduction = spec.winograd_reduction(dtype)
    recorded = costs.meta.get("winograd_flops")
    if reduction > 1 and isinstance(recorded, list) and len(recorded) == len(costs.layers):
        for i, (w_forward, w_backward) in enumerate(recorded):
            forward[i] -= w_forward * (1 - 1 / reduction)
            backward[i] -= w_backward * (1 - 1 / reduction)
    return forward, backward


def _split_backward(layer: LayerCost, backward_ms: float) -> dict[str, float]:
    """The measured I and W of ``layer`` projected with its backward (none when it has no measured split).

    The roofline has no FLOP or byte count for I and W apart, so each keeps its measured ratio to the measured
    fused backward: scaling both by the same factor as the backward keeps I + W in its measured ratio to the
    backward (above 1 where W walks a block's graph again) and I : W as measured.
    """
    if layer.input_grad_ms is None or layer.weight_grad_ms is None:
        return {}
    measured_i, measured_w = layer.input_grad_ms, layer.weight_grad_ms
    if layer.backward_ms > 0:
        scale = backward_ms / layer.backward_ms
        projected_i, projected_w = measured_i * scale, measured_w * scale
    elif measured_i + measured_w > 0:  # a backward timed at 0 (below the clock's resolution): split by I : W
        projected_i = backward_ms * measured_i / (measured_i + measured_w)
        projected_w = backward_ms - projected_i
    else:
        projected_i = projected_w = 0.0
    return {"input_grad_ms": projected_i, "weight_grad_ms": projected_w,
            "input_grad_ms_spread": 0.0, "weight_grad_ms_spread": 0.0}


def _pass_bytes(costs: ModelCosts) -> tuple[list[int], list[int]]:
    forward, backward = [], []
    input_bytes = costs.input_bytes
    for layer in costs.layers:
        forward.append(layer.param_bytes + input_bytes + layer.activation_bytes)
        backward.append(layer.param_bytes + (layer.grad_bytes or 0) + layer.saved_bytes
                        + layer.activation_bytes + input_bytes)
        input_bytes = layer.activation_bytes
    return forward, backward


def _roofline(costs: ModelCosts, spec: DeviceSpec, dtype: str, efficiency: float, overhead_us: float,
              r: float = 1.0) -> tuple[list[tuple[float, float]], list[str]]:
    """Every layer's projected (forward, backward) ms for ``r`` times the profile's samples, and what bounds
    each (``compute`` or ``memory``): FLOPs and batch-proportional bytes scale with ``r``, weights do not."""
    peak = spec.tflops(dtype) * 1e12  # FLOP/s
    scale = _dtype_bytes(dtype, "dtype") / _dtype_bytes(costs.dtype, "costs.dtype")
    bandwidth = spec.memory_bandwidth_gbs * 1e9  # bytes/s
    weights_f = [layer.param_bytes for layer in costs.layers]
    weights_b = [layer.param_bytes + (layer.grad_bytes or 0) for layer in costs.layers]
    times, bounds = [], []
    for layer, flops_f, flops_b, bytes_f, bytes_b, fixed_f, fixed_b in zip(
            costs.layers, *_effective_flops(costs, spec, dtype), *_pass_bytes(costs), weights_f, weights_b):
        pair = []
        for flops, nbytes, fixed in ((flops_f, bytes_f, fixed_f), (flops_b, bytes_b, fixed_b)):
            compute_s = flops * r / (peak * efficiency)
            memory_s = (fixed + (nbytes - fixed) * r) * scale / bandwidth
            pair.append(max(compute_s, memory_s) * 1e3 + overhead_us * 1e-3)
        times.append((pair[0], pair[1]))
        bounds.append("compute" if flops_f * r / (peak * efficiency)
                      >= (fixed_f + (bytes_f - fixed_f) * r) * scale / bandwidth else "memory")
    return times, bounds


def _projected_fit(costs: ModelCosts, spec: DeviceSpec, dtype: str, efficiency: float, overhead_us: float,
                   sizes: "list[int] | tuple[int, ...] | None") -> BatchFit | None:
    """The roofline at each of ``sizes`` (and the profile's own batch) as a fit; None without sizes."""
    if not sizes:
        return None
    sizes = sorted({*sizes, costs.batch_size})
    at = [_roofline(costs, spec, dtype, efficiency, overhead_us, b / costs.batch_size)[0] for b in sizes]
    return BatchFit(tuple(sizes), tuple(tuple(t[i][0] for t in at) for i in range(len(costs.layers))),
                    tuple(tuple(t[i][1] for t in at) for i in range(len(costs.layers))), source="roofline")


def project(costs: ModelCosts, device: DeviceSpec | str, *, dtype: str = "float32", efficiency: float | None = None,
            overhead_us: float = 10.0, sizes: "list[int] | tuple[int, ...] | None" = None) -> ModelCosts:
    """``costs`` as they would be on ``device`` (a DeviceSpec or a name in ``DEVICES``) in ``dtype``.

    ``sizes``: also project every layer at these batch sizes (default: those of the profile's own batch fit,
    where it has one), into the result's ``batch_fit`` (see the module docstring).
    """
    if not isinstance(costs, ModelCosts):
        raise ValueError(f"costs must be a ModelCosts, got {type(costs).__name__}")
    spec = get_device(device)
    efficiency = spec.efficiency if efficiency is None else efficiency
    check_number("efficiency", efficiency, 0, 1, strict=True, expected="in (0, 1]")
    if not isinstance(overhead_us, (int, float)) or overhead_us < 0:
        raise ValueError(f"overhead_us must be >= 0, got {overhead_us!r}")
    if costs.total("flops") == 0 and costs.total("param_bytes") + costs.total("activation_bytes") == 0:
        raise ValueError(f"costs of {costs.model!r} hold neither FLOPs nor bytes, so there is nothing to project; "
                         "profile the model with workbench.profiling.profile")
    scale = _dtype_bytes(dtype, "dtype") / _dtype_bytes(costs.dtype, "costs.dtype")
    times, bounds = _roofline(costs, spec, dtype, efficiency, overhead_us)
    layers = []
    for layer, (forward_ms, backward_ms) in zip(costs.layers, times):
        layers.append(replace(
            layer, forward_ms=forward_ms, backward_ms=backward_ms, forward_ms_spread=0.0, backward_ms_spread=0.0,
            **_split_backward(layer, backward_ms),
            param_bytes=int(layer.param_bytes * scale), grad_bytes=int((layer.grad_bytes or 0) * scale),
            activation_bytes=int(layer.activation_bytes * scale), saved_bytes=int(layer.saved_bytes * scale),
            peak_bytes=int(layer.peak_bytes * scale)))
    fit = _projected_fit(costs, spec, dtype, efficiency, overhead_us,
                         sizes if sizes is not None else (costs.batch_fit.sizes if costs.batch_fit else None))
    meta = {**costs.meta, "projected_from": costs.device, "cache": None,
            "projection": {"dtype": dtype, "efficiency": efficiency, "overhead_us": overhead_us,
                           "peak_tflops": spec.tflops(dtype), "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
                           "winograd_reduction": spec.winograd_reduction(dtype),
                           "bound": bounds}}
    return replace(costs, device=spec.name, dtype=dtype, layers=tuple(layers),
                   input_bytes=int(costs.input_bytes * scale), meta=meta, batch_fit=fit)


def fit_efficiency(measured: ModelCosts, device: DeviceSpec | str, *, dtype: str = "float32") -> float:
    """The efficiency at which the roofline reproduces ``measured`` total compute time on ``device``.

    Uses the compute-bound layers only (memory-bound ones do not depend on it).
    """
    spec = get_device(device)
    peak = spec.tflops(dtype) * 1e12
    bandwidth = spec.memory_bandwidth_gbs * 1e9
    forward_bytes, backward_bytes = _pass_bytes(measured)
    flops_total, seconds_total = 0, 0.0
    for layer, flops_f, flops_b, bytes_f, bytes_b in zip(measured.layers, *_effective_flops(measured, spec, dtype),
                                                          forward_bytes, backward_bytes):
        flops = flops_f + flops_b
        if flops / peak > (bytes_f + bytes_b) / bandwidth:
            flops_total += flops
            seconds_total += layer.compute_ms * 1e-3
    if flops_total == 0 or seconds_total == 0:
        raise ValueError(f"{measured.model!r} has no compute-bound layer with a measured time on {spec.name}")
    return min(1.0, flops_total / (peak * seconds_total))

