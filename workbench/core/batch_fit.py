"""A layer's time as a function of its batch: the fit a profile at several batch sizes gives.

Problem. A profile at one batch size ``B`` says what a layer costs at ``B``;
a plan runs micro-batches of other sizes. Scaling linearly (``t * b / B``)
is wrong both ways: a layer bound by reading its weights (a large fully
connected layer) costs nearly as much for one sample as for eight, and a
CPU's per-sample cost keeps falling as the batch grows (on this machine
``vgg-tiny`` with 4096-wide layers took 18.4 ms a sample at 8 and 4.3 at 64).

Approach. Profiles at a few sizes (``sizes``, ascending) give each layer's
forward and backward time at each; between two sizes the time is the
straight line through them (piecewise-linear interpolation, "knots" at the
sizes). Beyond the ends the end segment's line continues, never below the
time at the largest size (above it) nor below the smallest size's time
scaled to the batch (below it), and never below 0. One size alone is the
linear scaling of a single profile. Piecewise-linear was chosen over one
``a + b * batch`` line per layer by measurement (``bench/RESULTS.md``,
"Predictions that follow the micro-batch size"): a layer's time is flat
while it is bound by its weights and grows with the batch once its
arithmetic dominates, a bend one line through sizes 1 and 64 missed by
11-21% at 2-16 samples, while the segments between sizes 1, 4, 16 and 64
missed the sizes between them by 8-13%, less than one size's own spread
between rounds (up to 17%).

JSON (``ModelCosts``'s ``batch_fit``, file version 3)::

    {"kind": "piecewise-linear", "source": "measured", "sizes": [1, 4, 16, 64],
     "forward_ms": [[0.3, 1.0, 2.5, 14.6], ...], "backward_ms": [[0.3, 0.7, 1.1, 8.6], ...]}

one row per layer, one value per size. ``source``: ``measured`` (profiles
at each size), or ``roofline`` (projected onto another device, each size's
FLOPs and bytes by the roofline: :func:`workbench.profiling.projection.project`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import Any, Sequence

from .fields import check, check_choice, check_int, field_error, integer, number, reject_unknown, tuple_of

__all__ = ["BatchFit", "FIT_KINDS", "FIT_SOURCES", "FIT_RATIO", "FIT_CAP", "interpolate", "check_fit", "rebase",
           "fit_sizes", "fit_profiles"]

FIT_KINDS = ("piecewise-linear",)
FIT_SOURCES = ("measured", "roofline")
_SIZE = integer(1, expected="an int >= 1")
_TIMES = tuple_of(number(0, finite=True), expected="a list of finite numbers >= 0")
fit_error = field_error("costs")
FIT_RATIO = 4  # consecutive profiled sizes at most this factor apart
FIT_CAP = 64  # the largest size profiled by default (above it the last segment's line continues)


def interpolate(sizes: Sequence[int], values: Sequence[float], batch: float) -> float:
    """The piecewise-linear function through ``(sizes[i], values[i])`` at ``batch`` (see the module docstring)."""
    if len(sizes) == 1:
        return values[0] * batch / sizes[0]
    lo = min(max(bisect_right(sizes, batch) - 1, 0), len(sizes) - 2)
    x0, x1, y0, y1 = sizes[lo], sizes[lo + 1], values[lo], values[lo + 1]
    y = y0 + (y1 - y0) * (batch - x0) / (x1 - x0)
    if batch < sizes[0]:
        y = max(y, values[0] * batch / sizes[0])
    elif batch > sizes[-1]:
        y = max(y, values[-1])
    return max(0.0, y)


@dataclass(frozen=True)
class BatchFit:
    """Every layer's forward and backward time (ms) at each profiled batch size, interpolated between them."""

    sizes: tuple[int, ...]
    forward_ms: tuple[tuple[float, ...], ...]
    backward_ms: tuple[tuple[float, ...], ...]
    source: str = "measured"
    kind: str = "piecewise-linear"

    def __post_init__(self) -> None:
        sizes = check("batch_fit.sizes", self.sizes, tuple_of(_SIZE, expected="a list of ints >= 1"), fit_error)
        if not sizes or list(sizes) != sorted(set(sizes)):
            raise fit_error("batch_fit.sizes", list(sizes), "distinct batch sizes in ascending order, at least one")
        object.__setattr__(self, "sizes", sizes)
        check_choice("batch_fit.kind", self.kind, FIT_KINDS, error=fit_error)
        check_choice("batch_fit.source", self.source, FIT_SOURCES, error=fit_error)
        for name in ("forward_ms", "backward_ms"):
            rows = check(f"batch_fit.{name}", getattr(self, name), tuple_of(expected="a list of rows, one per layer"),
                         fit_error)
            rows = tuple(check(f"batch_fit.{name}[{i}]", row, _TIMES, fit_error) for i, row in enumerate(rows))
            for i, row in enumerate(rows):
                if len(row) != len(sizes):
                    raise fit_error(f"batch_fit.{name}[{i}]", list(row), f"one time per size ({len(sizes)})")
            object.__setattr__(self, name, rows)
        if len(self.forward_ms) != len(self.backward_ms):
            raise ValueError(f"batch_fit has {len(self.forward_ms)} forward rows but {len(self.backward_ms)} "
                             f"backward rows; give one of each per layer")

    @property
    def num_layers(self) -> int:
        return len(self.forward_ms)

    def layer_ms(self, index: int, batch: float) -> tuple[float, float]:
        """Layer ``index``'s forward and backward time for a batch of ``batch`` samples."""
        return (interpolate(self.sizes, self.forward_ms[index], batch),
                interpolate(self.sizes, self.backward_ms[index], batch))

    def times_ms(self, batch: float) -> tuple[list[float], list[float]]:
        """Every layer's forward and backward time for a batch of ``batch`` samples."""
        pairs = [self.layer_ms(i, batch) for i in range(self.num_layers)]
        return [f for f, _ in pairs], [b for _, b in pairs]

    def scaled(self, k: float) -> "BatchFit":
        """Every time times ``k``."""
        return BatchFit(self.sizes, tuple(tuple(t * k for t in row) for row in self.forward_ms),
                        tuple(tuple(t * k for t in row) for row in self.backward_ms), self.source, self.kind)

    def describe(self) -> str:
        return (f"per-layer times at batch sizes {', '.join(map(str, self.sizes))} ({self.source}), "
                f"piecewise-linear between them")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": self.source, "sizes": list(self.sizes),
                "forward_ms": [list(row) for row in self.forward_ms],
                "backward_ms": [list(row) for row in self.backward_ms]}

    @classmethod
    def from_dict(cls, data: Any) -> "BatchFit":
        if not isinstance(data, dict):
            raise ValueError(f"ModelCosts 'batch_fit' must be a JSON object, got {type(data).__name__}")
        reject_unknown(data, ("kind", "source", "sizes", "forward_ms", "backward_ms"), "batch_fit.", fit_error)
        missing = [k for k in ("sizes", "forward_ms", "backward_ms") if k not in data]
        if missing:
            raise ValueError(f"ModelCosts 'batch_fit' is missing required fields {missing}")
        return cls(**data)


