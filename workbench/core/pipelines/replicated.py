"""The kinds that run several pipeline replicas themselves: GroPipe's groups and the asynchronous pipeline."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ..fields import Rule, boolean, check_choice, choice, integer, number, spec, validate
from .base import PIPELINE_KINDS, PipelineSpec, inner_kinds, plan_error, register_kind

__all__ = ["GroPipe", "AsyncPipeline"]


@register_kind
@dataclass(frozen=True)
class GroPipe(PipelineSpec):
    """GroPipe: a pipeline per group (``inner`` schedule), a per-stage all-reduce across groups, ``delay``
    0 (applied this iteration) or 1 (applied next iteration, hidden behind its forwards)."""

    inner: str = "1f1b"
    delay: int = spec(0, choice((0, 1)))
    kind: ClassVar[str] = "gropipe"
    token: ClassVar[str] = "gropipe"
    family: ClassVar[str] = "gropipe"
    runtime: ClassVar[str] = "grouped"
    replicated: ClassVar[bool] = True

    def __post_init__(self) -> None:
        validate(self, "pipeline.", plan_error)
        check_choice("pipeline.inner", self.inner, inner_kinds(), error=plan_error)  # the kinds registered by now

    @property
    def delayed_update(self) -> bool:
        return self.delay > 0

    @property
    def inner_spec(self) -> PipelineSpec:
        return PIPELINE_KINDS[self.inner]()

    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str] | None:
        return self.inner_spec.uniform_bubble(stages, microbatches, backward, iterations)

    @property
    def split_backward(self) -> bool:  # type: ignore[override]
        return self.inner_spec.split_backward

    def head(self, plan: Any) -> str:
        return f"gropipe-{plan.dp}x{plan.pp}-{PIPELINE_KINDS[self.inner].token}-m{plan.microbatches}-d{self.delay}"

    @classmethod
    def head_pattern(cls) -> str:
        words = "|".join(re.escape(PIPELINE_KINDS[k].token) for k in inner_kinds())
        return rf"gropipe-(?P<dp>\d+)x(?P<pp>\d+)-(?P<inner>{words})-m(?P<m>\d+)-d(?P<delay>\d+)"

    @classmethod
    def from_head(cls, groups: dict[str, str]) -> tuple[dict[str, int], int, dict[str, Any]]:
        mesh, m, options = super().from_head(groups)
        options["inner"] = next(k for k in inner_kinds() if PIPELINE_KINDS[k].token == groups["inner"])
        return mesh, m, options

    @classmethod
    def search_variants(cls, *, stages: int, microbatches: int, replicas: int) -> list[PipelineSpec]:
        if replicas < 2:
            return []
        return [cls(inner=inner, delay=delay) for inner in ("gpipe", "1f1b") for delay in (0, 1)]


@register_kind
@dataclass(frozen=True)
class AsyncPipeline(PipelineSpec):
    """PipeDream-style asynchronous 1F1B with no flush between iterations.

    ``mode`` ``stash`` keeps the weight version each in-flight micro-batch
    used (``stash = false`` shows the unstashed, inconsistent variant);
    ``2bw`` keeps two versions and coalesces gradients. ``inflight`` is
    micro-batches in flight per stage, or ``auto`` (profiled, under
    ``memory_cap_mb``; 0 = no cap). ``split`` runs each backward as its
    input gradient (I), sent upstream at once, then its weight gradients
    (W) on the same weight version, at the fused stream's memory.
    ``adapt_every`` > 0 re-decides the
    in-flight depths and the stash mode after that many steps from the
    stage times and memory the run measured (the stream drains there; the
    interval doubles while decisions change nothing); 0 keeps the launch's
    choice.
    """

    mode: str = spec("stash", choice(("stash", "2bw")))
    stash: bool = spec(True, boolean())
    vertical_sync: bool = spec(False, boolean())
    inflight: str | int | tuple[int, ...] = spec("auto", Rule(
        lambda v: v == "auto" or integer(1).accepts(v) or (isinstance(v, (list, tuple)) and bool(v)
                                                          and all(integer(1).accepts(d) for d in v)),
        "'auto', an int >= 1 (micro-batches in flight on every stage) or one such int per stage",
        convert=lambda v: tuple(v) if isinstance(v, list) else v,
        schema={"anyOf": [{"const": "auto"}, integer(1).schema, {"type": "array", "items": integer(1).schema}]}))
    memory_cap_mb: float = spec(0.0, number(0, expected="a number >= 0 (0: no cap)"))
    adapt_every: int = spec(0, integer(0))
    split: bool = spec(False, boolean())
    kind: ClassVar[str] = "async"
    token: ClassVar[str] = "async"
    family: ClassVar[str] = "async"
    runtime: ClassVar[str] = "async"
    replicated: ClassVar[bool] = True
    min_stages: ClassVar[int] = 2
    streams_iterations: ClassVar[bool] = True
    accumulates: ClassVar[bool] = False

    def __post_init__(self) -> None:
        validate(self, "pipeline.", plan_error)
        self._check_modes()

    def _check_modes(self) -> None:
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

    @property
    def split_backward(self) -> bool:  # type: ignore[override]
        return self.split

    def check(self, plan: Any) -> None:
        super().check(plan)
        if self.mode == "2bw" and plan.microbatches < plan.pp:
            raise plan_error("microbatches", plan.microbatches, f"mode '2bw' coalesces gradients over at least "
                             f"the pipeline depth: use microbatches >= pp ({plan.pp})")

    def head(self, plan: Any) -> str:
        return f"async-{plan.dp}x{plan.pp}-m{plan.microbatches}"

    def tokens(self) -> list[str]:
        out = (["2bw"] if self.mode == "2bw" else []) + ([] if self.stash else ["nostash"])
        out += ["vsync"] if self.vertical_sync else []
        out += ["split"] if self.split else []
        if self.inflight != "auto":
            depths = self.inflight if isinstance(self.inflight, tuple) else (self.inflight,)
            out.append("if" + ".".join(map(str, depths)))
        out += [f"cap{self.memory_cap_mb:g}"] if self.memory_cap_mb else []
        return out + ([f"adapt{self.adapt_every}"] if self.adapt_every else [])

    @classmethod
    def head_pattern(cls) -> str:
        return r"async-(?P<dp>\d+)x(?P<pp>\d+)-m(?P<m>\d+)"

    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str]:
        # no flush between iterations: one fill and one drain for all of them
        p, m, n = stages, microbatches, iterations
        return (p - 1) / (n * m + p - 1), f"(p-1)/(n·m+p-1) = {p - 1}/({n}·{m}+{p - 1})"

    @classmethod
    def take_token(cls, token: str, options: dict[str, Any]) -> bool:
        words = {"2bw": {"mode": "2bw"}, "nostash": {"stash": False}, "vsync": {"vertical_sync": True},
                 "split": {"split": True}}
        if token in words:
            options.update(words[token])
        elif re.fullmatch(r"if\d+(\.\d+)*", token):
            depths = tuple(int(d) for d in token[2:].split("."))
            options["inflight"] = depths[0] if "." not in token else depths
        elif re.fullmatch(r"adapt\d+", token):
            options["adapt_every"] = int(token[5:])
        elif re.fullmatch(r"cap\d+(\.\d+)?", token):
            value = float(token[3:])
            options["memory_cap_mb"] = int(value) if value.is_integer() else value
        else:
            return False
        return True

    @classmethod
    def search_variants(cls, *, stages: int, microbatches: int, replicas: int) -> list[PipelineSpec]:
        return [cls()] if stages >= 2 else []
