"""The planner: which mix of data, pipeline and tensor parallelism is fastest for this model on this cluster.

Problem. A researcher has a profiled model (``ModelCosts``), a cluster and a
global batch, and asks which strategy to launch, with how many
micro-batches, and why. The space (:mod:`.space`) holds hundreds of points
for 64 devices; simulating each is too slow for an interactive answer.

Approach (two passes). Every valid strategy is first *projected* with the
closed form (:func:`~workbench.planning.costs.estimate.project`: AMPA partition under the memory
cap, ``(m + S - 1) x bottleneck``, exposed gradient all-reduce); strategies
that cannot fit are kept with the reason. The ``simulate_top`` fastest are
then *simulated* (:func:`~workbench.planning.costs.estimate.estimate`: the runtime's own schedule on
the cluster's links with the overlap slowdown) and ranked by the simulated
time; the table says which method produced each row. With ``fine_grained``
the pipelines that miss the memory cap also get a per-layer recomputation
choice by dynamic programming over layers (:mod:`~workbench.planning.layerwise.finegrained`).

``plan(workload, cluster, budget, options)`` (the typed values of
:mod:`.request`) returns a :class:`PlanResult`: a ranked pandas table (name,
iteration_ms, throughput, memory_gib, compute_ms, bubble_ms,
exposed_comm_ms, feasible, reason), the :class:`RankedPlan` objects (plan,
estimate, simulated timeline, ``to_config()`` for the jobs room) and the
infeasible strategies with their reasons. When nothing fits, the error names
the strategy that comes closest and by how much it misses.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from ...core.config import RunConfig, merge_changes
from ...core.costs import ClusterSpec, ModelCosts
from ...core.plan import ParallelPlan
from ...core.timeline import Timeline
from ...scheduling.simulate import SimResult
from ..costs.clusters import load_cluster, shared_cores
from ..costs.compute_scaling import (ComputeModel, RuntimeCalibration, compute_models, profiled_compute_models,
                                     scale_compute)
from ..costs.estimate import GIB, CostContext, Estimate, cost_context, estimate, project
from ..costs.run_calibration import calibrate_from_run
from ..costs.tensor_costs import TransformerShape
from ..layerwise.layer_strategies import decision_trees, stage_strategies
from .hybrid import SCHEDULE_TEXT, TEMPLATE_TEXT, HybridEstimate, HybridResult, as_estimate, search_hybrid
from .hybrid_results import schedules_text
from .progress import Progress, SearchProgress
from .request import Budget, SearchOptions, Workload
from .space import TP_FAMILIES, check_plan, enumerate_strategies, runtime_refusal, tensor_parallel_note
from .world_sizes import add_fewer_ranks

__all__ = ["plan", "RankedPlan", "PlanResult", "transformer_shape", "TABLE_COLUMNS"]

TABLE_COLUMNS = ["rank", "name", "iteration_ms", "throughput", "memory_gib", "compute_ms", "bubble_ms",
                 "exposed_comm_ms", "method", "partition", "feasible", "reason"]
_NEEDS = re.compile(r"needs (\d+(?:\.\d+)?) GiB")


def transformer_shape(config: dict[str, Any], batch: int) -> TransformerShape:
    """A GPT-2 / BERT config (transformers key names, plus ``seq_len``) as a :class:`TransformerShape`."""
    keys = [("hidden", ("n_embd", "hidden_size")), ("heads", ("n_head", "num_attention_heads")),
            ("layers", ("n_layer", "num_hidden_layers")), ("vocab", ("vocab_size",)),
            ("positions", ("n_positions", "max_position_embeddings"))]
    values = {}
    for name, options in keys:
        found = [config[k] for k in options if config.get(k) is not None]
        if not found:
            raise ValueError(f"transformer config has no {' / '.join(options)}; got keys {sorted(config)}")
        values[name] = found[0]
    inner = config.get("n_inner") or config.get("intermediate_size") or 0
    return TransformerShape(**values, batch=batch, seq=int(config.get("seq_len", 128)), inner=inner)


@dataclass(frozen=True)
class RankedPlan:
    """One ranked strategy: its plan, its estimate, its timeline and the launch config that runs it."""

    plan: ParallelPlan
    estimate: Estimate
    model: str
    global_batch: int
    rank: int = 0
    layer_names: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def strategy(self) -> ParallelPlan:
        """The same :class:`ParallelPlan` as ``plan`` (``strategy`` is its key in :meth:`to_dict`)."""
        return self.plan

    @property
    def sim(self) -> SimResult | None:
        """The simulated run (None for closed-form estimates: tensor parallelism, unsimulated projections)."""
        return self.estimate.sim

    def timeline(self) -> Timeline | None:
        """Predicted events to draw with ``workbench.viz`` (None when only projected)."""
        e = self.estimate
        return e.timeline if e.timeline is not None or e.make_timeline is None else e.make_timeline()

    def to_config(self, **overrides: Any) -> RunConfig:
        """The :class:`~workbench.core.config.RunConfig` that launches this plan (``overrides`` win), with the
        partition the estimate found; a plan the runtime cannot run yet is refused here, with the reason."""
        plan = self.plan
        if self.estimate.partition is not None and plan.pp > 1:
            plan = plan.replace(partition=str(self.estimate.partition))
        data: dict[str, Any] = {"model": self.model, "name": self.plan.name, "plan": plan.to_dict(),
                                "training": {"global_batch": self.global_batch}}
        if self.estimate.detail.get("placement"):  # the devices the estimate's links assumed
            data["run"] = {"placement": list(self.estimate.detail["placement"])}
        return RunConfig.from_dict(merge_changes(data, overrides))

    def layers(self) -> list[dict[str, Any]]:
        """Every layer's options: ``{"name", "tp", "dp_kind", "recompute"}`` (plus the TP kind and grouping)."""
        if "layers" in self.estimate.detail:
            return self.estimate.detail["layers"]
        names = self.layer_names or tuple(f"layer_{i}" for i in range(len(self.plan.layers)))
        return [{"name": name, "tp": l.tp_degree, "tp_kind": l.tp, "dp_kind": l.dp, "recompute": l.recompute,
                 "consecutive": l.consecutive} for name, l in zip(names, self.plan.layers_for(len(names)))]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, **self.estimate.to_dict(), "layers": self.layers(),
                "strategy": self.plan.to_dict()}


