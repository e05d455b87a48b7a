"""The kinds flushed every iteration with whole backwards (GPipe, 1F1B, interleaved 1F1B), and no pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..fields import integer, spec, validate
from .base import OnePipeline, PipelineSpec, plan_error, register_kind

__all__ = ["NoPipeline", "GPipe", "OneFOneB", "Interleaved"]


@register_kind
@dataclass(frozen=True)
class NoPipeline(PipelineSpec):
    """The whole model on every replica (data and tensor parallelism only); its names are the plan's own."""

    kind: ClassVar[str] = "none"
    family: ClassVar[str] = "dp"
    runtime: ClassVar[str] = "none"
    replicated: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True
    searched: ClassVar[bool] = False

    def check(self, plan: Any) -> None:
        if plan.pp != 1:
            raise plan_error("mesh.pp", plan.pp, "a plan without a pipeline has one stage: set pp = 1 or give a "
                             "pipeline")


@dataclass(frozen=True)
class _Flushed(OnePipeline):
    """A pipeline of whole backwards flushed every iteration: ``(p - 1) / (m + p - 1)`` of it idle."""

    per_layer: ClassVar[bool] = True
    inner: ClassVar[bool] = True

    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str]:
        p, m = stages, microbatches
        return (p - 1) / (m + p - 1), f"(p-1)/(m+p-1) = {p - 1}/({m}+{p - 1})"


@register_kind
@dataclass(frozen=True)
class GPipe(_Flushed):
    """All forwards, then all backwards; a flush each iteration."""

    kind: ClassVar[str] = "gpipe"
    token: ClassVar[str] = "gpipe"


@register_kind
@dataclass(frozen=True)
class OneFOneB(_Flushed):
    """One forward, one backward in steady state: at most ``p - s`` micro-batches in flight on stage ``s``."""

    kind: ClassVar[str] = "1f1b"
    token: ClassVar[str] = "1f1b"
    title: ClassVar[str] = "1F1B"

    def fill_drain_ms(self, stages: int, microbatches: int, forward: float, input_grad: float,
                      weight_grad: float) -> float:
        """``(p - 1)(F + I + W)``: the slowest stage's whole micro-batch, ``p - 1`` times."""
        return (stages - 1) * (forward + input_grad + weight_grad)


@register_kind
@dataclass(frozen=True)
class Interleaved(PipelineSpec):
    """Interleaved 1F1B: each rank holds ``chunks`` virtual stages, shrinking the bubble by that factor."""

    chunks: int = spec(2, integer(2))
    kind: ClassVar[str] = "interleaved"
    token: ClassVar[str] = "interleaved"
    per_layer: ClassVar[bool] = True

    def __post_init__(self) -> None:
        validate(self, "pipeline.", plan_error)

    def check(self, plan: Any) -> None:
        super().check(plan)
        if plan.microbatches % plan.pp:
            raise plan_error("microbatches", plan.microbatches, f"interleaved 1F1B needs a multiple of pp "
                             f"({plan.pp})")

    def head(self, plan: Any) -> str:
        return f"pp{plan.pp}-interleaved-v{self.chunks}-m{plan.microbatches}"

    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str]:
        p, m, v = stages, microbatches, self.chunks
        return (p - 1) / (v * m + p - 1), f"(p-1)/(v·m+p-1) = {p - 1}/({v}·{m}+{p - 1})"

    @classmethod
    def head_pattern(cls) -> str:
        return r"pp(?P<pp>\d+)-interleaved-v(?P<chunks>\d+)-m(?P<m>\d+)"

    @classmethod
    def search_variants(cls, *, stages: int, microbatches: int, replicas: int) -> list[PipelineSpec]:
        return [cls(chunks=2)] if replicas == 1 and stages >= 2 and microbatches % stages == 0 else []
