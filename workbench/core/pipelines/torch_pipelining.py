"""torch.distributed.pipelining's own schedules, run by torch as peer baselines."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ..fields import choice, spec, validate
from .base import PipelineSpec, plan_error, register_kind

__all__ = ["TorchPipelining", "TORCH_SCHEDULES"]

# torch.distributed.pipelining's schedules the workbench runs as baselines: name -> virtual stages per rank
TORCH_SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved-zb": 2, "zbv": 2, "dualpipev": 2}


@register_kind
@dataclass(frozen=True)
class TorchPipelining(PipelineSpec):
    """torch.distributed.pipelining's own ``schedule`` (a peer baseline, run by torch, not by the workbench).

    ``gpipe`` and ``1f1b`` hold one stage per rank; ``interleaved-zb``
    (``ScheduleInterleavedZeroBubble``), ``zbv`` (``ScheduleZBVZeroBubble``)
    and ``dualpipev`` (``ScheduleDualPipeV``) hold two, the first looped and
    the others in a V, as the workbench's own kinds of those names.
    """

    schedule: str = spec("1f1b", choice(TORCH_SCHEDULES))
    kind: ClassVar[str] = "torch"
    token: ClassVar[str] = "torchpp"
    family: ClassVar[str] = "torch"
    runtime: ClassVar[str] = "torch"
    min_stages: ClassVar[int] = 2
    accumulates: ClassVar[bool] = False
    searched: ClassVar[bool] = False

    def __post_init__(self) -> None:
        validate(self, "pipeline.", plan_error)

    @property
    def chunks(self) -> int:
        return TORCH_SCHEDULES[self.schedule]

    @property
    def split_backward(self) -> bool:  # type: ignore[override]
        return self.chunks > 1

    def head(self, plan: Any) -> str:
        return f"torchpp{plan.pp}-{self.schedule}-m{plan.microbatches}"

    @classmethod
    def head_pattern(cls) -> str:
        words = "|".join(re.escape(s) for s in TORCH_SCHEDULES)
        return rf"torchpp(?P<pp>\d+)-(?P<schedule>{words})-m(?P<m>\d+)"