@dataclass
class PlanResult:
    """Ranked plans (fastest first), the strategies that cannot run with why, and the search's own cost."""

    plans: list[RankedPlan]
    infeasible: list[dict[str, Any]]
    cluster: ClusterSpec
    global_batch: int
    searched: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    per_layer: "HybridResult | None" = None  # the per-layer search's own result (fine_grained)
    interrupted: bool = False  # the search was stopped: the plans are the best found so far
    fewer_ranks: dict[str, Any] | None = None  # where ranks share cores: the smaller worlds planned too (world_sizes)

    @property
    def best(self) -> RankedPlan:
        return self.plans[0]

    def __getitem__(self, name: str) -> RankedPlan:
        for p in self.plans:
            if p.name == name:
                return p
        raise KeyError(f"no feasible plan named {name!r}; feasible: {[p.name for p in self.plans[:10]]} ...")

    def rows(self) -> list[dict[str, Any]]:
        out = [{**{k: v for k, v in p.estimate.to_dict().items() if k in TABLE_COLUMNS}, "rank": p.rank,
                "feasible": True, "reason": ""} for p in self.plans]
        out += [{"rank": None, "name": i["name"], "feasible": False, "reason": i["reason"]} for i in self.infeasible]
        return out

    @property
    def table(self):
        """The ranked pandas DataFrame (feasible rows first, then infeasible ones with the reason)."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=TABLE_COLUMNS)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster.name, "global_batch": self.global_batch, "searched": self.searched,
                "elapsed_s": self.elapsed_s, "interrupted": self.interrupted, "notes": self.notes,
                "best": self.best.name,
                "strategies": [p.to_dict() for p in self.plans], "infeasible": self.infeasible,
                **({"per_layer": _per_layer_dict(self.per_layer)} if self.per_layer is not None else {}),
                **({"fewer_ranks": self.fewer_ranks} if self.fewer_ranks is not None else {})}


def _per_layer_dict(found: "HybridResult") -> dict[str, Any]:
    """The per-layer search in JSON: each template's best plan in the same cost model, the gains, the misses."""
    return {"searched": found.searched, "elapsed_s": found.elapsed_s, "budget_gib": found.budget_bytes / GIB,
            "best": {name: p.to_dict() for name, p in found.best.items()},
            "gain": {name: found.gain(name) for name in found.best if name != "per-layer"},
            "misses": {name: found.closest_miss(name) for name in found.misses}}


def _closest_miss(infeasible: list[dict[str, Any]], cap: int | None) -> str:
    needs = [(float(m.group(1)), i["name"]) for i in infeasible if (m := _NEEDS.search(i["reason"]))]
    if not needs or cap is None:
        return f"; {_named(infeasible[0])}" if infeasible else ""
    need, name = min(needs)
    return (f"; closest is {name}, which needs {need:.3f} GiB per device, {need - cap / GIB:.3f} GiB over the "
            f"{cap / GIB:.3f} GiB budget")


