"""The values a runtime calibration produces: per-family compute factors the planner scales a profile by.

:mod:`.run_calibration` measures them from runs (see its docstring for the
method and what was measured); this module holds what the estimator needs
to apply them (:class:`RuntimeCalibration`, :class:`ComputeModel`,
:func:`runtime_family`, :func:`scale_compute`), so the estimator does not
depend on the measuring code, which itself plans the step it measures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...core.costs import ModelCosts
from ...core.plan import ParallelPlan

__all__ = ["RuntimeCalibration", "ComputeModel", "RUNTIME_FAMILIES", "runtime_family", "compute_models",
           "scale_compute", "fit_factor", "profiled_compute_models"]

# The runtime families a run calibrates: scheduled pipelines and DDP (forward / backward events are compute
# only, or DDP's backward with its all-reduce), the asynchronous pipeline, and the tensor-parallel runtimes
# (calibrated against the planner's whole step, less the communication it charges).
RUNTIME_FAMILIES = ("scheduled", "async", "tensor2d", "tensor1d")
_LIMITS = (0.05, 20.0)  # a scale outside this is a wrong profile (another model, batch or device), not a calibration


def scale_compute(costs: ModelCosts, k: float) -> ModelCosts:
    """``costs`` with every layer's forward and backward time (and its input and weight gradients', and its
    fit's at every batch size) times ``k``."""
    if k == 1.0:
        return costs

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * k

    fit = costs.batch_fit.scaled(k) if costs.batch_fit is not None else None
    return replace(costs, layers=tuple(replace(l, forward_ms=l.forward_ms * k, backward_ms=l.backward_ms * k,
                                               input_grad_ms=scaled(l.input_grad_ms),
                                               weight_grad_ms=scaled(l.weight_grad_ms)) for l in costs.layers),
                   batch_fit=fit)


def runtime_family(plan: ParallelPlan) -> str | None:
    """The runtime family whose compute calibration a plan uses: ``async``, ``tensor2d``, ``tensor1d`` or
    ``scheduled`` (the interpreter's pipelines and DDP); None for torch's own pipelining, which is not calibrated."""
    if plan.pipeline.runtime == "torch":
        return None
    if plan.iterates_across_steps:
        return "async"
    return {"2d": "tensor2d", "1d": "tensor1d"}.get(plan.tp_kind, "scheduled")


