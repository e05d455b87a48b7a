"""Runtime calibration: scale a profile's compute to what the runtime's ranks measured.

Problem. A profile times each layer alone in one process, with its weights
hot in cache and nothing else on the cores. The ranks of a real run do the
same arithmetic inside the runtime, with the interpreter, the event writer
and the sends around every micro-batch, among other processes on the same
cores. On this machine, at micro-batches of 2-4, the runtime's ranks took
1.2-1.75x the profile's time even when no other rank computed (one rank
alone with the whole batch matched the profile), so the planner timed
every such strategy at about 0.6 of its measured time.

Approach (one measured run, compared op by op). Launch one short run (a
pipeline over every rank is best: its forward and backward events are pure
compute, where a data-parallel backward also holds the gradient all-reduce;
tensor-parallel events hold collectives and are refused). Read its measured
stage events after ``warmup`` iterations, turn each forward / backward
duration back into its solo time with the cluster's processor sharing
(:func:`~workbench.scheduling.sharing.solo_durations`, the same model the
planner then applies forward), and set them against what the profile
predicts for the same stage and micro-batch
(:meth:`~workbench.scheduling.stagecosts.StageCosts.from_model`).
``compute_scale`` is the ratio of the two sums; :meth:`RuntimeCalibration.
apply` multiplies every layer's forward and backward time by it. The other
costs (links, collective calls, overlap, memory) keep their own
calibrations. Use :func:`calibrate_from_run` on a finished run directory
and pass ``plan(..., calibration=...)`` (CLI: ``workbench plan ...
--calibrate RUN_DIR``).

Runtimes differ in what they add around the same arithmetic: the
asynchronous pipeline binds a stashed weight version to every forward
(``functional_call`` over the stage's parameters, saved-tensor
accounting) and adds each micro-batch's weight gradients to the live ones,
which on this machine made its events 1.2-1.45x a scheduled pipeline's at
the same micro-batch. So a calibration belongs to a runtime family
(:func:`runtime_family`: ``async``, or ``scheduled`` for the data-parallel
and scheduled-pipeline runtimes), and ``plan`` takes runs of either
family: each strategy is scaled by its own family's model, or by the other
family's when only one family was calibrated.

The tensor-parallel runtimes are families of their own (``tensor2d``,
``tensor1d``): a 2D grid runs every linear layer as q SUMMA steps of block
products, splits and copies around its collectives, on this machine about
3x the profile's time for the same arithmetic. Their forward and backward
events hold the collectives, so a tensor run is calibrated against the
planner's whole step: the measured forward + backward time less the
communication the planner charges for it (links and collective steps, the
cluster's own calibration), over the compute the profile predicts
(:func:`calibrate_tensor_from_timeline`). A run of another batch size
than the one planned (the same grid) keeps this from being circular; two
batch sizes fit the per-call cost below (``b`` is the replica's batch).

The runtime's extra work comes with every micro-batch, not with every
sample: on this machine the ratio was about 1.2 at micro-batches of 16
samples, 1.3 at 4, 1.5 at 2 and 2.0 at 1. So a family's runs at two or more
micro-batch sizes fit ``factor(b) = k + c / b`` (:class:`ComputeModel`;
``c`` is the runtime's per-micro-batch work in samples' worth of the
profile's compute, least squares over the runs, ``c >= 0``); one run, or
runs at one size, give the constant factor ``k``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..core.config import RunConfig
from ..core.costs import ClusterSpec, ModelCosts
from ..core.partition import Partition
from ..core.rundir import load_measured_timeline, read_events
from ..core.timeline import Timeline
from ..scheduling.sharing import solo_durations
from ..scheduling.stagecosts import StageCosts
from .clusters import core_sharing, load_cluster
from .space import Strategy

__all__ = ["RuntimeCalibration", "ComputeModel", "calibrate_from_run", "calibrate_from_timeline",
           "calibrate_tensor_from_timeline", "CALIBRATION_STRATEGIES", "runtime_family", "compute_models",
           "scale_compute"]

# Strategies whose forward / backward events are compute only (plus DDP, whose backward holds its all-reduce).
PIPELINE_STRATEGIES = ("gpipe", "1f1b", "interleaved", "gropipe", "async", "ddp")
# Tensor-parallel runtimes: calibrated against the planner's whole step, less the communication it charges.
TENSOR_STRATEGIES = ("tensor2d", "tensor1d")
CALIBRATION_STRATEGIES = PIPELINE_STRATEGIES + TENSOR_STRATEGIES
_LIMITS = (0.05, 20.0)  # a scale outside this is a wrong profile (another model, batch or device), not a calibration


def scale_compute(costs: ModelCosts, k: float) -> ModelCosts:
    """``costs`` with every layer's forward and backward time multiplied by ``k``."""
    if k == 1.0:
        return costs
    return replace(costs, layers=tuple(replace(l, forward_ms=l.forward_ms * k, backward_ms=l.backward_ms * k)
                                       for l in costs.layers))


