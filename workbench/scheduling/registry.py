"""The schedule registry: each pipeline kind bound to the one generator that writes its schedule.

Problem. A plan names its pipeline kind (a spec class in
``workbench.core.pipelines``); something has to turn that into the
per-rank action lists, and into what those lists keep in memory. Kept as a
dispatch ladder in the plan, every new schedule meant editing the plan, and
``core`` had to import ``scheduling``.

Approach. :data:`GENERATORS` maps a kind to a function ``(spec, request) ->
Schedule``; :func:`register` adds a kind (its spec class) and its generator
in one call, and the built-in kinds below are registered the same way, one
line each. :func:`schedule_for` is the one place a plan becomes a schedule;
:func:`stage_memory` reads, from that schedule, how many micro-batches each
stage keeps in flight and how many extra weight versions it holds (the
partitioners' memory model), so no room keeps a table of kinds.

A :class:`ScheduleRequest` carries what a generator may use besides its
spec: the stage and micro-batch counts, the replicas, which iterations to
write, and the stages' costs for kinds built from real times (``zb-auto``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable

from ..core.ir import Schedule
from ..core.pipelines import PIPELINE_KINDS, GroPipe, NoPipeline, PipelineSpec, register_kind
from . import generators, zero_bubble
from .memory import in_flight_by_stage, versions_by_stage
from .stagecosts import StageCosts

__all__ = ["ScheduleRequest", "GENERATORS", "register", "schedule_for", "stage_memory", "StageMemory"]


@dataclass(frozen=True)
class ScheduleRequest:
    """What a generator is asked for: ``stages`` x ``replicas`` ranks' lists over ``microbatches`` per iteration,
    iterations ``first_iteration .. first_iteration + num_iterations - 1``; ``stage_costs`` per virtual stage
    for generators that use real times, and the ``cluster`` whose links carry their messages (others ignore
    both)."""

    stages: int
    microbatches: int
    replicas: int = 1
    first_iteration: int = 0
    num_iterations: int = 1
    stage_costs: StageCosts | None = None
    cluster: Any = None  # a ClusterSpec, or None: messages take no time


Generator = Callable[[Any, ScheduleRequest], Schedule]
GENERATORS: dict[str, Generator] = {}


def register(spec_cls: type[PipelineSpec], generator: Generator) -> type[PipelineSpec]:
    """Register a pipeline kind: its spec class (names, fields, checks) and the generator of its schedule."""
    if not callable(generator):
        raise ValueError(f"the generator of pipeline kind {getattr(spec_cls, 'kind', spec_cls)!r} must be callable")
    register_kind(spec_cls)
    GENERATORS[spec_cls.kind] = generator
    return spec_cls


def schedule_for(plan: Any, *, first_iteration: int = 0, num_iterations: int = 1, num_buckets: int = 1,
                 num_layers: int | None = None, stage_costs: StageCosts | None = None,
                 cluster: Any = None) -> Schedule:
    """The compute schedule (not lowered) ``plan`` runs.

    ``first_iteration`` / ``num_iterations`` number the iterations of kinds
    that number them (GroPipe's delayed step, the asynchronous pipeline's
    one stream). A plan without a pipeline gives the data-parallel step
    (``num_buckets`` gradient buckets) or, on a 2D mesh, the SUMMA step over
    ``num_layers`` layers. ``stage_costs`` and ``cluster``: the times and
    links of kinds built from them (``zb-auto``).
    """
    spec = plan.pipeline
    if isinstance(spec, NoPipeline):
        if plan.tp_kind == "2d":
            if num_layers is None:
                raise ValueError(f"plan {plan.name!r}: the 2D tensor-parallel step needs num_layers")
            return generators.tensor2d_step(plan.q, num_layers)
        return generators.data_parallel(plan.dp, num_buckets)
    generator = GENERATORS.get(spec.kind)
    if generator is None:
        raise ValueError(f"pipeline kind {spec.kind!r} has no registered generator; register it with "
                         f"workbench.scheduling.registry.register(spec_class, generator)")
    request = ScheduleRequest(plan.pp, plan.microbatches, plan.dp, first_iteration, num_iterations, stage_costs,
                              cluster)
    return generator(spec, request)


@dataclass(frozen=True)
class StageMemory:
    """Per (virtual) stage: the most micro-batches whose activations it holds at once, and the most weight
    versions it keeps besides the live one."""

    in_flight: tuple[int, ...]
    extra_versions: tuple[int, ...]
    kind: str = field(default="", compare=False)  # the pipeline kind whose schedule kept it ("" when none)


def stage_memory(plan: Any, stage_costs: StageCosts | None = None) -> StageMemory:
    """What ``plan``'s schedule keeps per stage, read off the schedule (a stream over enough iterations to fill)."""
    if isinstance(plan.pipeline, NoPipeline):
        return StageMemory((1,) * plan.num_virtual_stages, (0,) * plan.num_virtual_stages)
    if stage_costs is None:  # every replica runs the same schedule, so one shows what each stage keeps
        memory = _memory(plan.pipeline, plan.pp, 1, plan.microbatches)
    else:
        iterations = _steady_iterations(plan.pipeline, plan.pp, plan.microbatches)
        memory = _walk_memory(schedule_for(plan, num_iterations=iterations, stage_costs=stage_costs),
                              plan.num_virtual_stages)
    return replace(memory, kind=plan.pipeline.kind)


