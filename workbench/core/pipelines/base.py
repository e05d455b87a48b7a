"""What a pipeline kind is: the spec base class, the table of kinds and a spec's ``[plan.pipeline]`` table.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ..fields import ErrorForm, check_choice, field_error, reject_unknown

__all__ = ["PipelineSpec", "OnePipeline", "PIPELINE_KINDS", "register_kind", "plan_error", "pipeline_from_dict",
           "pipeline_to_dict", "inner_kinds"]

PIPELINE_KINDS: dict[str, type["PipelineSpec"]] = {}


plan_error: ErrorForm = field_error("plan")
"""A ValueError that names the plan field, the value and what would be valid."""


def register_kind(cls: type["PipelineSpec"]) -> type["PipelineSpec"]:
    """Add a spec class to :data:`PIPELINE_KINDS` (a class decorator); a kind is registered once."""
    if not (isinstance(cls, type) and issubclass(cls, PipelineSpec)) or not cls.kind:
        raise ValueError(f"register_kind takes a PipelineSpec subclass with a kind, got {cls!r}")
    known = PIPELINE_KINDS.get(cls.kind)
    if known is not None and known is not cls:
        raise ValueError(f"pipeline kind {cls.kind!r} is already registered by {known.__module__}.{known.__name__}")
    if cls.token and any(k.token == cls.token and k is not cls for k in PIPELINE_KINDS.values()):
        raise ValueError(f"name token {cls.token!r} of {cls.__name__} is already used by another pipeline kind")
    PIPELINE_KINDS[cls.kind] = cls
    return cls


@dataclass(frozen=True)
class PipelineSpec:
    """What one pipeline kind is: its fields, its name, its checks, and what the rooms need to know of it.

    Class attributes a kind sets:

    * ``kind``: the ``[plan.pipeline] kind`` and the registry key;
    * ``token``: its word in plan names (``pp4-<token>-m8``);
    * ``family``: the planner's family (``pipeline``, ``gropipe``, ``async``, ``torch``);
    * ``runtime``: the runtime strategy that runs it: ``pipeline`` (the workbench's interpreter),
      ``grouped`` (the same with GroPipe's groups and their all-reduce), ``async`` (the asynchronous pipeline's runtime),
      ``torch`` (torch's own schedules); ``none`` without a pipeline;
    * ``replicated``: it runs ``dp`` pipelines side by side itself (else ``dp`` must be 1);
    * ``min_stages``: the fewest stages it runs on;
    * ``streams_iterations``: one schedule spans every iteration (no flush between steps);
    * ``split_backward``: it runs input and weight gradients as separate actions (I, W);
    * ``per_layer``: the layer-by-layer runtime runs per-layer options inside it;
    * ``inner``: GroPipe can run it inside each group;
    * ``accumulates``: its runtime accumulates several batches per step (``grad_accum``);
    * ``uses_costs``: its schedule is built from the stages' measured costs (the run profiles them);
    * ``searched``: the planner's template search tries it;
    * ``title``: its name in prose (``ZB-H1``; default the kind).

    A kind the per-layer search costs gives its fill and drain (:meth:`fill_drain_ms`).
    """

    kind: ClassVar[str] = ""
    token: ClassVar[str] = ""
    family: ClassVar[str] = "pipeline"
    runtime: ClassVar[str] = "pipeline"
    replicated: ClassVar[bool] = False
    min_stages: ClassVar[int] = 1
    streams_iterations: ClassVar[bool] = False
    split_backward: ClassVar[bool] = False
    per_layer: ClassVar[bool] = False
    inner: ClassVar[bool] = False
    accumulates: ClassVar[bool] = True
    searched: ClassVar[bool] = True
    uses_costs: ClassVar[bool] = False
    title: ClassVar[str] = ""

    @property
    def chunks(self) -> int:
        """Virtual stages per rank."""
        return 1

    @property
    def delayed_update(self) -> bool:
        """Whether an iteration's step applies the previous iteration's gradients."""
        return False

    def check(self, plan: Any) -> None:
        """Refuse a plan shape this kind cannot run (``plan`` is the :class:`ParallelPlan` being built)."""
        if not self.replicated and plan.dp != 1:
            raise plan_error("mesh.dp", plan.dp, f"pipeline kind {self.kind!r} runs one pipeline: set dp = 1 "
                             f"(GroPipe and the asynchronous pipeline run several replicas)")
        if plan.pp < self.min_stages:
            raise plan_error("mesh.pp", plan.pp, f"pipeline kind {self.kind!r} cuts the model into stages: use "
                             f"pp >= {self.min_stages}")

    # -- the plan name ---------------------------------------------------------------------------------------------
    def head(self, plan: Any) -> str:
        """The plan name's head for this spec in ``plan``."""
        raise NotImplementedError

    def tokens(self) -> list[str]:
        """Option words after the head (``2bw``, ``if3``, ...)."""
        return []

    @classmethod
    def head_pattern(cls) -> str:
        """A regular expression for the head; groups ``dp``, ``pp``, ``m`` and the kind's own."""
        raise NotImplementedError

    @classmethod
    def from_head(cls, groups: dict[str, str]) -> tuple[dict[str, int], int, dict[str, Any]]:
        """(mesh sizes, micro-batches, spec options) from the head's groups."""
        options = {k: _number(v) for k, v in groups.items() if k not in ("dp", "pp", "m") and v is not None}
        mesh = {"dp": int(groups.get("dp") or 1), "pp": int(groups["pp"])}
        return mesh, int(groups["m"]), options

    @classmethod
    def take_token(cls, token: str, options: dict[str, Any]) -> bool:
        """Read one option word of a name into ``options``; False when it is not this kind's."""
        return False

    # -- teaching ------------------------------------------------------------------------------------------------------
    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str] | None:
        """The textbook bubble fraction on identical stages with free messages (forward 1, backward ``backward``
        per rank, a split one half input and half weight gradient), with its formula; None: no closed form."""
        return None

    # -- the planner ---------------------------------------------------------------------------------------------------
    def fill_drain_ms(self, stages: int, microbatches: int, forward: float, input_grad: float,
                      weight_grad: float) -> float | None:
        """The idle time a flushed iteration adds to the slowest stage's own work when that stage takes
        ``forward`` (F), ``input_grad`` (I) and ``weight_grad`` (W) ms a micro-batch, as the simulator gives it
        on equal stages; None: the per-layer search does not cost this kind."""
        return None

    @classmethod
    def search_variants(cls, *, stages: int, microbatches: int, replicas: int) -> list["PipelineSpec"]:
        """The specs of this kind the planner's template search tries at that shape (none: not tried there)."""
        if not cls.searched or (replicas > 1) != cls.replicated or stages < max(2, cls.min_stages):
            return []
        return [cls()]


def _number(text: str) -> Any:
    return int(text) if text.isdigit() else text


@dataclass(frozen=True)
class OnePipeline(PipelineSpec):
    """A single pipeline named ``pp<S>-<token>-m<m>``: most kinds need nothing more."""

    def head(self, plan: Any) -> str:
        return f"pp{plan.pp}-{self.token}-m{plan.microbatches}"

    @classmethod
    def head_pattern(cls) -> str:
        return rf"pp(?P<pp>\d+)-{re.escape(cls.token)}-m(?P<m>\d+)"


def pipeline_from_dict(data: Any) -> PipelineSpec:
    """A spec from its ``[plan.pipeline]`` table (or a spec itself), every bad field named."""
    if isinstance(data, PipelineSpec):
        return data
    if not isinstance(data, dict) or "kind" not in data:
        raise plan_error("pipeline", data, f"expected a table with 'kind' = one of {', '.join(PIPELINE_KINDS)}")
    kind = data["kind"]
    check_choice("pipeline.kind", kind, tuple(PIPELINE_KINDS), error=plan_error)
    cls = PIPELINE_KINDS[kind]
    options = {k: v for k, v in data.items() if k != "kind"}
    reject_unknown(options, [f.name for f in fields(cls)], "pipeline.", plan_error,
                   unknown=f"pipeline kind {kind!r} has no such field; its fields are")
    return cls(**options)


def pipeline_to_dict(spec: PipelineSpec) -> dict[str, Any]:
    return {"kind": spec.kind, **{f.name: getattr(spec, f.name) for f in fields(spec)}}


def inner_kinds() -> tuple[str, ...]:
    """The kinds GroPipe can run inside its groups."""
    return tuple(k for k, cls in PIPELINE_KINDS.items() if cls.inner)
