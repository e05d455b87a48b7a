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
* ``pipeline``: the schedule kind, a :class:`~workbench.core.pipelines.PipelineSpec`
  (one frozen dataclass per kind with only its own fields, registered by
  kind in :data:`~workbench.core.pipelines.PIPELINE_KINDS`);
* ``partition``: ``"uniform"``, ``"ampa"`` or explicit ranges such as
  ``"0-3|4-9"``, resolved when the model is known;
* ``layers``: per-layer :class:`LayerPlan` options (data-parallel kind,
  tensor-parallel kind and degree, recomputation); one entry means every
  layer uses it.

:attr:`ParallelPlan.name` is a canonical text form that
:meth:`ParallelPlan.parse` reads back (each kind's spec says how its own
part reads); ``workbench.scheduling.registry.schedule_for`` is the one
place where a plan becomes a :class:`~workbench.core.ir.Schedule`::

    dp8                          8 data-parallel replicas
    dp4-m2                       4 replicas, 2 micro-batches each
    pp4-1f1b-m8                  one 4-stage 1F1B pipeline, 8 micro-batches
    pp4-interleaved-v2-m8        interleaved 1F1B, 2 chunks per rank
    pp4-zbh1-m8                  zero-bubble H1 (also zbh2, zbv, dualpipev, zbauto-mem512)
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

:class:`LayerPlan` and its ``[[plan.layers]]`` ranges live in
:mod:`~workbench.core.layer_plan`, the name's writer and parser in
:mod:`~workbench.core.plan_names`; both are re-exported here.

Standard library only: the plan is read by the planner and the job monitor
in kernels that never import torch, and it imports nothing above ``core``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from .fields import check_int, reject_unknown
from .layer_plan import DP_KINDS, TP_KINDS, LayerPlan, _layer_ranges, _layers_from_ranges, _mesh_layer
from .partition import Partition
from .pipelines import (PIPELINE_KINDS, AsyncPipeline, DualPipeV, GPipe, GroPipe, Interleaved, NoPipeline, OneFOneB,
                        PipelineSpec, TorchPipelining, ZBAuto, ZBH1, ZBH2, ZBV, pipeline_from_dict, pipeline_to_dict,
                        plan_error)
from .plan_names import plan_fields_from_name, plan_name
from .topology import Topology

__all__ = [
    "ParallelPlan", "LayerPlan", "PipelineSpec", "NoPipeline", "GPipe", "OneFOneB", "Interleaved", "GroPipe",
    "AsyncPipeline", "TorchPipelining", "ZBH1", "ZBH2", "ZBV", "DualPipeV", "ZBAuto", "PIPELINE_KINDS",
    "PLAN_FAMILIES", "DP_KINDS", "TP_KINDS", "plan_error",
]