def check_fit(fit: BatchFit, layers: Sequence[Any], batch_size: int) -> None:
    """Refuse a fit that lacks a row per layer, or does not pass through the layers' own times at
    ``batch_size`` (one of its sizes): the layers are the profile at that size."""
    if not isinstance(fit, BatchFit):
        raise ValueError(f"ModelCosts.batch_fit must be a BatchFit or None, got {type(fit).__name__}")
    if fit.num_layers != len(layers) or batch_size not in fit.sizes:
        raise ValueError(f"ModelCosts.batch_fit must have a row for each of the {len(layers)} layers and the "
                         f"profile's batch size {batch_size} among its sizes, got {fit.num_layers} rows at sizes "
                         f"{list(fit.sizes)}")
    for i, layer in enumerate(layers):
        fitted = fit.layer_ms(i, batch_size)
        if any(abs(a - b) > 1e-6 * max(1.0, abs(b)) for a, b in zip(fitted, (layer.forward_ms, layer.backward_ms))):
            raise ValueError(f"ModelCosts.batch_fit gives layer {layer.name!r} {fitted[0]:g} + {fitted[1]:g} ms at "
                             f"batch {batch_size} but the layer says {layer.forward_ms:g} + {layer.backward_ms:g} ms; "
                             f"change both together, or drop the fit")


def _scaled_counts(values: list, r: float) -> list:
    """Per-layer counts (ints, or lists of ints) times ``r``."""
    return [_scaled_counts(v, r) if isinstance(v, list) else round(v * r) for v in values]


