"""What the fine-grained hybrid search answers: the templates, the per-layer model's estimate of a plan with
its stages and cost breakdown, the best plan of every template, and that estimate as the planner's.

Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ...core.partition import Partition
from ...core.plan import PIPELINE_KINDS, ParallelPlan, PipelineSpec
from ..costs.estimate import Estimate
from ..layerwise.layer_strategies import LayerStrategy
from ..layerwise.stage_search import StageAssignment

__all__ = ["StageEstimate", "HybridEstimate", "HybridResult", "as_estimate", "TEMPLATES", "TEMPLATE_TEXT",
           "TEMPLATE_SPLITS", "SCHEDULES", "SCHEDULE_TEXT", "schedules_text", "template_of"]

TEMPLATES = ("per-layer", "uniform", "dp", "fsdp", "3d")
# the pipeline schedules the per-layer search costs: the kinds that give their fill and drain
SCHEDULES = tuple(k for k, cls in PIPELINE_KINDS.items() if cls.fill_drain_ms is not PipelineSpec.fill_drain_ms)
SCHEDULE_TEXT = {k: PIPELINE_KINDS[k].title or k for k in SCHEDULES}


def schedules_text(conjunction: str = "and") -> str:
    """The schedules of :data:`SCHEDULES` in prose: ``1F1B, ZB-H1 and ZB-H2``."""
    words = list(SCHEDULE_TEXT.values())
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {conjunction} {words[-1]}"
TEMPLATE_SPLITS = 4  # the fastest template pipelines whose partitions the per-layer search also tries
TEMPLATE_TEXT = {"per-layer": "per-layer mix (dynamic programming)",
                 "uniform": "uniform plan (one strategy for every layer; layers its TP cannot split keep its DP kind)",
                  "dp": "pure DP (DDP)", "fsdp": "pure FSDP (ZeRO-3)", "3d": "Megatron-style 3D (PP x TP x DDP)"}


@dataclass(frozen=True)
class StageEstimate:
    """One pipeline stage of an estimated plan: its layers, ranks and per-layer assignment, with its time and
    memory."""

    first: int
    last: int
    first_rank: int
    devices: int
    in_flight: int
    assignment: StageAssignment

    @property
    def time_ms(self) -> float:
        return self.assignment.time_ms

    @property
    def memory_bytes(self) -> int:
        return self.assignment.memory_bytes

    def part(self, name: str) -> float:
        """Summed over the stage's layers: ``compute_ms``, ``tp_comm_ms`` or ``dp_comm_ms``."""
        return sum(getattr(c, name) for c in self.assignment.layer_costs)


@dataclass(frozen=True)
class HybridEstimate:
    """The per-layer model's estimate of one plan (found by :func:`search_hybrid` or given to :func:`cost_plan`):
    the plan, its stages, its iteration time and cost breakdown."""

    plan: ParallelPlan
    stages: tuple[StageEstimate, ...]
    template: str
    global_batch: int
    iteration_ms: float
    bubble_ms: float
    p2p_ms: float
    layer_names: tuple[str, ...] = field(repr=False)
    source: LayerStrategy | None = None  # the one strategy of a template's plan

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.global_batch / self.iteration_ms * 1e3

    @property
    def memory_bytes(self) -> int:
        """Memory of the fullest device."""
        return max(s.memory_bytes for s in self.stages)

    @property
    def strategies(self) -> tuple[LayerStrategy, ...]:
        return tuple(st for s in self.stages for st in s.assignment.strategies)

    def _critical(self) -> StageEstimate:
        return max(self.stages, key=lambda s: s.time_ms)

    def breakdown(self) -> dict[str, Any]:
        """Where the time goes on the slowest stage, and the memory of every stage."""
        crit = self._critical()
        return {"compute_ms": crit.part("compute_ms"), "tp_comm_ms": crit.part("tp_comm_ms"),
                "dp_comm_ms": crit.part("dp_comm_ms"), "transition_ms": crit.assignment.transition_ms,
                "bubble_ms": self.bubble_ms, "p2p_ms": self.p2p_ms,
                "stage_memory_gib": [s.memory_bytes / 2**30 for s in self.stages],
                "stage_ms": [s.time_ms for s in self.stages]}

    def layers(self) -> list[dict[str, Any]]:
        """One ``{"name", "tp", "dp_kind", "recompute", ...}`` per layer of the model."""
        out = []
        for stage_index, stage in enumerate(self.stages):
            for offset, s in enumerate(stage.assignment.strategies):
                out.append({"name": self.layer_names[stage.first + offset], "tp": s.tp_degree, "tp_kind": s.tp,
                            "dp_kind": s.dp, "recompute": s.recompute, "consecutive": s.consecutive,
                            "stage": stage_index})
        return out

    def to_dict(self) -> dict[str, Any]:
        mem = self.memory_bytes
        return {"name": self.name, "iteration_ms": self.iteration_ms, "throughput": self.throughput,
                "memory_gib": mem / 2**30, "template": self.template, "method": "per-layer model",
                "schedule": self.plan.pipeline.kind,
                "partition": self.plan.partition, **self.breakdown(), "layers": self.layers()}