@dataclass(frozen=True)
class RuntimeCalibration:
    """How much longer the runtime's ranks computed than the profile predicts (solo time over profile time)."""

    compute_scale: float
    events: int
    measured_ms: float
    predicted_ms: float
    source: str = ""
    strategy: str = ""
    runtime: str = "scheduled"  # the run's runtime family (runtime_family)
    microbatch_size: int = 0  # samples per forward event of the run (0: not recorded)

    @property
    def family(self) -> str:
        return self.runtime if self.runtime in RUNTIME_FAMILIES else "scheduled"

    def __post_init__(self) -> None:
        lo, hi = _LIMITS
        if not (isinstance(self.compute_scale, (int, float)) and lo <= self.compute_scale <= hi):
            raise ValueError(f"compute_scale {self.compute_scale!r} is outside [{lo}, {hi}]: the profile does not "
                             f"describe this run (another model, batch size or device?)")

    def apply(self, costs: ModelCosts) -> ModelCosts:
        """``costs`` with every layer's forward and backward time multiplied by ``compute_scale``."""
        scaled = scale_compute(costs, self.compute_scale)
        return replace(scaled, meta={**costs.meta, "runtime_calibration": self.to_dict()})

    def to_dict(self) -> dict[str, Any]:
        return {"compute_scale": self.compute_scale, "events": self.events, "measured_ms": self.measured_ms,
                "predicted_ms": self.predicted_ms, "source": self.source, "strategy": self.strategy,
                "runtime": self.runtime, "microbatch_size": self.microbatch_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RuntimeCalibration":
        return cls(**data)


@dataclass(frozen=True)
class ComputeModel:
    """A runtime family's compute against the profile: ``factor(b) = k + c / b`` at micro-batches of ``b``."""

    family: str
    k: float
    c: float = 0.0
    runs: int = 1
    sizes: tuple[int, ...] = ()
    source: str = ""  # "" for runs; what measured it otherwise (the profile's own micro-batch passes)

    def factor(self, microbatch: int) -> float:
        return self.k + self.c / max(1, microbatch)

    def describe(self) -> str:
        if self.source:
            return (f"{self.family} runtimes' compute x({self.k:.3f} + {self.c:.3f} / micro-batch) the profile, "
                    f"from the profile's own {self.source} passes at micro-batches of "
                    f"{', '.join(map(str, self.sizes))}")
        if self.c == 0.0:
            return f"{self.family} runtimes' compute x{self.k:.3f} the profile ({self.runs} run(s))"
        return (f"{self.family} runtimes' compute x({self.k:.3f} + {self.c:.3f} / micro-batch) the profile "
                f"({self.runs} runs at micro-batches of {', '.join(map(str, self.sizes))})")


def fit_factor(sizes: "list[int]", factors: "list[float]") -> tuple[float, float]:
    """Least squares of ``factor = k + c / b`` over points at micro-batches ``sizes``; ``(mean, 0)`` where the
    points do not show a per-micro-batch cost (one size, or a fit with ``c < 0`` or ``k`` out of range)."""
    mean = sum(factors) / len(factors)
    if len(set(sizes)) < 2 or any(b <= 0 for b in sizes):
        return mean, 0.0
    x = [1.0 / b for b in sizes]
    mx = sum(x) / len(x)
    c = sum((xi - mx) * (yi - mean) for xi, yi in zip(x, factors)) / sum((xi - mx) ** 2 for xi in x)
    k = mean - c * mx
    if c < 0 or k < _LIMITS[0]:  # noise, not a per-micro-batch cost: keep the mean
        return mean, 0.0
    return k, c


def _fit(family: str, cals: "list[RuntimeCalibration]") -> ComputeModel:
    """Least squares of ``scale = k + c / b`` over the family's runs; a constant when that is all they allow."""
    sizes = [c.microbatch_size for c in cals]
    known = sorted({b for b in sizes if b > 0})
    k, c = fit_factor(sizes, [c.compute_scale for c in cals])
    return ComputeModel(family, k, c, len(cals), tuple(known))


def profiled_compute_models(costs: ModelCosts, ranks_per_node: int, cores: int | None,
                            background_load: float = 0.0) -> dict[str, ComputeModel]:
    """The compute model a profile measured itself (``meta["microbatch_factors"]``, see
    :mod:`workbench.profiling.profiler`), for the planner to use when no run calibrates it.

    The passes with the cache flushed where the node's ranks (and
    ``background_load``) outnumber its ``cores`` (each rank finds its cache
    evicted by the others between micro-batches), the hot passes otherwise;
    the asynchronous family also pays what binding weight copies cost (the
    bound passes over the hot ones, size by size). Only for ranks that
    time-share CPU cores (``cores`` not None), where the passes were timed;
    empty when the profile has no such measurement. A profile with a batch
    fit already charges each micro-batch size its own measured time, so the
    passes are set against the fit there (:func:`_against_fit`): what is left
    is what a pipeline rank adds beyond the per-layer profile at that size
    (the cache left cold, fresh buffers), not what small micro-batches cost.
    """
    measured = costs.meta.get("microbatch_factors")
    if not measured or cores is None:
        return {}
    mode = "cold" if ranks_per_node + background_load > cores else "hot"
    sizes = list(measured["sizes"])
    base = _against_fit(costs, measured, list(measured[mode]))
    models = {"scheduled": ComputeModel("scheduled", *fit_factor(sizes, base), 0, tuple(sizes),
                                        source=f"{mode}-cache")}
    if "bound" in measured:
        bound = [f * b / h for f, b, h in zip(base, measured["bound"], measured["hot"])]
        models["async"] = ComputeModel("async", *fit_factor(sizes, bound), 0, tuple(sizes),
                                       source=f"{mode}-cache, weight-binding")
    return models


def _against_fit(costs: ModelCosts, measured: dict[str, Any], factors: list[float]) -> list[float]:
    """The passes' factors (each: the batch in micro-batches of ``b``, over the profile of the whole batch) set
    against the profile's fit at ``b`` instead (unchanged without a fit)."""
    fit = costs.batch_fit
    if fit is None:
        return factors
    batch = int(measured.get("batch", costs.batch_size))
    profiled = float(measured.get("profiled_ms") or sum(sum(t) for t in fit.times_ms(batch)))
    out = []
    for b, factor in zip(measured["sizes"], factors):
        fitted = sum(sum(t) for t in fit.times_ms(b))  # one micro-batch of b samples
        out.append(factor * profiled * b / batch / fitted if fitted > 0 else factor)
    return out


def compute_models(calibrations: "list[RuntimeCalibration]") -> dict[str, ComputeModel]:
    """One :class:`ComputeModel` per runtime family with runs among those given (the planner scales a family
    without one by the other family's model)."""
    if not calibrations:
        raise ValueError("no calibration given")
    by_family: dict[str, list[RuntimeCalibration]] = {}
    for cal in calibrations:
        by_family.setdefault(cal.family, []).append(cal)
    return {family: _fit(family, cals) for family, cals in by_family.items()}