def rebase(costs: Any, batch: int) -> Any:
    """A ``ModelCosts`` as if profiled at ``batch`` samples: every layer's times from its fit there (without
    one, scaled linearly), the measured split backward scaled as its fused backward, and the batch-proportional
    counts (FLOPs, output, saved and input bytes) scaled; the result has no fit (it is linear around ``batch``,
    exact at it). What the planner charges a plan's micro-batches with."""
    check_int("batch", batch, 1)
    if batch == costs.batch_size and costs.batch_fit is None:
        return costs
    r = batch / costs.batch_size
    fit = costs.batch_fit
    times = fit.times_ms(batch) if fit is not None else ([l.forward_ms * r for l in costs.layers],
                                                         [l.backward_ms * r for l in costs.layers])
    layers = []
    for layer, forward, backward in zip(costs.layers, *times):
        k = backward / layer.backward_ms if layer.backward_ms > 0 else r
        split = {n: getattr(layer, n) * k for n in ("input_grad_ms", "weight_grad_ms") if getattr(layer, n) is not None}
        layers.append(replace(layer, forward_ms=forward, backward_ms=backward, flops=round(layer.flops * r),
                              activation_bytes=round(layer.activation_bytes * r),
                              saved_bytes=round(layer.saved_bytes * r), **split))
    meta = {**costs.meta, "rebased_from": costs.batch_size}
    for key in ("backward_flops", "winograd_flops"):
        if isinstance(meta.get(key), list):
            meta[key] = _scaled_counts(meta[key], r)
    return replace(costs, batch_size=batch, layers=tuple(layers), input_bytes=round(costs.input_bytes * r),
                   meta=meta, batch_fit=None)


def fit_sizes(smallest: int, largest: int, *, ratio: int = FIT_RATIO, cap: int = FIT_CAP) -> list[int]:
    """The batch sizes to profile for micro-batches from ``smallest`` to ``largest`` samples: both ends (the
    largest no more than ``cap``) and sizes ``ratio`` times apart between them (1 to 64: 1, 4, 16, 64)."""
    check_int("smallest", smallest, 1)
    check_int("largest", largest, 1)
    check_int("ratio", ratio, 2)
    check_int("cap", cap, 1)
    largest = min(largest, cap)
    smallest = min(smallest, largest)
    sizes = [smallest]
    while sizes[-1] * ratio < largest:
        sizes.append(sizes[-1] * ratio)
    return sizes + ([largest] if largest != sizes[-1] else [])


def _knots(values: Sequence[float]) -> tuple[float, ...]:
    """Times at ascending batch sizes made non-decreasing (more samples never take less time, so a dip is
    noise): the closest non-decreasing sequence in least squares (pool adjacent violators), so one slow
    outlier is averaged with its neighbours rather than carried up to every larger size."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return tuple(m for m, n in blocks for _ in range(int(n)))


def fit_profiles(profiles: Sequence[Any], primary: int | None = None) -> Any:
    """One ``ModelCosts`` with a :class:`BatchFit` from profiles of one model at several batch sizes.

    The result is the profile at ``primary`` (default: the largest size), its layers' times replaced by the
    fit's knots there (each layer's times over the sizes made non-decreasing by least squares; a measured split backward
    scaled with its fused backward), and ``meta["batch_profiles"]`` saying what each size's profile took.
    """
    by_size = {p.batch_size: p for p in profiles}
    if len(by_size) != len(profiles) or not profiles:
        raise ValueError(f"fit_profiles needs profiles at distinct batch sizes, got "
                         f"{[p.batch_size for p in profiles]}")
    sizes = sorted(by_size)
    primary = sizes[-1] if primary is None else primary
    if primary not in by_size:
        raise ValueError(f"primary batch {primary} is not among the profiled sizes {sizes}")
    base = by_size[primary]
    for p in profiles:
        if [l.name for l in p.layers] != [l.name for l in base.layers] or p.model != base.model:
            raise ValueError(f"fit_profiles needs profiles of one model with the same layers; {p.model} at "
                             f"{p.batch_size} differs from {base.model} at {base.batch_size}")
    forward = tuple(_knots([by_size[b].layers[i].forward_ms for b in sizes]) for i in range(len(base.layers)))
    backward = tuple(_knots([by_size[b].layers[i].backward_ms for b in sizes]) for i in range(len(base.layers)))
    fit = BatchFit(tuple(sizes), forward, backward)
    at = sizes.index(primary)
    layers = []
    for layer, f, b in zip(base.layers, forward, backward):
        k = b[at] / layer.backward_ms if layer.backward_ms > 0 else 1.0
        split = {n: getattr(layer, n) * k for n in ("input_grad_ms", "weight_grad_ms") if getattr(layer, n) is not None}
        layers.append(replace(layer, forward_ms=f[at], backward_ms=b[at], **split))
    taken = {str(b): {k: by_size[b].meta.get(k) for k in ("profile_wall_s", "cache")} for b in sizes}
    return replace(base, layers=tuple(layers), batch_fit=fit, meta={**base.meta, "batch_profiles": taken})
