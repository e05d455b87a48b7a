"""The parallel plan: one typed value that says how a model is spread over devices.

Problem. A schedule is one value that the simulator, the runtime and the
figures share; a parallel strategy has to be the same, or every consumer
re-derives "which ranks form a pipeline", "which schedule runs" and "what
memory does it keep" from a name string and they drift apart. And a name
string cannot say that layer 3 is fully sharded while layer 4 is split over
two tensor-parallel ranks.

Approach. :class:`ParallelPlan` holds four things, each typed and validated
at construction, every error naming the field:

* ``mesh``: a :class:`~workbench.core.topology.Topology` with the axes
  ``dp`` (replicas), ``pp`` (pipeline stages) and ``tp`` (1D tensor
  parallelism) or ``tp_row`` x ``tp_col`` (a 2D grid), in that order, so
  the tensor-parallel ranks, whose traffic is heaviest, are neighbours;
* ``pipeline``: the schedule kind as a tagged union, one frozen dataclass
  per kind with only its own fields (:class:`NoPipeline`, :class:`GPipe`,
  :class:`OneFOneB`, :class:`Interleaved`, :class:`GroPipe`,
  :class:`AsyncPipeline`, :class:`TorchPipelining`);
* ``partition``: ``"uniform"``, ``"ampa"`` or explicit ranges such as
  ``"0-3|4-9"``, resolved when the model is known;
* ``layers``: per-layer :class:`LayerPlan` options (data-parallel kind,
  tensor-parallel kind and degree, recomputation); one entry means every
  layer uses it.

:meth:`ParallelPlan.schedule` is the one place where a plan becomes a
:class:`~workbench.core.ir.Schedule`, and :attr:`ParallelPlan.name` is a
canonical text form that :meth:`ParallelPlan.parse` reads back::

    dp8                          8 data-parallel replicas
    dp4-m2                       4 replicas, 2 micro-batches each
    pp4-1f1b-m8                  one 4-stage 1F1B pipeline, 8 micro-batches
    pp4-interleaved-v2-m8        interleaved 1F1B, 2 chunks per rank
    gropipe-2x4-1f1b-m8-d1       2 groups x 4 stages, 1F1B inside, delayed all-reduce
    async-2x4-m8                 2 replicas of a 4-stage asynchronous pipeline
    async-1x4-m4-2bw-if3         ... double-buffered weights, 3 micro-batches in flight
    async-1x2-m4-if1-adapt4      ... re-deciding depths and mode every 4 steps from measurements
    torchpp2-1f1b-m4             torch.distributed.pipelining's 1F1B (a baseline)
    tp2d-2x2-dp2                 2 copies of a 2x2 SUMMA grid
    tp1d-4-dp2                   2 copies of 4-way Megatron tensor parallelism
    dp2-rc / dp2-fsdp            every layer recomputed / fully sharded
    pp2-1f1b-m4-L[0-3=ddp.rc;4-9=ddp]   per-layer options by layer range
    pp2-1f1b-m4@0-2|3-4          with an explicit partition

Standard library only: the plan is read by the planner and the job monitor
in kernels that never import torch. The schedule generators and the memory
walk it dispatches to live in ``workbench.scheduling`` and are imported
when :meth:`ParallelPlan.schedule` is called.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, ClassVar, Union

from .partition import Partition
from .topology import Topology

__all__ = [
    "ParallelPlan", "LayerPlan", "PipelineSpec", "NoPipeline", "GPipe", "OneFOneB", "Interleaved", "GroPipe",
    "AsyncPipeline", "TorchPipelining", "PIPELINE_KINDS", "PLAN_FAMILIES", "DP_KINDS", "TP_KINDS", "plan_error",
]

DP_KINDS = ("replicate", "zero2", "fsdp")  # DDP; shard gradients + optimizer state; shard everything
TP_KINDS = ("none", "1d", "2d")
_DP_TEXT = {"replicate": "ddp", "zero2": "zero2", "fsdp": "fsdp"}
_TEXT_DP = {v: k for k, v in _DP_TEXT.items()}


def plan_error(field_name: str, value: Any, valid: str) -> ValueError:
    """A ValueError that names the field, the value and what would be valid."""
    return ValueError(f"plan field {field_name!r} = {value!r} is invalid: {valid}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise plan_error(name, value, f"expected an int >= {minimum}")


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise plan_error(name, value, f"valid options are {', '.join(map(str, choices))}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise plan_error(name, value, "expected true or false")


# -- per-layer options -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerPlan:
    """How one layer is parallelised inside its pipeline stage.

    ``dp``: ``replicate`` keeps a full copy per data-parallel rank and
    all-reduces gradients (DDP); ``zero2`` shards gradients and optimizer
    state (reduce-scatter, then an all-gather of the updated parameters);
    ``fsdp`` also shards the parameters and gathers them around each use.
    ``tp`` / ``tp_degree``: no tensor parallelism, Megatron-style 1D over
    ``tp_degree`` ranks, or a SUMMA 2D grid of ``tp_degree`` = q x q ranks.
    ``recompute``: keep only the layer's input and re-run its forward in
    backward. ``consecutive``: the tensor-parallel group sits on neighbouring
    ranks of the stage (TP innermost, the fast link), else on strided ranks
    (data parallelism innermost); always True without tensor parallelism.
    """

    dp: str = "replicate"
    tp: str = "none"
    tp_degree: int = 1
    recompute: bool = False
    consecutive: bool = True

    def __post_init__(self) -> None:
        _check_choice("layers.dp", self.dp, DP_KINDS)
        _check_choice("layers.tp", self.tp, TP_KINDS)
        _check_int("layers.tp_degree", self.tp_degree, 1)
        _check_bool("layers.recompute", self.recompute)
        _check_bool("layers.consecutive", self.consecutive)
        if self.tp == "none" and not self.consecutive:
            raise plan_error("layers.consecutive", False, "only a tensor-parallel group can sit on strided ranks")
        if self.tp == "none" and self.tp_degree != 1:
            raise plan_error("layers.tp_degree", self.tp_degree, "a layer without tensor parallelism has degree 1")
        if self.tp != "none" and self.tp_degree < 2:
            raise plan_error("layers.tp_degree", self.tp_degree, f"tensor parallelism {self.tp!r} needs degree >= 2")
        if self.tp == "2d" and math.isqrt(self.tp_degree) ** 2 != self.tp_degree:
            raise plan_error("layers.tp_degree", self.tp_degree, "a 2D grid has q x q ranks: use a square")

    @property
    def text(self) -> str:
        """Short form: ``ddp``, ``fsdp.tp1d2``, ``zero2.rc``, ``ddp.tp2d4.rc``, ``ddp.tp1d2.strided``."""
        parts = [_DP_TEXT[self.dp]]
        if self.tp != "none":
            parts.append(f"tp{self.tp}{self.tp_degree}")
            if not self.consecutive:
                parts.append("strided")
        if self.recompute:
            parts.append("rc")
        return ".".join(parts)

    @classmethod
    def parse(cls, text: str) -> "LayerPlan":
        parts = text.strip().split(".")
        if parts[0] not in _TEXT_DP:
            raise plan_error("layers", text, f"a layer option starts with one of {', '.join(_TEXT_DP)}")
        options: dict[str, Any] = {"dp": _TEXT_DP[parts[0]]}
        for part in parts[1:]:
            m = re.fullmatch(r"tp(1d|2d)(\d+)", part)
            if part == "rc":
                options["recompute"] = True
            elif part == "strided":
                options["consecutive"] = False
            elif m:
                options.update(tp=m.group(1), tp_degree=int(m.group(2)))
            else:
                raise plan_error("layers", text, f"unknown layer option {part!r}; expected 'rc', 'strided' or 'tp1dN' / 'tp2dN'")
        return cls(**options)


# -- pipeline kinds: a tagged union ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class NoPipeline:
    """The whole model on every replica (data and tensor parallelism only)."""

    kind: ClassVar[str] = "none"


@dataclass(frozen=True)
class GPipe:
    """All forwards, then all backwards; a flush each iteration."""

    kind: ClassVar[str] = "gpipe"


@dataclass(frozen=True)
class OneFOneB:
    """One forward, one backward in steady state: at most ``p - s`` micro-batches in flight on stage ``s``."""

    kind: ClassVar[str] = "1f1b"


@dataclass(frozen=True)
class Interleaved:
    """Interleaved 1F1B: each rank holds ``chunks`` virtual stages, shrinking the bubble by that factor."""

    chunks: int = 2
    kind: ClassVar[str] = "interleaved"

    def __post_init__(self) -> None:
        _check_int("pipeline.chunks", self.chunks, 2)


@dataclass(frozen=True)
class GroPipe:
    """GroPipe: a pipeline per group (``inner`` schedule), a per-stage all-reduce across groups, ``delay``
    0 (applied this iteration) or 1 (applied next iteration, hidden behind its forwards)."""

    inner: str = "1f1b"
    delay: int = 0
    kind: ClassVar[str] = "gropipe"

    def __post_init__(self) -> None:
        _check_choice("pipeline.inner", self.inner, ("gpipe", "1f1b"))
        _check_choice("pipeline.delay", self.delay, (0, 1))


@dataclass(frozen=True)
class AsyncPipeline:
    """PipeDream-style asynchronous 1F1B with no flush between iterations.

    ``mode`` ``stash`` keeps the weight version each in-flight micro-batch
    used (``stash = false`` shows the unstashed, inconsistent variant);
    ``2bw`` keeps two versions and coalesces gradients. ``inflight`` is
    micro-batches in flight per stage, or ``auto`` (profiled, under
    ``memory_cap_mb``; 0 = no cap). ``adapt_every`` > 0 re-decides the
    in-flight depths and the stash mode after that many steps from the
    stage times and memory the run measured (the stream drains there; the
    interval doubles while decisions change nothing); 0 keeps the launch's
    choice.
    """

    mode: str = "stash"
    stash: bool = True
    vertical_sync: bool = False
    inflight: str | int | tuple[int, ...] = "auto"
    memory_cap_mb: float = 0.0
    adapt_every: int = 0
    kind: ClassVar[str] = "async"

    def __post_init__(self) -> None:
        _check_choice("pipeline.mode", self.mode, ("stash", "2bw"))
        _check_bool("pipeline.stash", self.stash)
        _check_bool("pipeline.vertical_sync", self.vertical_sync)
        if isinstance(self.inflight, list):
            object.__setattr__(self, "inflight", tuple(self.inflight))
        depths = self.inflight if isinstance(self.inflight, tuple) else (self.inflight,)
        if self.inflight != "auto" and (not depths or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                                                          for d in depths)):
            raise plan_error("pipeline.inflight", self.inflight, "expected 'auto', an int >= 1 (micro-batches in "
                             "flight on every stage) or one such int per stage")
        if isinstance(self.memory_cap_mb, bool) or not isinstance(self.memory_cap_mb, (int, float)) \
                or self.memory_cap_mb < 0:
            raise plan_error("pipeline.memory_cap_mb", self.memory_cap_mb, "expected a number >= 0 (0: no cap)")
        if isinstance(self.adapt_every, bool) or not isinstance(self.adapt_every, int) or self.adapt_every < 0:
            raise plan_error("pipeline.adapt_every", self.adapt_every, "expected an int >= 0 (steps between "
                             "re-decisions of the in-flight depths; 0: never)")
        if self.adapt_every and (not self.stash or self.vertical_sync):
            raise plan_error("pipeline.adapt_every", self.adapt_every, "the run-time adaptation chooses between "
                             "modes 'stash' and '2bw'; it needs stash = true and no vertical sync")
        if self.mode == "2bw" and not self.stash:
            raise plan_error("pipeline.stash", self.stash, "mode '2bw' keeps two weight versions; set stash = true "
                             "(stash = false is the unstashed variant of mode 'stash')")
        if self.vertical_sync and not self.stash:
            raise plan_error("pipeline.vertical_sync", self.vertical_sync, "vertical sync runs later stages on "
                             "older stashed versions; it needs stash = true")
        if self.mode == "2bw" and self.vertical_sync:
            raise plan_error("pipeline.vertical_sync", self.vertical_sync, "mode '2bw' already uses one version "
                             "per iteration on every stage; vertical_sync applies to mode 'stash'")


@dataclass(frozen=True)
class TorchPipelining:
    """torch.distributed.pipelining's own ``schedule`` (a peer baseline, run by torch, not by the workbench)."""

    schedule: str = "1f1b"
    kind: ClassVar[str] = "torch"

    def __post_init__(self) -> None:
        _check_choice("pipeline.schedule", self.schedule, ("gpipe", "1f1b"))


