"""Pipeline kinds: one spec class each, registered by its kind.

Problem. Every room needs to know things about a pipeline schedule: the
parser its name, the config its fields, the planner which variants to try,
the runtime which strategy runs it, the memory model how many weight copies
it keeps. Written as ``isinstance`` ladders in each room, a new schedule
touched a dozen files and nothing listed them.

Approach. A pipeline kind is a frozen dataclass deriving from
:class:`PipelineSpec`. The class carries its fields (validated at
construction), its name token and parse rule, the checks it makes on a
whole plan, and a few class attributes the rooms read (``family``,
``runtime``, ``replicated``, ``split_backward``, ...). :func:`register_kind`
adds it to :data:`PIPELINE_KINDS`, the one table rooms consult; the kind's
generator is bound to it in ``workbench.scheduling.registry`` (one line),
which is also where a plan becomes its schedule. Adding a kind is that
spec, that generator and that line; the built-in kinds are defined here in
the same way as a user's own (``workbench.scheduling.registry.register``).

Standard library only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any, ClassVar

__all__ = [
    "PipelineSpec", "OnePipeline", "PIPELINE_KINDS", "register_kind", "plan_error", "pipeline_from_dict",
    "pipeline_to_dict", "NoPipeline", "GPipe", "OneFOneB", "Interleaved", "ZBH1", "ZBH2", "ZBV", "DualPipeV", "ZBAuto",
    "GroPipe", "AsyncPipeline", "TorchPipelining", "inner_kinds",
]

PIPELINE_KINDS: dict[str, type["PipelineSpec"]] = {}


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
    * ``searched``: the planner's template search tries it.
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
    @classmethod
    def search_variants(cls, *, stages: int, microbatches: int, replicas: int) -> list["PipelineSpec"]:
        """The specs of this kind the planner's template search tries at that shape (none: not tried there)."""
        if not cls.searched or (replicas > 1) != cls.replicated or stages < max(2, cls.min_stages):
            return []
        return [cls()]


def _split_bubble(p: int, m: int, backward: float, fill: float, text: str) -> tuple[float, str]:
    """A split-backward schedule whose fill and drain leave ``fill`` forwards idle per stage, over its makespan."""
    idle = (p - 1) * fill
    return idle / (m * (1 + backward) + idle), f"{text} = {idle:g}/({m}·{1 + backward:g}+{idle:g})"


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
    _check_choice("pipeline.kind", kind, tuple(PIPELINE_KINDS))
    cls = PIPELINE_KINDS[kind]
    known = {f.name for f in fields(cls)}
    options = {k: v for k, v in data.items() if k != "kind"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise plan_error(f"pipeline.{unknown[0]}", options[unknown[0]],
                         f"pipeline kind {kind!r} has no such field; its fields are {sorted(known) or 'none'}")
    return cls(**options)


def pipeline_to_dict(spec: PipelineSpec) -> dict[str, Any]:
    return {"kind": spec.kind, **{f.name: getattr(spec, f.name) for f in fields(spec)}}


def inner_kinds() -> tuple[str, ...]:
    """The kinds GroPipe can run inside its groups."""
    return tuple(k for k, cls in PIPELINE_KINDS.items() if cls.inner)


# -- the built-in kinds ------------------------------------------------------------------------------------------------

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


@register_kind
@dataclass(frozen=True)
class Interleaved(PipelineSpec):
    """Interleaved 1F1B: each rank holds ``chunks`` virtual stages, shrinking the bubble by that factor."""

    chunks: int = 2
    kind: ClassVar[str] = "interleaved"
    token: ClassVar[str] = "interleaved"
    per_layer: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_int("pipeline.chunks", self.chunks, 2)

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
    split_backward: ClassVar[bool] = True
    inner: ClassVar[bool] = True

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
    split_backward: ClassVar[bool] = True
    inner: ClassVar[bool] = True

    def uniform_bubble(self, stages: int, microbatches: int, backward: float = 2.0,
                       iterations: int = 1) -> tuple[float, str]:
        # nothing idle inside the iteration: what is left is the fill and drain of one forward per stage
        return _split_bubble(stages, microbatches, backward, 1.0, "(p-1)F/(m(F+I+W)+(p-1)F), 0 inside")


@dataclass(frozen=True)
class _VShape(OnePipeline):
    """Two chunks per rank folded into a V: rank ``r`` holds stages ``r`` and ``2p - 1 - r``."""

    chunks: int = 2
    min_stages: ClassVar[int] = 2

    def __post_init__(self) -> None:
        _check_int("pipeline.chunks", self.chunks, 2)
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


@register_kind
@dataclass(frozen=True)
class DualPipeV(_VShape):
    """DualPipeV: DeepSeek's DualPipe cut in half onto a V of two chunks per rank, micro-batches fed from one
    end, forward and backward chunks paired in the steady state, split backward; needs ``m >= 2p``."""

    kind: ClassVar[str] = "dualpipev"
    token: ClassVar[str] = "dualpipev"
    split_backward: ClassVar[bool] = True

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

    memory_limit_mb: float = 0.0
    kind: ClassVar[str] = "zb-auto"
    token: ClassVar[str] = "zbauto"
    split_backward: ClassVar[bool] = True
    uses_costs: ClassVar[bool] = True

    def __post_init__(self) -> None:
        limit = self.memory_limit_mb
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit < 0:
            raise plan_error("pipeline.memory_limit_mb", limit, "expected a number of MB >= 0 (0: the memory 1F1B "
                             "or ZB-H1 keeps in flight)")

    def tokens(self) -> list[str]:
        return [f"mem{self.memory_limit_mb:g}"] if self.memory_limit_mb else []

    @classmethod
    def take_token(cls, token: str, options: dict[str, Any]) -> bool:
        match = re.fullmatch(r"mem(\d+(?:\.\d+)?)", token)
        if match:
            value = float(match.group(1))
            options["memory_limit_mb"] = int(value) if value.is_integer() else value
        return bool(match)


@register_kind
@dataclass(frozen=True)
class GroPipe(PipelineSpec):
    """GroPipe: a pipeline per group (``inner`` schedule), a per-stage all-reduce across groups, ``delay``
    0 (applied this iteration) or 1 (applied next iteration, hidden behind its forwards)."""

    inner: str = "1f1b"
    delay: int = 0
    kind: ClassVar[str] = "gropipe"
    token: ClassVar[str] = "gropipe"
    family: ClassVar[str] = "gropipe"
    runtime: ClassVar[str] = "grouped"
    replicated: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_choice("pipeline.inner", self.inner, inner_kinds())
        _check_choice("pipeline.delay", self.delay, (0, 1))

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
    token: ClassVar[str] = "async"
    family: ClassVar[str] = "async"
    runtime: ClassVar[str] = "async"
    replicated: ClassVar[bool] = True
    min_stages: ClassVar[int] = 2
    streams_iterations: ClassVar[bool] = True
    accumulates: ClassVar[bool] = False

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
        _check_int("pipeline.adapt_every", self.adapt_every, 0)
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
        words = {"2bw": {"mode": "2bw"}, "nostash": {"stash": False}, "vsync": {"vertical_sync": True}}
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

    schedule: str = "1f1b"
    kind: ClassVar[str] = "torch"
    token: ClassVar[str] = "torchpp"
    family: ClassVar[str] = "torch"
    runtime: ClassVar[str] = "torch"
    min_stages: ClassVar[int] = 2
    accumulates: ClassVar[bool] = False
    searched: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_choice("pipeline.schedule", self.schedule, tuple(TORCH_SCHEDULES))

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
