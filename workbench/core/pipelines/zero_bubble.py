"""The zero-bubble kinds: a split backward (input gradients I, weight gradients W) fills the bubbles.

ZB-H1 and ZB-H2 on one stage per rank, ZB-V and DualPipeV on a V of two
chunks per rank, and the automatic schedule built from the stages' costs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ..fields import integer, number, spec, validate
from .base import OnePipeline, plan_error, register_kind

__all__ = ["ZBH1", "ZBH2", "ZBV", "DualPipeV", "ZBAuto"]


def _split_bubble(p: int, m: int, backward: float, fill: float, text: str) -> tuple[float, str]:
    """A split-backward schedule whose fill and drain leave ``fill`` forwards idle per stage, over its makespan."""
    idle = (p - 1) * fill
    return idle / (m * (1 + backward) + idle), f"{text} = {idle:g}/({m}·{1 + backward:g}+{idle:g})"


@register_kind
@dataclass(frozen=True)
class ZBH1(OnePipeline):
    """Zero bubble H1: 1F1B with the weight gradients (W) deferred into the bubbles, at 1F1B's memory.

    The backward splits into the input gradient (I), which the previous
    stage waits for, and the weight gradient (W), which only the step needs;
    stage ``s`` postpones its first ``s`` W's, so the backward wave carries
    I alone. Bubble ``(p - 1)(F + I - W)`` against 1F1B's ``(p - 1)(F + I + W)``.
    """

    kind: ClassVar[str] = "zbh1"
    token: ClassVar[str] = "zbh1"
    title: ClassVar[str] = "ZB-H1"
    split_backward: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True
    inner: ClassVar[bool] = True

    def fill_drain_ms(self, stages: int, microbatches: int, forward: float, input_grad: float,
                      weight_grad: float) -> float:
        """``(p - 1)(F + I - W)``, never less than ``p - 1`` forwards (the last stage starts that late in any
        flushed schedule) nor ``p - 1`` input gradients (the wave that drains it)."""
        f, i, w = forward, input_grad, weight_grad
        return (stages - 1) * max(f + i - w, f, i)

    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str]:
        # (p - 1)(F + I - W) with I = W: one forward per stage
        return _split_bubble(stages, microbatches, backward, 1.0, "(p-1)(F+I-W)/(m(F+I+W)+(p-1)(F+I-W))")


@register_kind
@dataclass(frozen=True)
class ZBH2(OnePipeline):
    """Zero bubble H2: more warm-up forwards and W's moved to the tail, no bubble inside, about twice the
    activations of 1F1B (``2p - 1`` micro-batches on the first stage)."""

    kind: ClassVar[str] = "zbh2"
    token: ClassVar[str] = "zbh2"
    title: ClassVar[str] = "ZB-H2"
    split_backward: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True
    inner: ClassVar[bool] = True

    def fill_drain_ms(self, stages: int, microbatches: int, forward: float, input_grad: float,
                      weight_grad: float) -> float:
        """Where its ``2p - 1`` micro-batches in flight can run ahead (``m >= 2p - 1``): ``(p - 1) F``, the fill
        alone, while the weight gradients it defers cover the drain (``I <= 2W`` and ``I <= 2F``), else
        ``p - 1`` times the larger of ``F + I - 2W`` and ``I - F``; with fewer micro-batches, ZB-H1's."""
        f, i, w = forward, input_grad, weight_grad
        if microbatches < 2 * stages - 1:
            return ZBH1().fill_drain_ms(stages, microbatches, f, i, w)
        return (stages - 1) * max(f, f + i - 2 * w, i - f)

    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str]:
        # nothing idle inside the iteration: what is left is the fill and drain of one forward per stage
        return _split_bubble(stages, microbatches, backward, 1.0, "(p-1)F/(m(F+I+W)+(p-1)F), 0 inside")


@dataclass(frozen=True)
class _VShape(OnePipeline):
    """Two chunks per rank folded into a V: rank ``r`` holds stages ``r`` and ``2p - 1 - r``."""

    chunks: int = spec(2, integer(2))
    min_stages: ClassVar[int] = 2

    def __post_init__(self) -> None:
        validate(self, "pipeline.", plan_error)
        if self.chunks % 2:
            raise plan_error("pipeline.chunks", self.chunks, "a V-shaped schedule folds the stages back onto the "
                             "same ranks, so each rank holds an even number of chunks (2)")
        if self.chunks != 2:
            raise plan_error("pipeline.chunks", self.chunks, "V-shaped schedules here hold 2 chunks per rank")

    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str] | None:
        # at F = I = W the V turns on the last rank, so the fill and drain cost one chunk's forward (half a
        # stage's) per rank; with other ratios the V's steady state has gaps of its own and no closed form here
        if backward != 2.0:
            return None
        return _split_bubble(stages, microbatches, backward, 0.5, "(p-1)F/2/(m(F+I+W)+(p-1)F/2)")


@register_kind
@dataclass(frozen=True)
class ZBV(_VShape):
    """ZB-V: two chunks per rank in a V, split backward, zero bubble in the steady state at 1F1B's memory."""

    kind: ClassVar[str] = "zbv"
    token: ClassVar[str] = "zbv"
    split_backward: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True


@register_kind
@dataclass(frozen=True)
class DualPipeV(_VShape):
    """DualPipeV: DeepSeek's DualPipe cut in half onto a V of two chunks per rank, micro-batches fed from one
    end, forward and backward chunks paired in the steady state, split backward; needs ``m >= 2p``."""

    kind: ClassVar[str] = "dualpipev"
    token: ClassVar[str] = "dualpipev"
    split_backward: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True

    def check(self, plan: Any) -> None:
        super().check(plan)
        if plan.microbatches < 2 * plan.pp:
            raise plan_error("microbatches", plan.microbatches, f"DualPipeV fills both arms of the V before its "
                             f"steady state: use at least 2 x pp = {2 * plan.pp} micro-batches")


@register_kind
@dataclass(frozen=True)
class ZBAuto(OnePipeline):
    """The automatic zero-bubble schedule: built from the stages' real F, I, W and message times under a
    per-rank activation memory limit (``memory_limit_mb``; 0: the most any rank keeps under 1F1B or ZB-H1,
    so by default it is never slower than ZB-H1)."""

    memory_limit_mb: float = spec(0.0, number(0, finite=True, expected="a number of MB >= 0 (0: the memory 1F1B or "
                                                             "ZB-H1 keeps in flight)"))
    kind: ClassVar[str] = "zb-auto"
    token: ClassVar[str] = "zbauto"
    split_backward: ClassVar[bool] = True
    uses_costs: ClassVar[bool] = True

    def __post_init__(self) -> None:
        validate(self, "pipeline.", plan_error)

    def tokens(self) -> list[str]:
        return [f"mem{self.memory_limit_mb:g}"] if self.memory_limit_mb else []

    @classmethod
    def take_token(cls, token: str, options: dict[str, Any]) -> bool:
        match = re.fullmatch(r"mem(\d+(?:\.\d+)?)", token)
        if match:
            value = float(match.group(1))
            options["memory_limit_mb"] = int(value) if value.is_integer() else value
        return bool(match)