PipelineSpec = Union[NoPipeline, GPipe, OneFOneB, Interleaved, GroPipe, AsyncPipeline, TorchPipelining]
PIPELINE_KINDS: dict[str, type] = {cls.kind: cls for cls in
                                   (NoPipeline, GPipe, OneFOneB, Interleaved, GroPipe, AsyncPipeline, TorchPipelining)}
# the planner's families of plans, as tables and the ``kinds`` filter name them
PLAN_FAMILIES = ("dp", "pipeline", "gropipe", "async", "tp2d", "tp1d", "torch")
_ONE_PIPELINE = (GPipe, OneFOneB, Interleaved, TorchPipelining)  # a single pipeline: dp must be 1


def _pipeline_from_dict(data: Any) -> PipelineSpec:
    if isinstance(data, tuple(PIPELINE_KINDS.values())):
        return data
    if not isinstance(data, dict) or "kind" not in data:
        raise plan_error("pipeline", data, f"expected a table with 'kind' = one of {', '.join(PIPELINE_KINDS)}")
    kind = data["kind"]
    _check_choice("pipeline.kind", kind, tuple(PIPELINE_KINDS))
    cls = PIPELINE_KINDS[kind]
    known = {f.name for f in fields(cls)}
    options = {k: v for k, v in data.items() if k != "kind"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise plan_error(f"pipeline.{unknown[0]}", options[unknown[0]],
                         f"pipeline kind {kind!r} has no such field; its fields are {sorted(known) or 'none'}")
    return cls(**options)


def _pipeline_to_dict(spec: PipelineSpec) -> dict[str, Any]:
    return {"kind": spec.kind, **{f.name: getattr(spec, f.name) for f in fields(spec)}}


def _mesh_layer(mesh: Topology) -> LayerPlan:
    """The LayerPlan a mesh implies: its tensor parallelism (2D grid, 1D, or none) over all its tensor ranks.

    A plan name's head and a ``[plan]`` table without layer ranges mean this for every layer."""
    if mesh.size("tp_row") > 1:
        return LayerPlan(tp="2d", tp_degree=mesh.size("tp_row") * mesh.size("tp_col"))
    if mesh.size("tp") > 1:
        return LayerPlan(tp="1d", tp_degree=mesh.size("tp"))
    return LayerPlan()


# -- the plan ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParallelPlan:
    """Mesh + pipeline + partition + per-layer options; see the module docstring."""

    mesh: Topology
    pipeline: PipelineSpec = field(default_factory=NoPipeline)
    microbatches: int = 1
    partition: str = "uniform"
    layers: tuple[LayerPlan, ...] = (LayerPlan(),)

    def __post_init__(self) -> None:
        mesh = self.mesh
        if isinstance(mesh, dict):
            mesh = Topology(tuple((str(k), v) for k, v in mesh.items()))
        if not isinstance(mesh, Topology):
            raise plan_error("mesh", self.mesh, "expected axes with sizes, e.g. {dp = 2, pp = 4}")
        if not set(mesh.names) <= {"dp", "pp", "tp", "tp_row", "tp_col"}:
            raise plan_error("mesh", str(mesh), "axes are dp, pp and tp (1D) or tp_row and tp_col (2D)")
        present = dict(mesh.axes)
        if present.get("tp_row", 1) != present.get("tp_col", 1):
            raise plan_error("mesh", str(mesh), "a 2D tensor grid is square: tp_row = tp_col")
        if present.get("tp", 1) > 1 and present.get("tp_row", 1) > 1:
            raise plan_error("mesh", str(mesh), "tensor parallelism is 1D (tp) or 2D (tp_row x tp_col), not both")
        object.__setattr__(self, "pipeline", _pipeline_from_dict(self.pipeline))
        # canonical, so equal plans compare equal: the axes in their fixed order, dp always, pp with a pipeline,
        # tensor axes when larger than 1 (no process groups are built for axes a plan does not use)
        order = [a for a in ("dp", "pp", "tp", "tp_row", "tp_col") if a == "dp" or present.get(a, 1) > 1
                 or (a == "pp" and not isinstance(self.pipeline, NoPipeline))]
        object.__setattr__(self, "mesh", Topology(tuple((a, present.get(a, 1)) for a in order)))
        # the search reads sizes and the tensor parallelism in its inner loops
        object.__setattr__(self, "_sizes", dict(self.mesh.axes))
        object.__setattr__(self, "_implied", _mesh_layer(self.mesh))
        layers = self.layers
        if isinstance(layers, LayerPlan):
            layers = (layers,)
        if not isinstance(layers, (tuple, list)) or not layers \
                or not all(isinstance(l, LayerPlan) for l in layers):
            raise plan_error("layers", self.layers, "expected one or more LayerPlan values (one: every layer)")
        object.__setattr__(self, "layers", tuple(layers))
        _check_int("microbatches", self.microbatches, 1)
        if not isinstance(self.partition, str) or not self.partition.strip():
            raise plan_error("partition", self.partition, "expected 'uniform', 'ampa' or ranges like '0-3|4-9'")
        if self.partition not in ("uniform", "ampa"):
            try:
                Partition.parse(self.partition)
            except ValueError as exc:
                raise plan_error("partition", self.partition, f"expected 'uniform', 'ampa' or ranges like "
                                 f"'0-3|4-9' ({exc})") from None
            if Partition.parse(self.partition).num_stages != self.num_virtual_stages:
                raise plan_error("partition", self.partition, f"it has {Partition.parse(self.partition).num_stages} "
                                 f"stages; this plan has {self.num_virtual_stages} (pp x chunks)")
        self._check_shape()

    def _check_shape(self) -> None:
        spec, dp, pp = self.pipeline, self.dp, self.pp
        if isinstance(spec, NoPipeline) and pp != 1:
            raise plan_error("mesh.pp", pp, "a plan without a pipeline has one stage: set pp = 1 or give a pipeline")
        if isinstance(spec, _ONE_PIPELINE) and dp != 1:
            raise plan_error("mesh.dp", dp, f"pipeline kind {spec.kind!r} runs one pipeline: set dp = 1 "
                             f"(GroPipe and the asynchronous pipeline run several replicas)")
        if isinstance(spec, (AsyncPipeline, TorchPipelining)) and pp < 2:
            raise plan_error("mesh.pp", pp, f"pipeline kind {spec.kind!r} cuts the model into stages: use pp >= 2")
        if isinstance(spec, Interleaved) and self.microbatches % pp:
            raise plan_error("microbatches", self.microbatches, f"interleaved 1F1B needs a multiple of pp ({pp})")
        if isinstance(spec, AsyncPipeline) and spec.mode == "2bw" and self.microbatches < pp:
            raise plan_error("microbatches", self.microbatches, f"mode '2bw' coalesces gradients over at least "
                             f"the pipeline depth: use microbatches >= pp ({pp})")
        tp_kind = self.tp_kind
        for i, layer in enumerate(self.layers):
            if layer.tp != "none" and layer.tp != tp_kind:
                raise plan_error(f"layers[{i}].tp", layer.tp, f"the mesh has {tp_kind.upper()} tensor parallelism "
                                 f"({str(self.mesh)})")
            if layer.tp != "none" and self.tp % layer.tp_degree:
                raise plan_error(f"layers[{i}].tp_degree", layer.tp_degree,
                                 f"must divide the mesh's {self.tp} tensor-parallel ranks")

    # -- sizes -------------------------------------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Replicas: GroPipe groups, asynchronous pipeline replicas or data-parallel copies."""
        return self._sizes["dp"]

    @property
    def pp(self) -> int:
        return self._sizes.get("pp", 1)

    @property
    def tp(self) -> int:
        """Ranks of one tensor-parallel unit (q x q for a 2D grid)."""
        return self._sizes.get("tp", 1) * self._sizes.get("tp_row", 1) * self._sizes.get("tp_col", 1)

    @property
    def q(self) -> int:
        """Side of the 2D grid (1 without one)."""
        return self._sizes.get("tp_row", 1)

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def chunks(self) -> int:
        return self.pipeline.chunks if isinstance(self.pipeline, Interleaved) else 1

    @property
    def num_virtual_stages(self) -> int:
        return self.pp * self.chunks

    @property
    def tp_kind(self) -> str:
        """``none``, ``1d`` or ``2d``: the mesh's tensor parallelism."""
        return self._implied.tp

    @property
    def family(self) -> str:
        """One of :data:`PLAN_FAMILIES`: the pipeline kind, else the tensor parallelism, else ``dp``."""
        spec = self.pipeline
        if isinstance(spec, (GPipe, OneFOneB, Interleaved)):
            return "pipeline"
        if not isinstance(spec, NoPipeline):
            return spec.kind
        return {"2d": "tp2d", "1d": "tp1d"}.get(self.tp_kind, "dp")

    @property
    def is_uniform(self) -> bool:
        """Every layer has the same options."""
        return len(set(self.layers)) == 1

    @property
    def layer(self) -> LayerPlan:
        """The one LayerPlan of a uniform plan (ValueError for a per-layer plan)."""
        if not self.is_uniform:
            raise ValueError(f"plan {self.name!r} has per-layer options; read plan.layers_for(num_layers)")
        return self.layers[0]

    @property
    def recompute(self) -> bool:
        """Whether every layer recomputes (False when some or none do)."""
        return all(l.recompute for l in self.layers)

    def layers_for(self, num_layers: int) -> tuple[LayerPlan, ...]:
        """One LayerPlan per layer of a model with ``num_layers`` layers."""
        _check_int("num_layers", num_layers, 1)
        if len(self.layers) == 1:
            return self.layers * num_layers
        if len(self.layers) != num_layers:
            raise plan_error("layers", f"{len(self.layers)} entries", f"the model has {num_layers} layers; give one "
                             f"option per layer, or one for all")
        return self.layers

    # -- schedule ----------------------------------------------------------------------------------------------------
    @property
    def memory_schedule(self) -> str:
        """The schedule whose in-flight micro-batches the partitioner counts: ``gpipe``, ``1f1b`` or ``async``."""
        spec = self.pipeline
        if isinstance(spec, AsyncPipeline):
            return "async"
        if isinstance(spec, GPipe) or (isinstance(spec, (GroPipe, TorchPipelining))
                                       and getattr(spec, "inner", getattr(spec, "schedule", "")) == "gpipe"):
            return "gpipe"
        return "1f1b"

    @property
    def is_scheduled(self) -> bool:
        """Whether the workbench's own interpreter runs a pipeline schedule for this plan."""
        return isinstance(self.pipeline, (GPipe, OneFOneB, Interleaved, GroPipe, AsyncPipeline))

    @property
    def iterates_across_steps(self) -> bool:
        """Whether one schedule spans every iteration (no flush between steps: the asynchronous pipeline)."""
        return isinstance(self.pipeline, AsyncPipeline)

    @property
    def delayed_update(self) -> bool:
        """Whether an iteration's step applies the previous iteration's all-reduced gradients (GroPipe delay 1)."""
        return isinstance(self.pipeline, GroPipe) and self.pipeline.delay > 0

    def schedule(self, *, first_iteration: int = 0, num_iterations: int = 1, num_buckets: int = 1,
                 num_layers: int | None = None):
        """The compute schedule (not lowered) this plan runs.

        ``first_iteration`` / ``num_iterations`` number GroPipe's iterations
        (a delayed step applies the previous one's all-reduce) and set the
        length of the asynchronous pipeline's single stream. A plan without
        a pipeline gives the data-parallel step (``num_buckets`` gradient
        buckets) or, on a 2D mesh, the SUMMA step over ``num_layers`` layers.
        """
        from ..scheduling import generators

        spec, s, m = self.pipeline, self.pp, self.microbatches
        if isinstance(spec, GPipe):
            return generators.gpipe(s, m)
        if isinstance(spec, OneFOneB):
            return generators.one_f_one_b(s, m)
        if isinstance(spec, Interleaved):
            return generators.interleaved(s, m, spec.chunks)
        if isinstance(spec, GroPipe):
            return generators.gropipe(self.dp, s, m, inner=spec.inner, delay=spec.delay,
                                      first_iteration=first_iteration, num_iterations=num_iterations)
        if isinstance(spec, AsyncPipeline):
            return generators.async_1f1b(s, m, num_iterations, inflight=None if spec.inflight == "auto"
                                         else spec.inflight, mode=spec.mode, vertical_sync=spec.vertical_sync,
                                         num_groups=self.dp)
        if isinstance(spec, TorchPipelining):
            return generators.gpipe(s, m) if spec.schedule == "gpipe" else generators.one_f_one_b(s, m)
        if self.tp_kind == "2d":
            if num_layers is None:
                raise ValueError(f"plan {self.name!r}: the 2D tensor-parallel step needs num_layers")
            return generators.tensor2d_step(self.q, num_layers)
        return generators.data_parallel(self.dp, num_buckets)

    def in_flight(self, stage: int) -> int:
        """The most micro-batches whose activations (virtual) stage ``stage`` holds at once."""
        from ..scheduling.memory import in_flight_by_stage

        _check_int("stage", stage, 0)
        if stage >= self.num_virtual_stages:
            raise ValueError(f"stage {stage} out of range: plan {self.name!r} has {self.num_virtual_stages} stages")
        if isinstance(self.pipeline, NoPipeline):
            return 1  # each micro-batch's backward runs right after its forward
        iterations = 2 if isinstance(self.pipeline, AsyncPipeline) else 1  # the second shows the steady state
        return in_flight_by_stage(self.schedule(num_iterations=iterations)).get(stage, 0)

    @classmethod
    def for_pipeline(cls, kind: str, stages: int, microbatches: int, *, groups: int = 1, chunks: int = 2,
                     inner: str = "1f1b", delay: int = 0, partition: str = "uniform") -> "ParallelPlan":
        """The plan of a pipeline kind chosen in a widget or on the command line (:data:`PIPELINE_KINDS`).

        ``groups`` replicas apply to the kinds that run several (GroPipe, the
        asynchronous pipeline); ``chunks`` to interleaved; ``inner`` and
        ``delay`` to GroPipe. Options of other kinds are ignored, so one set of
        controls can drive every kind.
        """
        if kind not in PIPELINE_KINDS or kind == NoPipeline.kind:
            raise plan_error("pipeline.kind", kind, f"valid pipeline kinds are "
                             f"{', '.join(k for k in PIPELINE_KINDS if k != NoPipeline.kind)}")
        spec = {Interleaved.kind: lambda: Interleaved(chunks=chunks),
                GroPipe.kind: lambda: GroPipe(inner=inner, delay=delay)}.get(kind, PIPELINE_KINDS[kind])()
        replicas = groups if isinstance(spec, (GroPipe, AsyncPipeline)) else 1
        return cls(Topology(dp=replicas, pp=stages), spec, microbatches, partition)

    # -- derived plans -----------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> "ParallelPlan":
        return replace(self, **changes)

    def with_layers(self, layers: LayerPlan | tuple[LayerPlan, ...]) -> "ParallelPlan":
        return replace(self, layers=layers)

    # -- text ---------------------------------------------------------------------------------------------------------
    @cached_property
    def name(self) -> str:
        spec, dp, pp, m = self.pipeline, self.dp, self.pp, self.microbatches
        if isinstance(spec, NoPipeline):
            if self.tp_kind == "2d":
                head = f"tp2d-{self.q}x{self.q}-dp{dp}"
            elif self.tp_kind == "1d":
                head = f"tp1d-{self.tp}-dp{dp}"
            else:
                head = f"dp{dp}"
            tokens = [f"m{m}"] if m > 1 else []
        else:
            tokens = []
            if isinstance(spec, GroPipe):
                head = f"gropipe-{dp}x{pp}-{spec.inner}-m{m}-d{spec.delay}"
            elif isinstance(spec, AsyncPipeline):
                head = f"async-{dp}x{pp}-m{m}"
                tokens += (["2bw"] if spec.mode == "2bw" else []) + ([] if spec.stash else ["nostash"])
                tokens += (["vsync"] if spec.vertical_sync else [])
                if spec.inflight != "auto":
                    depths = spec.inflight if isinstance(spec.inflight, tuple) else (spec.inflight,)
                    tokens.append("if" + ".".join(map(str, depths)))
                tokens += ([f"cap{spec.memory_cap_mb:g}"] if spec.memory_cap_mb else [])
                tokens += ([f"adapt{spec.adapt_every}"] if spec.adapt_every else [])
            elif isinstance(spec, TorchPipelining):
                head = f"torchpp{pp}-{spec.schedule}-m{m}"
            elif isinstance(spec, Interleaved):
                head = f"pp{pp}-interleaved-v{spec.chunks}-m{m}"
            else:
                head = f"pp{pp}-{spec.kind}-m{m}"
            if self.tp_kind == "2d":
                tokens.append(f"tp2d{self.q}x{self.q}")
            elif self.tp_kind == "1d":
                tokens.append(f"tp1d{self.tp}")
        text = "-".join([head, *tokens]) + self._layers_suffix()
        return text if self.partition == "uniform" else f"{text}@{self.partition}"

    def _layers_suffix(self) -> str:
        base = self._implied
        if self.is_uniform:
            layer = self.layers[0]
            if layer.tp == base.tp and layer.tp_degree == base.tp_degree:
                words = ([] if layer.dp == "replicate" else [_DP_TEXT[layer.dp]]) + (["rc"] if layer.recompute else [])
                return "".join(f"-{w}" for w in words)
            return f"-L[all={layer.text}]"
        runs, start = [], 0
        for i in range(1, len(self.layers) + 1):
            if i == len(self.layers) or self.layers[i] != self.layers[start]:
                span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
                runs.append(f"{span}={self.layers[start].text}")
                start = i
        return f"-L[{';'.join(runs)}]"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> "ParallelPlan":
        """The inverse of :attr:`name`."""
        if not isinstance(name, str) or not name.strip():
            raise plan_error("name", name, "expected a plan name such as 'dp8' or 'gropipe-2x4-1f1b-m8-d1'")
        return _parse_name(name.strip())

    # -- dict / TOML ---------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``[plan]`` table: mesh sizes, pipeline, micro-batches, partition and layer ranges."""
        out: dict[str, Any] = {
            "mesh": {n: s for n, s in self.mesh.axes if s > 1 or n == "dp"},
            "pipeline": _pipeline_to_dict(self.pipeline),
            "microbatches": self.microbatches,
            "partition": self.partition,
        }
        if self.layers != (self._implied,):  # the mesh's own layer is what a table without layers means
            out["layers"] = _layer_ranges(self.layers)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "ParallelPlan":
        if isinstance(data, ParallelPlan):
            return data
        if isinstance(data, str):
            return cls.parse(data)
        if not isinstance(data, dict):
            raise plan_error("plan", data, "expected a [plan] table or a plan name")
        if "name" in data and len(data) == 1:
            return cls.parse(data["name"])
        known = {"mesh", "pipeline", "microbatches", "partition", "layers"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise plan_error(unknown[0], data[unknown[0]], f"unknown field of [plan]; valid fields are {sorted(known)}")
        if "mesh" not in data:
            raise ValueError("plan field 'mesh' is missing; give the axes, e.g. mesh = {dp = 2, pp = 2}")
        mesh = data["mesh"]
        if not isinstance(mesh, dict):
            raise plan_error("mesh", mesh, "expected a table of axis sizes, e.g. {dp = 2, pp = 2}")
        try:
            topology = Topology(tuple((str(k), v) for k, v in mesh.items()))
        except ValueError as exc:
            raise plan_error("mesh", mesh, str(exc)) from None
        if topology.size("tp_row") != topology.size("tp_col"):
            raise plan_error("mesh", str(topology), "a 2D tensor grid is square: tp_row = tp_col")
        mesh_layer = _mesh_layer(topology)
        layers = _layers_from_ranges(data["layers"], mesh_layer) if "layers" in data else (mesh_layer,)
        return cls(mesh=topology, pipeline=data.get("pipeline", {"kind": "none"}),
                   microbatches=data.get("microbatches", 1), partition=data.get("partition", "uniform"), layers=layers)


def _layer_ranges(layers: tuple[LayerPlan, ...]) -> list[dict[str, Any]]:
    """Consecutive equal layers as ``{"layers": "0-3", "dp": ..., ...}`` tables (``"all"`` for one entry)."""
    if len(layers) == 1:
        return [{"layers": "all", **_layer_fields(layers[0])}]
    out, start = [], 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or layers[i] != layers[start]:
            out.append({"layers": f"{start}-{i - 1}", **_layer_fields(layers[start])})
            start = i
    return out


def _layer_fields(layer: LayerPlan) -> dict[str, Any]:
    return {f.name: getattr(layer, f.name) for f in fields(layer) if f.name != "consecutive" or not layer.consecutive}


def _layers_from_ranges(ranges: Any, default: LayerPlan) -> tuple[LayerPlan, ...]:
    if not isinstance(ranges, list) or not ranges:
        raise plan_error("layers", ranges, "expected a list of tables like {layers = '0-3', dp = 'fsdp'}")
    out: list[LayerPlan] = []
    for i, entry in enumerate(ranges):
        if not isinstance(entry, dict) or "layers" not in entry:
            raise plan_error(f"layers[{i}]", entry, "expected a table with 'layers' = 'all' or a range like '0-3'")
        options = {k: v for k, v in entry.items() if k != "layers"}
        known = {f.name for f in fields(LayerPlan)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise plan_error(f"layers[{i}].{unknown[0]}", options[unknown[0]], f"valid fields are {sorted(known)}")
        layer = replace(default, **options) if options else default
        span = str(entry["layers"]).strip()
        if span == "all":
            if len(ranges) != 1:
                raise plan_error(f"layers[{i}].layers", span, "'all' must be the only layer range")
            return (layer,)
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", span)
        if not m:
            raise plan_error(f"layers[{i}].layers", span, "expected 'all', 'N' or 'A-B'")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if first != len(out) or last < first:
            raise plan_error(f"layers[{i}].layers", span, f"ranges must be consecutive from layer 0; "
                             f"expected one starting at {len(out)}")
        out.extend([layer] * (last - first + 1))
    return tuple(out)


# -- name parsing --------------------------------------------------------------------------------------------------------

_HEAD_RE = re.compile(
    r"^(?:dp(?P<dp>\d+)"
    r"|gropipe-(?P<g>\d+)x(?P<gs>\d+)-(?P<ginner>gpipe|1f1b)-m(?P<gm>\d+)-d(?P<gd>\d+)"
    r"|pp(?P<ps>\d+)-(?:(?P<psched>gpipe|1f1b)|interleaved-v(?P<pv>\d+))-m(?P<pm>\d+)"
    r"|async-(?P<ar>\d+)x(?P<as>\d+)-m(?P<am>\d+)"
    r"|torchpp(?P<ts>\d+)-(?P<tsched>gpipe|1f1b)-m(?P<tm>\d+)"
    r"|tp2d-(?P<q>\d+)x(?P<q2>\d+)-dp(?P<qdp>\d+)"
    r"|tp1d-(?P<t>\d+)-dp(?P<tdp>\d+))"
)
_EXAMPLES = ("'dp8', 'gropipe-2x4-1f1b-m8-d1', 'pp4-1f1b-m8', 'pp4-interleaved-v2-m8', 'async-2x4-m8', "
             "'torchpp2-1f1b-m4', 'tp2d-2x2-dp2', 'tp1d-4-dp2' (optionally with '-rc', '-fsdp', '-zero2', "
             "'-L[0-3=ddp.rc;4-9=ddp]' and '@0-3|4-9')")


def _parse_name(text: str) -> ParallelPlan:
    def bad(why: str) -> ValueError:
        return plan_error("name", text, f"{why}; expected e.g. {_EXAMPLES}")

    body, _, partition = text.partition("@")
    layers_text = None
    m_layers = re.search(r"-L\[([^\]]*)\]$", body)
    if m_layers:
        layers_text, body = m_layers.group(1), body[:m_layers.start()]
    head = _HEAD_RE.match(body)
    if not head:
        raise bad("unknown plan name")
    g = {k: int(v) if v and v.isdigit() else v for k, v in head.groupdict().items()}
    tokens = [t for t in body[head.end():].split("-") if t] if head.end() < len(body) else []
    if head.end() < len(body) and not body[head.end():].startswith("-"):
        raise bad(f"unexpected text {body[head.end():]!r}")
    mesh: dict[str, int] = {"dp": 1, "pp": 1}
    m, pipeline = 1, NoPipeline()
    async_options: dict[str, Any] = {}
    if g["dp"] is not None:
        mesh["dp"] = g["dp"]
    elif g["g"] is not None:
        mesh.update(dp=g["g"], pp=g["gs"])
        m, pipeline = g["gm"], {"kind": "gropipe", "inner": g["ginner"], "delay": g["gd"]}
    elif g["ps"] is not None:
        mesh["pp"], m = g["ps"], g["pm"]
        pipeline = {"kind": "interleaved", "chunks": g["pv"]} if g["pv"] is not None else {"kind": g["psched"]}
    elif g["ar"] is not None:
        mesh.update(dp=g["ar"], pp=g["as"])
        m, pipeline = g["am"], None
    elif g["ts"] is not None:
        mesh["pp"], m, pipeline = g["ts"], g["tm"], {"kind": "torch", "schedule": g["tsched"]}
    elif g["q"] is not None:
        if g["q"] != g["q2"]:
            raise bad(f"2D tensor grids are square, got {g['q']}x{g['q2']}")
        mesh.update(dp=g["qdp"], tp_row=g["q"], tp_col=g["q"])
    else:
        mesh.update(dp=g["tdp"], tp=g["t"])
    uniform = LayerPlan()
    for token in tokens:
        tp1 = re.fullmatch(r"tp1d(\d+)", token)
        tp2 = re.fullmatch(r"tp2d(\d+)x(\d+)", token)
        if re.fullmatch(r"m\d+", token) and isinstance(pipeline, NoPipeline):
            m = int(token[1:])
        elif tp1 and "tp" not in mesh and "tp_row" not in mesh:
            mesh["tp"] = int(tp1.group(1))
        elif tp2 and "tp" not in mesh and "tp_row" not in mesh:
            if tp2.group(1) != tp2.group(2):
                raise bad(f"2D tensor grids are square, got {token!r}")
            mesh.update(tp_row=int(tp2.group(1)), tp_col=int(tp2.group(2)))
        elif pipeline is None and token in ("2bw", "nostash", "vsync"):
            async_options.update({"2bw": {"mode": "2bw"}, "nostash": {"stash": False},
                                  "vsync": {"vertical_sync": True}}[token])
        elif pipeline is None and re.fullmatch(r"if\d+(\.\d+)*", token):
            depths = tuple(int(d) for d in token[2:].split("."))
            async_options["inflight"] = depths[0] if len(depths) == 1 and "." not in token else depths
        elif pipeline is None and re.fullmatch(r"adapt\d+", token):
            async_options["adapt_every"] = int(token[5:])
        elif pipeline is None and re.fullmatch(r"cap\d+(\.\d+)?", token):
            value = float(token[3:])
            async_options["memory_cap_mb"] = int(value) if value.is_integer() else value
        elif token in ("fsdp", "zero2"):
            uniform = replace(uniform, dp=_TEXT_DP[token])
        elif token == "rc":
            uniform = replace(uniform, recompute=True)
        else:
            raise bad(f"unknown part {token!r}")
    if pipeline is None:
        pipeline = {"kind": "async", **async_options}
    topology = Topology(tuple(mesh.items()))
    implied = _mesh_layer(topology)
    uniform = replace(uniform, tp=implied.tp, tp_degree=implied.tp_degree)
    layers: tuple[LayerPlan, ...] = (uniform,)
    if layers_text is not None:
        if uniform != LayerPlan(tp=uniform.tp, tp_degree=uniform.tp_degree):
            raise bad("give layer options either as '-rc'/'-fsdp'/'-zero2' or in '-L[...]', not both")
        layers = _parse_layer_runs(layers_text, bad)
    return ParallelPlan(mesh=topology, pipeline=pipeline, microbatches=m, partition=partition or "uniform",
                        layers=layers)


def _parse_layer_runs(text: str, bad) -> tuple[LayerPlan, ...]:
    out: list[LayerPlan] = []
    runs = [r for r in text.split(";") if r.strip()]
    for run in runs:
        span, sep, option = run.partition("=")
        if not sep:
            raise bad(f"layer run {run!r} needs 'range=option'")
        layer = LayerPlan.parse(option)
        if span.strip() == "all":
            if len(runs) != 1:
                raise bad("'all' must be the only layer run")
            return (layer,)
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", span.strip())
        if not m or int(m.group(1)) != len(out) or int(m.group(2) or m.group(1)) < int(m.group(1)):
            raise bad(f"layer runs must be consecutive from layer 0; got {span!r} after {len(out)} layers")
        out.extend([layer] * (int(m.group(2) or m.group(1)) - int(m.group(1)) + 1))
    if not out:
        raise bad("'-L[...]' lists no layers")
    return tuple(out)