def _runnable(plans: list, workload: Workload, infeasible: list[dict[str, Any]], notes: list[str]) -> list:
    """``plans`` (ParallelPlans or Estimates) but those whose tensor parallelism the runtime refuses for this model
    (:func:`~.space.runtime_refusal`), which go to ``infeasible`` with the reason, under one note."""
    kept, reasons = [], []
    for p in plans:
        strategy = p if isinstance(p, ParallelPlan) else p.strategy
        reason = runtime_refusal(strategy, model=workload.costs.model, shaped=workload.shape is not None,
                                 tp_limits=workload.tp_limits)
        if reason:
            reasons.append(f"{strategy.name}: {reason}")
            infeasible.append({"name": strategy.name, "reason": reason})
        else:
            kept.append(p)
    note = tensor_parallel_note(workload.costs.model, reasons) if reasons else None
    if note and note not in notes:
        notes.append(note)
    return kept


def _named(refused: dict[str, Any]) -> str:
    """An infeasible strategy's reason, headed by its name unless the reason starts with it."""
    name, reason = refused["name"], refused["reason"]
    return reason if reason.startswith(name) else f"{name}: {reason}"


def _candidates(workload: Workload, world: int, options: SearchOptions, notes: list[str],
                infeasible: list[dict[str, Any]]) -> list[ParallelPlan]:
    """The strategies to cost: the given ones, checked against the model and the devices (those whose tensor
    parallelism the runtime refuses go to ``infeasible``), or the whole space; only those of the allowed
    pipeline degrees (with a note saying so)."""
    costs, shape, batch = workload.costs, workload.shape, workload.global_batch
    heads, hidden = (shape.heads, shape.hidden) if shape else (None, None)
    if options.strategies is not None:
        chosen = _runnable(list(options.strategies), workload, infeasible, notes)
        for s in chosen:
            if s.world_size != world:
                raise ValueError(f"strategy {s.name} uses {s.world_size} devices, not the world size {world}")
            check_plan(s, num_layers=costs.num_layers, global_batch=batch, num_heads=heads, hidden=hidden)
    else:
        chosen = enumerate_strategies(world, num_layers=costs.num_layers, global_batch=batch, num_heads=heads,
                                      hidden=hidden, kinds=options.kinds, recompute_options=options.recompute,
                                      microbatch_options=options.microbatch_options)
        if shape is None and world > 1 and set(TP_FAMILIES) & set(options.kinds):
            notes.append(tensor_parallel_note(costs.model))
    degrees = options.pipeline_degrees
    if degrees is not None:
        chosen = [s for s in chosen if s.pp in degrees]
        notes.append(f"only pipeline degree{'s' if len(degrees) > 1 else ''} {', '.join(map(str, degrees))} considered")
    return chosen


def _compute_models(workload: Workload, spec: ClusterSpec, world: int, options: SearchOptions,
                    notes: list[str]) -> dict[str, ComputeModel]:
    """Each runtime family's compute against the profile: from the calibration's runs where there are any, else
    from the profile's own micro-batch passes (on a node whose ranks share its cores); noted."""
    costs, load = workload.costs, options.background_load
    if options.calibration is None:
        models = profiled_compute_models(costs, min(world, spec.devices_per_node), shared_cores(spec), load)
        notes += [m.describe() for m in models.values()]
        return models
    resolved = [c if isinstance(c, RuntimeCalibration) else
                calibrate_from_run(costs, c, cluster=spec, background_load=load, shape=workload.shape)
                for c in options.calibration]
    models = compute_models(resolved)
    for cal in resolved:
        notes.append(f"{cal.strategy or cal.source}: {cal.family} runtime's compute calibrated by "
                     f"{cal.compute_scale:.3f} x the profile ({cal.events} measured events"
                     f"{f', micro-batch {cal.microbatch_size}' if cal.microbatch_size else ''})")
    notes += [m.describe() for m in models.values()]
    return models


