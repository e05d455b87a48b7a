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
and pass ``SearchOptions(calibration=...)`` to ``plan`` (CLI: ``workbench plan ...
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
from pathlib import Path
from typing import Any, Callable

from ...core.config import RunConfig
from ...core.costs import ClusterSpec, ModelCosts
from ...core.fields import check_int
from ...core.partition import Partition
from ...core.plan import ParallelPlan
from ...core.rundir import load_measured_timeline, read_events
from ...core.timeline import Timeline
from ...scheduling.sharing import solo_durations
from ...scheduling.stagecosts import StageCosts
from .clusters import core_sharing, load_cluster
from .compute_scaling import RuntimeCalibration, runtime_family
from .estimate import cost_context, estimate

__all__ = ["calibrate_from_run", "calibrate_from_timeline", "calibrate_tensor_from_timeline", "fit_call_ms"]

def calibrate_from_timeline(costs: ModelCosts, timeline: Timeline, partition: Partition, microbatch_size: int, *,
                            cluster: str | Path | ClusterSpec = "local", background_load: float = 0.0,
                            warmup: int = 2, source: str = "", strategy: str = "",
                            runtime: str = "") -> RuntimeCalibration:
    """The calibration from measured stage events (see the module docstring).

    ``partition``: the run's layers per stage; ``microbatch_size``: samples
    per forward event; events of iterations before ``warmup`` are skipped.
    """
    check_int("microbatch_size", microbatch_size, 1)
    check_int("warmup", warmup, 0)
    spec = load_cluster(cluster)
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
    check_int("warmup", warmup, 0)
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
    spec = load_cluster(cluster)
    planned = ParallelPlan.parse(strategy)
    est = estimate(cost_context(costs, spec, global_batch, world_size=world, shape=shape,
                                background_load=background_load), planned)
    comm = est.detail["step_comm_ms"]
    if measured <= comm:
        raise ValueError(f"{strategy}: the run's forward + backward took {measured:.1f} ms, less than the "
                         f"{comm:.1f} ms of communication the planner charges for it; calibrate the cluster's links "
                         f"(workbench.runtime.commbench) before the compute")
    replica_batch = global_batch // planned.dp
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
    family = runtime_family(config.plan)
    if family is None:
        raise ValueError(f"cannot calibrate compute from a run of {config.plan.name!r} (torch's own pipelining); "
                         f"use a run of the workbench's pipelines, DDP or tensor parallelism (a pipeline is best)")
    if family in ("tensor2d", "tensor1d"):
        return calibrate_tensor_from_timeline(costs, load_measured_timeline(run_dir), config.plan.name,
                                              config.training.global_batch, shape, cluster=cluster,
                                              background_load=background_load, warmup=warmup, source=str(run_dir),
                                              runtime=family)
    starts = [r for r in read_events(run_dir, rank=0) if r["kind"] == "start"]
    text = starts[-1].get("partition") if starts else None
    if not text:
        raise ValueError(f"{str(run_dir)!r} recorded no partition in its start event")
    partition = Partition.parse(text, costs.num_layers)
    return calibrate_from_timeline(costs, load_measured_timeline(run_dir), partition, config.microbatch_size,
                                   cluster=cluster,
                                   background_load=background_load, warmup=warmup, source=str(run_dir),
                                   strategy=config.name or config.plan.name, runtime=family)


def fit_call_ms(predict: Callable[[float], float], measured_ms: float, *, upper_ms: float = 100.0,
                tolerance_ms: float = 1e-3) -> float:
    """The per-call cost of a runtime's collectives that makes ``predict`` match one measured run.

    ``predict(call_ms)``: the planner's iteration time for the measured run
    when every step of every collective costs ``call_ms`` on top of its link
    time (``ClusterSpec.collective_call_ms``); it never falls as ``call_ms``
    grows. Runtimes differ in what one collective costs them beyond its
    bytes: torch DDP issues a few bucketed all-reduces a step from C++, while
    the layer-by-layer runtime issues an FSDP2 all-gather or reduce-scatter,
    or a DTensor all-reduce, per layer and per pass from Python, each with
    the dispatch around it. One run of that runtime (a uniform plan, not one
    of those predicted) fixes its value; bisection on ``[0, upper_ms]``.
    A run faster than ``predict(0)`` gives 0 (the gap is not in the calls);
    one slower than ``predict(upper_ms)`` is refused.
    """
    if not measured_ms > 0:
        raise ValueError(f"measured_ms must be > 0, got {measured_ms!r}")
    low, high = 0.0, float(upper_ms)
    if predict(low) >= measured_ms:
        return 0.0
    if predict(high) < measured_ms:
        raise ValueError(f"even {upper_ms} ms per collective call predicts {predict(high):.1f} ms, under the "
                         f"measured {measured_ms:.1f} ms: the gap is not in the collectives' calls")
    while high - low > tolerance_ms:
        middle = (low + high) / 2
        if predict(middle) < measured_ms:
            low = middle
        else:
            high = middle
    return (low + high) / 2