def _steady_iterations(spec: PipelineSpec, stages: int, microbatches: int) -> int:
    """Iterations a stream needs to reach its steady state: one to fill the stages, one more beside it."""
    return 2 + -(-stages // microbatches) if spec.streams_iterations else 1


@lru_cache(maxsize=4096)
def _memory(spec: PipelineSpec, stages: int, replicas: int, microbatches: int) -> StageMemory:
    if isinstance(spec, GroPipe):  # a group keeps what its inner schedule keeps: all-reduces and steps hold nothing
        return _memory(spec.inner_spec, stages, 1, microbatches)
    closed = _CLOSED_FORMS.get(spec.kind)
    if closed is not None:
        return StageMemory(tuple(closed(stages, s, microbatches) for s in range(stages)), (0,) * stages)
    iterations = _steady_iterations(spec, stages, microbatches)
    request = ScheduleRequest(stages, microbatches, replicas, num_iterations=iterations)
    return _walk_memory(GENERATORS[spec.kind](spec, request), stages * spec.chunks)


# what a flushed schedule's stage s of S holds at most with m micro-batches (tested against the walk): GPipe every
# micro-batch, 1F1B its warm-up forwards and one more, ZB-H1 as many as the first stage of 1F1B on every stage (the
# later stages hold the weight passes they defer), ZB-H2 its 2S - 1 warm-up forwards; none keeps a second weight
# version. The walk of a ZB-H2 schedule of 64 stages and 256 micro-batches takes seconds; these take nothing.
_CLOSED_FORMS: dict[str, Callable[[int, int, int], int]] = {
    "gpipe": lambda stages, s, m: m,
    "1f1b": lambda stages, s, m: min(stages - s, m),
    "zbh1": lambda stages, s, m: min(stages, m),
    "zbh2": lambda stages, s, m: min(2 * stages - 1, m),
}


def _walk_memory(schedule: Schedule, stages: int) -> StageMemory:
    walked, versions = in_flight_by_stage(schedule), versions_by_stage(schedule)
    return StageMemory(tuple(walked.get(s, 0) for s in range(stages)),
                       tuple(max(0, versions.get(s, 1) - 1) for s in range(stages)))


# -- the built-in kinds: one line each ----------------------------------------------------------------------------------

_kind = PIPELINE_KINDS.__getitem__
register(_kind("gpipe"), lambda spec, r: generators.gpipe(r.stages, r.microbatches))
register(_kind("1f1b"), lambda spec, r: generators.one_f_one_b(r.stages, r.microbatches))
register(_kind("interleaved"), lambda spec, r: generators.interleaved(r.stages, r.microbatches, spec.chunks))
register(_kind("zbh1"), lambda spec, r: zero_bubble.zb_h1(r.stages, r.microbatches))
register(_kind("zbh2"), lambda spec, r: zero_bubble.zb_h2(r.stages, r.microbatches))
register(_kind("zbv"), lambda spec, r: zero_bubble.zb_v(r.stages, r.microbatches))
register(_kind("dualpipev"), lambda spec, r: zero_bubble.dualpipe_v(r.stages, r.microbatches))
register(_kind("zb-auto"), lambda spec, r: zero_bubble.zb_auto(
    r.stages, r.microbatches, r.stage_costs, spec.memory_limit_mb, cluster=r.cluster))
register(_kind("gropipe"), lambda spec, r: generators.gropipe(
    r.replicas, r.stages, r.microbatches, inner=schedule_for_inner(spec.inner, r), delay=spec.delay,
    first_iteration=r.first_iteration, num_iterations=r.num_iterations))
register(_kind("async"), lambda spec, r: generators.async_1f1b(
    r.stages, r.microbatches, r.num_iterations, inflight=None if spec.inflight == "auto" else spec.inflight,
    mode=spec.mode, vertical_sync=spec.vertical_sync, num_groups=r.replicas, split=spec.split))
register(_kind("torch"), lambda spec, r: _torch_order(spec.schedule, r))


def _torch_order(schedule: str, request: ScheduleRequest) -> Schedule:
    """torch's own schedules, drawn and simulated as the workbench's kind of the same name (its interleaved zero
    bubble as looped chunks with split backward)."""
    if schedule == "interleaved-zb":
        return zero_bubble.interleaved_zb(request.stages, request.microbatches)
    return GENERATORS[schedule](PIPELINE_KINDS[schedule](), request)


def schedule_for_inner(inner: str, request: ScheduleRequest) -> Schedule:
    """The one-pipeline schedule of GroPipe's ``inner`` kind, which every group runs."""
    single = ScheduleRequest(request.stages, request.microbatches, stage_costs=request.stage_costs)
    return GENERATORS[inner](PIPELINE_KINDS[inner](), single)
