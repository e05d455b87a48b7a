"""From a run config to its schedule, and to the timeline the simulator predicts for it.

The runtime executes, and the monitor compares against, the schedule a
:class:`~workbench.core.config.RunConfig` asks for; building it in one
place (here, torch-free) keeps the runtime, the simulator and the notebook
on the very same value.

``predict_from_measured`` answers "what should this run look like?" for a
live job: it takes the per-stage forward / backward durations the job has
measured, feeds them to the simulator with the job's own schedule, and
returns the predicted timeline and metrics. Compute is therefore calibrated
by the run itself; what the prediction tests is the schedule and the
communication model (idle time, waits, exposed all-reduce). On CPU ranks
that time-share cores (``sharing``), the measured durations are first
turned back into solo times, then the simulator shares the cores again for
the schedule's own overlap (:mod:`~workbench.scheduling.sharing`).
"""

from __future__ import annotations

from dataclasses import replace
from statistics import fmean
from typing import Any

from ..core.costs import ClusterSpec
from ..core.fields import check_int
from ..core.ir import Schedule
from ..core.timeline import Timeline
from .registry import schedule_for
from .sharing import CoreSharing, solo_durations
from .simulate import SimResult, simulate
from .stagecosts import StageCosts

__all__ = ["schedule_for_config", "stage_costs_from_timeline", "predict_from_measured"]


def schedule_for_config(config: Any, iteration: int = 0, stage_costs: StageCosts | None = None) -> Schedule:
    """The compute schedule (not lowered) a run config's plan runs, at ``iteration``.

    GroPipe numbers its iterations (the delayed step of iteration ``t``
    applies ``t - 1``), so it is built per ``iteration``; the asynchronous
    pipeline is one stream over all ``steps`` iterations (with ``inflight =
    "auto"``, chosen by the runtime from a profile, the generator's default
    depth stands in). ``stage_costs`` are the stages' costs for kinds built
    from them (``zb-auto``; a run's start event records what it used). A plan
    without a pipeline has no scheduled pipeline to predict, which is a
    ValueError.
    """
    plan = config.plan
    if not plan.is_scheduled:
        raise ValueError(f"plan {plan.name!r} is not a pipeline the workbench schedules; predicted timelines are "
                         f"for the pipelines its interpreter runs (GPipe, 1F1B, interleaved, zero-bubble, GroPipe and "
                         f"asynchronous)")
    if plan.iterates_across_steps:
        return schedule_for(plan, num_iterations=config.training.steps, stage_costs=stage_costs)
    return schedule_for(plan, first_iteration=iteration, stage_costs=stage_costs)


def stage_costs_from_timeline(timeline: Timeline, num_stages: int, sharing: CoreSharing | None = None) -> StageCosts:
    """Per-stage costs from measured events.

    Forward / backward / step times (input and weight gradients for a split
    backward, the backward then their sum) are the means of the stage's events
    (an iteration is their sum, so the mean, not the median, carries the
    slow tail a shared machine adds); with ``sharing`` the means of their solo
    durations, each event's duration over the processor-sharing slowdown of
    the threads runnable beside it. When replicas hold a stage (GroPipe
    groups), the slowest replica's mean stands for the stage: the replicas
    meet at every gradient all-reduce, so the slowest one sets the pace;
    the bytes a stage sends downstream and the gradient bytes it all-reduces
    are read from the ``nbytes`` its SEND_F and AR events recorded (0 when
    the run did not record them).
    """
    check_int("num_stages", num_stages, 1)
    events = list(timeline)
    solo = solo_durations(events, sharing) if sharing is not None else {}
    samples: dict[tuple[int, str], dict[int, list[float]]] = {}
    for i, e in enumerate(events):
        if e.op in ("F", "B", "I", "W", "STEP") and e.stage < num_stages:
            samples.setdefault((e.stage, e.op), {}).setdefault(e.rank, []).append(solo.get(i, e.duration))
    missing = [s for s in range(num_stages) if (s, "F") not in samples
               or ((s, "B") not in samples and (s, "I") not in samples)]
    if missing:
        raise ValueError(f"the measured timeline has no forward/backward events for stages {missing}")

    def med(stage: int, op: str) -> float:
        per_rank = samples.get((stage, op))
        return max(fmean(values) for values in per_rank.values()) if per_rank else 0.0

    def largest_nbytes(op: str) -> tuple[int, ...]:
        out = [0] * num_stages
        for e in timeline:
            if e.op == op and e.stage < num_stages and e.nbytes:
                out[e.stage] = max(out[e.stage], e.nbytes)
        return tuple(out)

    zeros = (0,) * num_stages
    grad_bytes = largest_nbytes("AR")
    split = all((s, "I") in samples for s in range(num_stages))  # a split backward: its own I and W times
    inputs = tuple(med(s, "I") for s in range(num_stages)) if split else ()
    weights = tuple(med(s, "W") for s in range(num_stages)) if split else ()
    return StageCosts(
        forward_ms=tuple(med(s, "F") for s in range(num_stages)),
        backward_ms=tuple(i + w for i, w in zip(inputs, weights)) if split else
        tuple(med(s, "B") for s in range(num_stages)), input_grad_ms=inputs, weight_grad_ms=weights,
        step_ms=tuple(med(s, "STEP") for s in range(num_stages)),
        send_bytes=largest_nbytes("SEND_F"), param_bytes=grad_bytes, grad_bytes=grad_bytes,
        optimizer_bytes=zeros, activation_bytes=zeros,
    )


def predict_from_measured(config: Any, measured: Timeline, *, cluster: ClusterSpec | None = None,
                          iteration: int | None = None, sharing: CoreSharing | None = None,
                          schedule_costs: StageCosts | None = None) -> SimResult:
    """Simulate the config's schedule with the stage times the run measured (see the module docstring).

    ``iteration`` (default: the one the measured events belong to) picks the
    GroPipe iteration to predict. With a delayed update its step applies the
    all-reduce the previous iteration started, so the iterations before it
    are simulated too and the result holds only ``iteration``'s events, from 0.
    ``schedule_costs``: the stage costs the run built its schedule from, for
    kinds built from them (``zb-auto``; the run's start event records them as
    ``stage_costs``), so the order simulated is the order the run ran.
    """
    if iteration is None:
        iteration = max((e.iteration for e in measured), default=0)
    warm = min(iteration, 2) if config.plan.delayed_update else 0
    if warm:
        schedule = schedule_for(config.plan, first_iteration=iteration - warm, num_iterations=warm + 1,
                                stage_costs=schedule_costs)
    else:
        schedule = schedule_for_config(config, iteration, schedule_costs)
    num_stages = max(a.stage for r in range(schedule.num_ranks) for a in schedule.actions(r)) + 1
    costs = stage_costs_from_timeline(measured, num_stages, sharing)
    result = simulate(schedule, costs, cluster, sharing=sharing)
    if not warm:
        return result
    kept = [e for e in result.timeline.events if e.iteration == iteration]
    t0 = min(e.start for e in kept)
    shifted = Timeline(tuple(replace(e, start=e.start - t0, end=e.end - t0) for e in kept), result.timeline.meta)
    return result.replace(timeline=shifted)