def runtime_family(name: str) -> str:
    """The runtime family of a run's strategy (``async``, ``tensor2d``, ``ddp``, ``1f1b``, ...) or a planner kind
    (``async``, ``tp2d``, ``dp``, ...): ``async``, ``tensor2d``, ``tensor1d`` or ``scheduled``."""
    return {"async": "async", "tensor2d": "tensor2d", "tp2d": "tensor2d", "tensor1d": "tensor1d",
            "tp1d": "tensor1d"}.get(name, "scheduled")


@dataclass(frozen=True)
class RuntimeCalibration:
    """How much longer the runtime's ranks computed than the profile predicts (solo time over profile time)."""

    compute_scale: float
    events: int
    measured_ms: float
    predicted_ms: float
    source: str = ""
    strategy: str = ""
    runtime: str = ""  # the run's runtime (RunConfig.strategy); empty: a scheduled one
    microbatch_size: int = 0  # samples per forward event of the run (0: not recorded)

    @property
    def family(self) -> str:
        return runtime_family(self.runtime)

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

    def factor(self, microbatch: int) -> float:
        return self.k + self.c / max(1, microbatch)

    def describe(self) -> str:
        if self.c == 0.0:
            return f"{self.family} runtimes' compute x{self.k:.3f} the profile ({self.runs} run(s))"
        return (f"{self.family} runtimes' compute x({self.k:.3f} + {self.c:.3f} / micro-batch) the profile "
                f"({self.runs} runs at micro-batches of {', '.join(map(str, self.sizes))})")


def _fit(family: str, cals: "list[RuntimeCalibration]") -> ComputeModel:
    """Least squares of ``scale = k + c / b`` over the family's runs; a constant when that is all they allow."""
    sizes = [c.microbatch_size for c in cals]
    scales = [c.compute_scale for c in cals]
    mean = sum(scales) / len(scales)
    known = sorted({b for b in sizes if b > 0})
    if len(known) < 2 or any(b <= 0 for b in sizes):
        return ComputeModel(family, mean, 0.0, len(cals), tuple(known))
    x = [1.0 / b for b in sizes]
    mx = sum(x) / len(x)
    c = sum((xi - mx) * (yi - mean) for xi, yi in zip(x, scales)) / sum((xi - mx) ** 2 for xi in x)
    k = mean - c * mx
    lo, _ = _LIMITS
    if c < 0 or k < lo:  # the runs do not show a per-micro-batch cost (noise): keep the mean
        return ComputeModel(family, mean, 0.0, len(cals), tuple(known))
    return ComputeModel(family, k, c, len(cals), tuple(known))


def compute_models(calibrations: "list[RuntimeCalibration]") -> dict[str, ComputeModel]:
    """One :class:`ComputeModel` per runtime family with runs among those given (the planner scales a family
    without one by the other family's model)."""
    if not calibrations:
        raise ValueError("no calibration given")
    by_family: dict[str, list[RuntimeCalibration]] = {}
    for cal in calibrations:
        by_family.setdefault(cal.family, []).append(cal)
    return {family: _fit(family, cals) for family, cals in by_family.items()}