def _rank(ctx: CostContext, candidates: list[ParallelPlan], options: SearchOptions,
          infeasible: list[dict[str, Any]], progress: SearchProgress) -> tuple[list[Estimate], int]:
    """Every candidate projected (or, when the strategies are given, simulated) and the ``simulate_top`` fastest
    projections simulated; those that cannot run go to ``infeasible``. The estimates, and how many projected."""
    projected: list[Estimate] = []

    def first(s: ParallelPlan) -> None:
        try:
            projected.append(estimate(ctx, s) if options.strategies is not None else project(ctx, s))
        except ValueError as exc:
            infeasible.append({"name": s.name, "reason": " ".join(str(exc).split())})

    progress.run("projecting" if options.strategies is None else "simulating", candidates, first)
    projected.sort(key=lambda e: (e.iteration_ms, e.strategy.world_size, e.strategy.name))
    simulated: dict[ParallelPlan, Estimate | None] = {}

    def again(e: Estimate) -> None:
        try:
            simulated[e.strategy] = estimate(ctx, e.strategy)
        except ValueError as exc:
            simulated[e.strategy] = None
            infeasible.append({"name": e.strategy.name, "reason": " ".join(str(exc).split())})

    progress.run("simulating", [e for e in projected[:options.simulate_top] if e.method == "projected"], again)
    final = [simulated.get(e.strategy, e) for e in projected]
    return [e for e in final if e is not None], len(projected)


def _fine_grained(ctx: CostContext, workload: Workload, world: int, options: SearchOptions,
                  candidates: list[ParallelPlan], final: list[Estimate], infeasible: list[dict[str, Any]],
                  notes: list[str]) -> "HybridResult | None":
    """Add the per-layer plans to ``final``: recomputation per layer of the pipelines that miss the budget, and
    the per-layer search's distinct mixes with the uniform template beside them unless ``final`` holds it
    already (costed the same way); the per-layer search's own result."""
    from ..layerwise.finegrained import selective_recompute_plans

    final += selective_recompute_plans(ctx, [s for s in candidates if not s.recompute], infeasible)
    hybrid = _per_layer_search(ctx, workload.costs, world, workload.optimizer, notes, options.pipeline_degrees,
                               workload.layer_kinds(), workload.max_layer_tp(ctx.cluster.devices_per_node))
    if hybrid is not None and "per-layer" in hybrid.best:
        final += [as_estimate(p) for p in _distinct_mixes(hybrid)]
        uniform = hybrid.best.get("uniform")
        if uniform is not None and uniform.plan not in {e.strategy for e in final}:
            final.append(as_estimate(uniform))  # the template to compare with, costed the same way
    return hybrid


def plan(workload: Workload, cluster: ClusterSpec | str | Path, budget: Budget = Budget(),
         options: SearchOptions = SearchOptions(), *, progress: Progress | None = None) -> PlanResult:
    """Rank the strategies for ``workload`` on ``cluster`` within ``budget`` (see the module docstring).

    ``cluster``: a :class:`~workbench.core.costs.ClusterSpec`, a preset name
    (``8xV100-PCIe``, ``local``, ...) or a ``ClusterSpec`` JSON file
    (all-reduces reach its ``collective_link`` where it has one). The
    :class:`~.request.Workload`, :class:`~.request.Budget` and
    :class:`~.request.SearchOptions` say what is trained, what the plan may
    use and how to search. ``progress(phase, done, total)`` is told how far
    each phase has got (:mod:`.progress`); an interruption (Ctrl-C, a kernel
    interrupt) ends the search with the best plans found so far, which the
    result's ``interrupted`` and notes say.
    """
    started = time.perf_counter()
    for name, value, kind in (("workload", workload, Workload), ("budget", budget, Budget),
                              ("options", options, SearchOptions)):
        if not isinstance(value, kind):
            raise ValueError(f"plan() {name} must be a {kind.__name__}, got {type(value).__name__}")
    spec = load_cluster(cluster)
    world = budget.devices(spec)
    notes: list[str] = []
    models = _compute_models(workload, spec, world, options, notes)
    ctx = cost_context(workload.costs, spec, workload.global_batch, world_size=world,
                       memory_cap_bytes=budget.memory_cap_bytes, shape=workload.shape, optimizer=workload.optimizer,
                       background_load=options.background_load, compute_models=models)
    infeasible: list[dict[str, Any]] = []
    candidates = _candidates(workload, world, options, notes, infeasible)
    steps = SearchProgress(progress)
    final, projected = _rank(ctx, candidates, options, infeasible, steps)
    found: list[HybridResult | None] = [None]
    if options.fine_grained:
        steps.run("per-layer search", [final], lambda ranked: found.__setitem__(0, _fine_grained(
            ctx, workload, world, options, candidates, ranked, infeasible, notes)))
        final = _runnable(final, workload, infeasible, notes)
    hybrid = found[0]
    if steps.interrupted is not None:
        if not final:
            raise KeyboardInterrupt(f"the search was interrupted before any plan was estimated ({steps.interrupted})")
        notes.insert(0, f"interrupted: the best plans found so far ({steps.interrupted})")
    fewer = None
    if options.fewer_ranks and spec.shared_compute and options.strategies is None and world > 1 \
            and steps.interrupted is None:
        smaller = replace(options, fewer_ranks=False, fine_grained=False, top=None)
        fewer = add_fewer_ranks(world, final, lambda w: plan(workload, spec, replace(budget, world_size=w), smaller),
                                notes, shared_cores(spec))
    if not final:
        raise ValueError(f"no strategy for {workload.costs.model} on {world} devices of {ctx.cluster.name} fits"
                         f"{_closest_miss(infeasible, ctx.cap)}")
    final.sort(key=lambda e: (e.method == "projected", e.iteration_ms, e.strategy.name))
    if options.top is not None:
        final = final[:options.top]
    names = tuple(l.name for l in workload.costs.layers)
    plans = [RankedPlan(e.strategy, e, workload.costs.model, workload.global_batch, rank=i + 1, layer_names=names)
             for i, e in enumerate(final)]
    if options.strategies is None:
        notes.append(f"the {min(options.simulate_top, projected)} fastest projections are simulated; the rest are "
                     f"ranked by the closed form")
    return PlanResult(plans, infeasible, ctx.cluster, workload.global_batch,
                      len(candidates) + (fewer["searched"] if fewer else 0), time.perf_counter() - started, notes,
                      hybrid, interrupted=steps.interrupted is not None, fewer_ranks=fewer)


