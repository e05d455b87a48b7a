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

Standard library only: the plan is read by the planner and the job monitor
in kernels that never import torch, and it imports nothing above ``core``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from .partition import Partition
from .pipelines import (PIPELINE_KINDS, AsyncPipeline, DualPipeV, GPipe, GroPipe, Interleaved, NoPipeline, OneFOneB,
                        PipelineSpec, TorchPipelining, ZBAuto, ZBH1, ZBH2, ZBV, _check_bool, _check_choice, _check_int,
                        pipeline_from_dict, pipeline_to_dict, plan_error)
from .topology import Topology

__all__ = [
    "ParallelPlan", "LayerPlan", "PipelineSpec", "NoPipeline", "GPipe", "OneFOneB", "Interleaved", "GroPipe",
    "AsyncPipeline", "TorchPipelining", "ZBH1", "ZBH2", "ZBV", "DualPipeV", "ZBAuto", "PIPELINE_KINDS",
    "PLAN_FAMILIES", "DP_KINDS", "TP_KINDS", "plan_error",
]

DP_KINDS = ("replicate", "zero2", "fsdp")  # DDP; shard gradients + optimizer state; shard everything
TP_KINDS = ("none", "1d", "2d")
_DP_TEXT = {"replicate": "ddp", "zero2": "zero2", "fsdp": "fsdp"}
_TEXT_DP = {v: k for k, v in _DP_TEXT.items()}


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


# the planner's families of plans, as tables and the ``kinds`` filter name them
PLAN_FAMILIES = ("dp", "pipeline", "gropipe", "async", "tp2d", "tp1d", "torch")


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
        self.pipeline.check(self)
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
        _check_int("num_layers", num_layers, 1)
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
        spec, dp, m = self.pipeline, self.dp, self.microbatches
        if isinstance(spec, NoPipeline):
            if self.tp_kind == "2d":
                head = f"tp2d-{self.q}x{self.q}-dp{dp}"
            elif self.tp_kind == "1d":
                head = f"tp1d-{self.tp}-dp{dp}"
            else:
                head = f"dp{dp}"
            tokens = [f"m{m}"] if m > 1 else []
        else:
            head, tokens = spec.head(self), spec.tokens()
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

# the heads of plans without a pipeline; a pipeline kind's head is its spec's (PipelineSpec.head_pattern)
_PLAIN_HEAD_RE = re.compile(r"dp(?P<dp>\d+)|tp2d-(?P<q>\d+)x(?P<q2>\d+)-dp(?P<qdp>\d+)|tp1d-(?P<t>\d+)-dp(?P<tdp>\d+)")
_EXAMPLES = ("'dp8', 'gropipe-2x4-1f1b-m8-d1', 'pp4-1f1b-m8', 'pp4-zbh1-m8', 'pp4-interleaved-v2-m8', 'async-2x4-m8', "
             "'torchpp2-1f1b-m4', 'tp2d-2x2-dp2', 'tp1d-4-dp2' (optionally with '-rc', '-fsdp', '-zero2', "
             "'-L[0-3=ddp.rc;4-9=ddp]' and '@0-3|4-9')")


def _match_head(body: str) -> tuple[dict[str, int], int, Any, int] | None:
    """(mesh sizes, micro-batches, pipeline spec class + options or NoPipeline, end of the head) or None."""
    for cls in PIPELINE_KINDS.values():
        if cls is NoPipeline:
            continue
        match = re.match(cls.head_pattern(), body)
        if match and (match.end() == len(body) or body[match.end()] == "-"):
            mesh, m, options = cls.from_head(match.groupdict())
            return mesh, m, (cls, options), match.end()
    match = _PLAIN_HEAD_RE.match(body)
    if not match or (match.end() < len(body) and body[match.end()] != "-"):
        return None
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "dp" in g:
        mesh = {"dp": g["dp"]}
    elif "q" in g:
        if g["q"] != g["q2"]:
            raise ValueError(f"2D tensor grids are square, got {g['q']}x{g['q2']}")
        mesh = {"dp": g["qdp"], "tp_row": g["q"], "tp_col": g["q"]}
    else:
        mesh = {"dp": g["tdp"], "tp": g["t"]}
    return mesh, 1, (NoPipeline, {}), match.end()


def _parse_name(text: str) -> ParallelPlan:
    def bad(why: str) -> ValueError:
        return plan_error("name", text, f"{why}; expected e.g. {_EXAMPLES}")

    body, _, partition = text.partition("@")
    layers_text = None
    m_layers = re.search(r"-L\[([^\]]*)\]$", body)
    if m_layers:
        layers_text, body = m_layers.group(1), body[:m_layers.start()]
    try:
        head = _match_head(body)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if head is None:
        raise bad("unknown plan name")
    mesh, m, (spec_cls, options), end = head
    mesh.setdefault("pp", 1)
    uniform = LayerPlan()
    for token in [t for t in body[end:].split("-") if t]:
        tp1 = re.fullmatch(r"tp1d(\d+)", token)
        tp2 = re.fullmatch(r"tp2d(\d+)x(\d+)", token)
        if spec_cls.take_token(token, options):
            continue
        if re.fullmatch(r"m\d+", token) and spec_cls is NoPipeline:
            m = int(token[1:])
        elif tp1 and "tp" not in mesh and "tp_row" not in mesh:
            mesh["tp"] = int(tp1.group(1))
        elif tp2 and "tp" not in mesh and "tp_row" not in mesh:
            if tp2.group(1) != tp2.group(2):
                raise bad(f"2D tensor grids are square, got {token!r}")
            mesh.update(tp_row=int(tp2.group(1)), tp_col=int(tp2.group(2)))
        elif token in ("fsdp", "zero2"):
            uniform = replace(uniform, dp=_TEXT_DP[token])
        elif token == "rc":
            uniform = replace(uniform, recompute=True)
        else:
            raise bad(f"unknown part {token!r}")
    topology = Topology(tuple(mesh.items()))
    implied = _mesh_layer(topology)
    uniform = replace(uniform, tp=implied.tp, tp_degree=implied.tp_degree)
    layers: tuple[LayerPlan, ...] = (uniform,)
    if layers_text is not None:
        if uniform != LayerPlan(tp=uniform.tp, tp_degree=uniform.tp_degree):
            raise bad("give layer options either as '-rc'/'-fsdp'/'-zero2' or in '-L[...]', not both")
        layers = _parse_layer_runs(layers_text, bad)
    return ParallelPlan(mesh=topology, pipeline={"kind": spec_cls.kind, **options}, microbatches=m,
                        partition=partition or "uniform", layers=layers)


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