def calibrate_from_timeline(costs: ModelCosts, timeline: Timeline, partition: Partition, microbatch_size: int, *,
                            cluster: str | Path | ClusterSpec = "local", background_load: float = 0.0,
                            warmup: int = 2, source: str = "", strategy: str = "",
                            runtime: str = "") -> RuntimeCalibration:
    """The calibration from measured stage events (see the module docstring).

    ``partition``: the run's layers per stage; ``microbatch_size``: samples
    per forward event; events of iterations before ``warmup`` are skipped.
    """
    if isinstance(microbatch_size, bool) or not isinstance(microbatch_size, int) or microbatch_size < 1:
        raise ValueError(f"microbatch_size must be an int >= 1, got {microbatch_size!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    spec, _ = load_cluster(cluster)
    events = [e for e in timeline if e.iteration >= warmup]
    sharing = core_sharing(spec, background_load)
    solo = solo_durations(events, sharing) if sharing is not None else {}
    predicted = StageCosts.from_model(costs, partition, microbatch_size)
    measured_ms = predicted_ms = 0.0
    count = 0
    for i, e in enumerate(events):
        if e.op not in ("F", "B") or e.end <= e.start:
            continue
        if e.stage >= partition.num_stages:
            raise ValueError(f"the run has events of stage {e.stage} but the partition {partition} has "
                             f"{partition.num_stages} stages")
        measured_ms += solo.get(i, e.end - e.start)
        predicted_ms += (predicted.forward_ms if e.op == "F" else predicted.backward_ms)[e.stage]
        count += 1
    if count == 0:
        raise ValueError(f"no forward/backward events from iteration {warmup} on to calibrate from; run more steps "
                         f"(the run needs stage events: events.stage_events = true)")
    if predicted_ms <= 0:
        raise ValueError("the profile predicts no compute time for this run's stages")
    return RuntimeCalibration(measured_ms / predicted_ms, count, measured_ms, predicted_ms, source, strategy, runtime,
                              microbatch_size)


def calibrate_tensor_from_timeline(costs: ModelCosts, timeline: Timeline, strategy: str, global_batch: int,
                                   shape: Any, *, cluster: str | Path | ClusterSpec = "local",
                                   background_load: float = 0.0, warmup: int = 2, source: str = "",
                                   runtime: str = "") -> RuntimeCalibration:
    """The calibration of a tensor-parallel runtime from a measured run of ``strategy`` (``tp2d-2x2-dp1``, ...).

    Per iteration from ``warmup`` on, the ranks' mean forward + backward time
    (the median over iterations) less the step communication the planner
    charges for this strategy on ``cluster`` is the measured compute; the
    planner's uncalibrated compute (the profile, at the ranks' processor
    sharing) is the predicted one. ``shape``: the transformer's
    :class:`~.tensor_costs.TransformerShape`.
    """
    from .search import plan  # search imports this module

    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if shape is None:
        raise ValueError(f"calibrating {strategy!r} needs the transformer's shape (shape=TransformerShape(...))")
    steps: dict[int, dict[int, float]] = {}
    count = 0
    for e in timeline:
        if e.op in ("F", "B") and e.iteration >= warmup and e.end > e.start:
            ranks = steps.setdefault(e.iteration, {})
            ranks[e.rank] = ranks.get(e.rank, 0.0) + e.end - e.start
            count += 1
    if not steps:
        raise ValueError(f"no forward/backward events from iteration {warmup} on to calibrate from; run more steps")
    measured = statistics.median(sum(r.values()) / len(r) for r in steps.values())
    world = max(len(r) for r in steps.values())
    planned = plan(costs, cluster, global_batch, world_size=world, shape=shape, strategies=[strategy],
                   background_load=background_load)[strategy]
    est = planned.estimate
    comm = est.detail["step_comm_ms"]
    if measured <= comm:
        raise ValueError(f"{strategy}: the run's forward + backward took {measured:.1f} ms, less than the "
                         f"{comm:.1f} ms of communication the planner charges for it; calibrate the cluster's links "
                         f"(workbench.runtime.commbench) before the compute")
    replica_batch = global_batch // planned.strategy.dp
    return RuntimeCalibration((measured - comm) / est.compute_ms, count, measured - comm, est.compute_ms, source,
                              strategy, runtime, replica_batch)


def calibrate_from_run(costs: ModelCosts, run_dir: str | Path, *, cluster: str | Path | ClusterSpec = "local",
                       background_load: float = 0.0, warmup: int = 2, shape: Any = None) -> RuntimeCalibration:
    """The calibration from a finished run directory (its config, partition and measured stage events).

    ``costs`` must profile the run's model (batch size may differ: times scale
    to the run's micro-batch; a profile of another layer count is refused).
    ``background_load``: foreign runnable processes while the run ran.
    ``shape``: the transformer's shape, for a tensor-parallel run.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise ValueError(f"{str(run_dir)!r} is not a run directory (no config.json)")
    config = RunConfig.from_json(run_dir / "config.json")
    if config.strategy not in CALIBRATION_STRATEGIES:
        raise ValueError(f"cannot calibrate compute from a {config.strategy!r} run; use one of "
                         f"{', '.join(CALIBRATION_STRATEGIES)} (a pipeline is best)")
    if config.strategy in TENSOR_STRATEGIES:
        kind = "tp2d" if config.strategy == "tensor2d" else "tp1d"
        name = Strategy(kind, dp=config.groups, tp=config.tp).name
        return calibrate_tensor_from_timeline(costs, load_measured_timeline(run_dir), name, config.global_batch,
                                              shape, cluster=cluster, background_load=background_load, warmup=warmup,
                                              source=str(run_dir), runtime=config.strategy)
    starts = [r for r in read_events(run_dir, rank=0) if r["kind"] == "start"]
    text = starts[-1].get("partition") if starts else None
    if not text:
        raise ValueError(f"{str(run_dir)!r} recorded no partition in its start event")
    partition = Partition.parse(text, costs.num_layers)
    return calibrate_from_timeline(costs, load_measured_timeline(run_dir), partition, config.microbatch_size,
                                   cluster=cluster,
                                   background_load=background_load, warmup=warmup, source=str(run_dir),
                                   strategy=config.name or config.strategy, runtime=config.strategy)