def _per_layer_search(ctx, costs: ModelCosts, world: int, optimizer: str, notes: list[str],
                      pipeline_degrees: Sequence[int] | None = None, kinds=None,
                      max_tp: int | None = None) -> "HybridResult | None":
    """The per-layer programme (:mod:`.hybrid`) on the context's cluster and budget (``kinds`` and ``max_tp``: what
    the runtime splits, see ``Workload.tp_limits``), with a note of what it found against the templates costed the
    same way; None (and a note) where its trees do not apply."""
    if world & (world - 1):
        notes.append(f"the per-layer search splits devices by powers of two; {world} devices is not one")
        return None
    scaled = scale_compute(costs, ctx.compute_scale(world)) if ctx.cluster.shared_compute else costs
    try:
        found = search_hybrid(scaled, ctx.cluster, ctx.global_batch, budget_bytes=ctx.cap, world_size=world,
                              optimizer=optimizer, pp_options=pipeline_degrees, kinds=kinds, max_tp=max_tp)
    except ValueError as exc:
        notes.append(f"per-layer search: {exc}")
        return None
    stage = max(found.pools)  # the largest stage searched (the whole world unless the pipeline degree is fixed)
    notes.append(f"per-layer search: {len(decision_trees(stage))} decision trees on {stage} devices; "
                 f"{len(stage_strategies(stage))} strategies per layer on a stage of {stage} before recomputation "
                 f"(DDP or FSDP beside TP), {len(found.pools[stage])} with ZeRO-2 and recomputation; pipelines with "
                 f"the {schedules_text()} schedules; {found.searched} stage searches in {found.elapsed_s:.2f} s")
    if "per-layer" not in found.best:
        notes.append(f"per-layer search: nothing fits; {found.closest_miss()}")
        return found
    mine = found.best["per-layer"]
    if mine.plan.pp > 1:
        notes.append(f"per-layer model: {mine.name} runs the {SCHEDULE_TEXT[mine.plan.pipeline.kind]} schedule "
                     f"({mine.bubble_ms:.3g} ms of fill and drain, {mine.bubble_ms / mine.iteration_ms:.1%} of the "
                     f"iteration)")
    for name in ("uniform", "dp", "fsdp", "3d"):
        theirs = found.best.get(name)
        if theirs is not None:
            notes.append(f"per-layer model: {mine.name} {mine.iteration_ms:.1f} ms against the best "
                         f"{TEMPLATE_TEXT[name]} {theirs.name} {theirs.iteration_ms:.1f} ms "
                         f"({found.gain(name):+.1%} throughput)")
        elif name in found.misses:
            notes.append(f"per-layer model: no {TEMPLATE_TEXT[name]} fits; {found.closest_miss(name)}")
    return found


def _distinct_mixes(found: "HybridResult", limit: int = 3) -> list["HybridEstimate"]:
    """The best per-layer plan and the next fastest ones with other names (at most ``limit``)."""
    out, seen = [found.best["per-layer"]], {found.best["per-layer"].plan}
    for p in found.plans:
        if len(out) >= limit:
            break
        if p.source is None and p.plan not in seen:
            out.append(p)
            seen.add(p.plan)
    return out