@dataclass
class HybridResult:
    """The best plan of every template (``best["per-layer"]`` first), the plans behind them and the search cost."""

    best: dict[str, HybridEstimate]
    plans: list[HybridEstimate]
    searched: int
    elapsed_s: float
    budget_bytes: float
    pools: dict[int, tuple[LayerStrategy, ...]]  # per stage size, the strategies every layer chose from
    misses: dict[str, tuple[float, str]]  # template -> (least bytes per device it needs, why), when none fits

    def closest_miss(self, template: str = "per-layer") -> str:
        """Why ``template`` found no plan: its closest one and by how much it misses the budget."""
        if template not in self.misses:
            return ""
        need, reason = self.misses[template]
        return (f"closest: {reason}; {need / 2**30:.3f} GiB, {(need - self.budget_bytes) / 2**30:.3f} GiB over the "
                f"{self.budget_bytes / 2**30:.3f} GiB budget")

    def gain(self, template: str) -> float | None:
        """Per-layer plan's throughput over the template's, minus one (None when either found nothing)."""
        mine, theirs = self.best.get("per-layer"), self.best.get(template)
        if mine is None or theirs is None:
            return None
        return theirs.iteration_ms / mine.iteration_ms - 1


def template_of(strategy: LayerStrategy) -> set[str]:
    """The named templates a uniform strategy belongs to (besides ``uniform``)."""
    out = set()
    if strategy.tp_degree == 1 and strategy.dp == "replicate":
        out.add("dp")
    if strategy.tp_degree == 1 and strategy.dp == "fsdp":
        out.add("fsdp")
    if strategy.tp in ("none", "1d") and strategy.consecutive and strategy.dp == "replicate":
        out.add("3d")
    return out


def _template_names(strategy: LayerStrategy, pp: int, templates: Sequence[str]) -> list[str]:
    """The templates a uniform plan of ``strategy`` at pipeline degree ``pp`` stands for."""
    names = {"uniform"} | template_of(strategy)
    if pp > 1:
        names -= {"dp", "fsdp"}
    elif strategy.tp_degree == 1:
        names.discard("3d")  # no pipeline and no TP: that is pure DP
    return sorted(names & set(templates) - {"per-layer"})


def as_estimate(found: HybridEstimate) -> Estimate:
    """A per-layer estimate as the planner's :class:`~workbench.planning.costs.estimate.Estimate`: compute of the
    slowest stage, the bubble, and as exposed communication its TP, DP and transition time plus the boundary
    transfers."""
    b = found.breakdown()
    exposed = b["tp_comm_ms"] + b["dp_comm_ms"] + b["transition_ms"] + found.p2p_ms
    partition = Partition.parse(found.plan.partition) if found.plan.pp > 1 else None
    detail = {k: v for k, v in b.items() if k not in ("bubble_ms",)}
    return Estimate(found.plan, found.iteration_ms, found.throughput, found.memory_bytes, b["compute_ms"],
                    found.bubble_ms, exposed, "per-layer DP", partition,
                    detail={**detail, "template": found.template, "layers": found.layers()})