# the planner's families of plans, as tables and the ``kinds`` filter name them
PLAN_FAMILIES = ("dp", "pipeline", "gropipe", "async", "tp2d", "tp1d", "torch")


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
        object.__setattr__(self, "pipeline", pipeline_from_dict(self.pipeline))
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
        # canonical: one entry when every layer has the same options (what the plan's name says), so a table that
        # lists equal options range by range is the plan its name parses back to
        distinct = set({id(l): l for l in layers}.values())  # equal layers are often one object: hash each once
        object.__setattr__(self, "layers", tuple(layers) if len(distinct) > 1 else (layers[0],))
        check_int("microbatches", self.microbatches, 1, error=plan_error)
        if not isinstance(self.partition, str) or not self.partition.strip():
            raise plan_error("partition", self.partition, "expected 'uniform', 'ampa' or ranges like '0-3|4-9'")
        if self.partition not in ("uniform", "ampa"):
            try:
                ranges = Partition.parse(self.partition)
            except ValueError as exc:
                raise plan_error("partition", self.partition, f"expected 'uniform', 'ampa' or ranges like "
                                 f"'0-3|4-9' ({exc})") from None
            if ranges.num_stages != self.num_virtual_stages:
                raise plan_error("partition", self.partition, f"it has {ranges.num_stages} "
                                 f"stages; this plan has {self.num_virtual_stages} (pp x chunks)")
        self._check_shape()

    def _check_shape(self) -> None:
        self.pipeline.check(self)
        tp_kind, tp = self.tp_kind, self.tp
        for i, layer in enumerate(self.layers):
            if layer.tp != "none" and layer.tp != tp_kind:
                raise plan_error(f"layers[{i}].tp", layer.tp, f"the mesh has {tp_kind.upper()} tensor parallelism "
                                 f"({str(self.mesh)})")
            if layer.tp != "none" and tp % layer.tp_degree:
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
        return self.pipeline.chunks

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
        if self.pipeline.runtime != "none":
            return self.pipeline.family
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
        check_int("num_layers", num_layers, 1, error=plan_error)
        if len(self.layers) == 1:
            return self.layers * num_layers
        if len(self.layers) != num_layers:
            raise plan_error("layers", f"{len(self.layers)} entries", f"the model has {num_layers} layers; give one "
                             f"option per layer, or one for all")
        return self.layers

    # -- what the pipeline kind says -----------------------------------------------------------------------------------
    @property
    def is_scheduled(self) -> bool:
        """Whether the workbench's own interpreter runs a pipeline schedule for this plan."""
        return self.pipeline.runtime in ("pipeline", "grouped", "async")

    @property
    def gradient_buffer(self) -> str:
        """Where the runtime gathers a step's weight gradients over its micro-batches: ``"flat"`` (GroPipe: every
        micro-batch adds into a zeroed flat buffer, which the step divides by the groups and zeroes), ``"grads"``
        (the pipelines: the first micro-batch's gradients are kept, later ones added to them), ``""`` (neither:
        no pipeline, or the asynchronous pipeline's stashed versions)."""
        return {"grouped": "flat", "pipeline": "grads"}.get(self.pipeline.runtime, "")

    @property
    def iterates_across_steps(self) -> bool:
        """Whether one schedule spans every iteration (no flush between steps: the asynchronous pipeline)."""
        return self.pipeline.streams_iterations

    @property
    def delayed_update(self) -> bool:
        """Whether an iteration's step applies the previous iteration's all-reduced gradients (GroPipe delay 1)."""
        return self.pipeline.delayed_update

    @property
    def split_backward(self) -> bool:
        """Whether the schedule runs input and weight gradients as separate actions (zero-bubble kinds)."""
        return self.pipeline.split_backward

    @classmethod
    def for_pipeline(cls, kind: str, stages: int, microbatches: int, *, groups: int = 1, partition: str = "uniform",
                     **options: Any) -> "ParallelPlan":
        """The plan of a pipeline kind chosen in a widget or on the command line (:data:`PIPELINE_KINDS`).

        ``groups`` replicas apply to the kinds that run several (GroPipe, the
        asynchronous pipeline); ``options`` (``chunks``, ``inner``, ``delay``,
        ...) to the kinds with such a field. Options of other kinds are
        ignored, so one set of controls can drive every kind.
        """
        if kind not in PIPELINE_KINDS or kind == NoPipeline.kind:
            raise plan_error("pipeline.kind", kind, f"valid pipeline kinds are "
                             f"{', '.join(k for k in PIPELINE_KINDS if k != NoPipeline.kind)}")
        spec_cls = PIPELINE_KINDS[kind]
        known = {f.name for f in fields(spec_cls)}
        spec = spec_cls(**{k: v for k, v in options.items() if k in known})
        replicas = groups if spec_cls.replicated else 1
        return cls(Topology(dp=replicas, pp=stages), spec, microbatches, partition)

    # -- derived plans -----------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> "ParallelPlan":
        return replace(self, **changes)

    def with_layers(self, layers: LayerPlan | tuple[LayerPlan, ...]) -> "ParallelPlan":
        return replace(self, layers=layers)

    # -- text ---------------------------------------------------------------------------------------------------------
    @cached_property
    def name(self) -> str:
        return plan_name(self)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> "ParallelPlan":
        """The inverse of :attr:`name`."""
        if not isinstance(name, str) or not name.strip():
            raise plan_error("name", name, "expected a plan name such as 'dp8' or 'gropipe-2x4-1f1b-m8-d1'")
        try:
            return ParallelPlan(**plan_fields_from_name(name.strip()))
        except ValueError as exc:
            if "plan field" in str(exc):
                raise
            raise plan_error("name", name.strip(), str(exc)) from None  # e.g. a mesh axis of size 0

    # -- dict / TOML ---------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``[plan]`` table: mesh sizes, pipeline, micro-batches, partition and layer ranges."""
        out: dict[str, Any] = {
            "mesh": {n: s for n, s in self.mesh.axes if s > 1 or n == "dp"},
            "pipeline": pipeline_to_dict(self.pipeline),
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
        reject_unknown(data, ("mesh", "pipeline", "microbatches", "partition", "layers"), error=plan_error,
                       unknown="unknown field of [plan]; valid fields are")
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
