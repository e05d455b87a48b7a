"""One fine-grained hybrid search's state: stage searches cached across partitions, and a stage split turned
into a timed plan.

A stage's ranks follow the plan's mesh (data parallelism outermost), its
assignment is the per-layer programme's (:func:`~workbench.planning.layerwise.stage_search.search_stage`)
or a template's one strategy, under the schedule being searched (its
micro-batches in flight per stage; a zero-bubble schedule's split backward);
a split becomes a :class:`~workbench.core.plan.ParallelPlan` and its
iteration time (slowest stage, the schedule's fill and drain, boundary
transfers). Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Any, Sequence

from ...core.costs import ClusterSpec, ModelCosts
from ...core.plan import PIPELINE_KINDS, NoPipeline, OneFOneB, ParallelPlan
from ...core.topology import Topology
from ...scheduling.registry import stage_memory
from .hybrid_results import TEMPLATES, HybridEstimate, StageEstimate, _template_names
from ..layerwise.layer_strategies import LayerKind, LayerStrategy, stage_strategies
from ..layerwise.layer_costs import samples_share
from ..layerwise.stage_search import NoFit, StageAssignment, StageSpec, assignment_cost, search_stage

class _Search:
    """The state of one :func:`search_hybrid` call: the stage searches are cached across partitions, each stage's
    :class:`StageSpec` is made once and its layer costs are shared with the stages that cost a layer alike
    (:meth:`StageSpec.share_costs`), and a split of equal weights is found once."""

    def __init__(self, costs: ModelCosts, cluster: ClusterSpec, global_batch: int, world: int, budget: float,
                 pool_options: dict[str, Any], optimizer: str, kinds: list[LayerKind]):
        self.costs, self.cluster, self.global_batch, self.world, self.budget = costs, cluster, global_batch, world, budget
        self.pool_options, self.optimizer, self.kinds = pool_options, optimizer, kinds
        self.pools: dict[tuple[int, int | None], tuple[LayerStrategy, ...]] = {}
        self.cache: dict[tuple, StageAssignment | str] = {}
        self.searched = 0
        self.misses: dict[str, tuple[float, str]] = {}
        # the mesh's tensor-parallel size when it decides placement (several nodes), else None (see search_hybrid)
        self.mesh_tp: int | None = None
        self.held: dict[tuple[int, int], tuple[int, ...]] = {}
        self.specs: dict[tuple, StageSpec] = {}
        self.placed: dict[tuple[int, int, int], tuple[int, ...]] = {}  # ranks() per (pp, stage, mesh_tp)
        self.boundaries: dict[tuple, float] = {}  # a boundary's transfers, forward and backward (_p2p_ms)
        self.splits: dict[tuple, list[tuple[int, int]] | None] = {}  # per (weights, parts): templates repeat them
        self.cost_tables: dict = {}  # the stages' layer costs, shared where they cost a layer alike
        self.rebased: dict[tuple[int, bool], ModelCosts] = {}
        # the pipeline schedule being searched (a kind of SCHEDULES), and whether its split backward costs other
        # than the fused one on some layer (a measured I + W that is not B): then its stages are searched anew
        self.schedule = OneFOneB.kind
        self.split_costs = any(sum(l.split_backward_ms) != l.backward_ms for l in costs.layers)

    @property
    def splitting(self) -> bool:
        """Whether the schedule being searched runs split backwards whose cost differs from the fused ones."""
        return self.split_costs and _splits(self.schedule)

    def costs_at(self, batch: int) -> ModelCosts:
        """The profile at ``batch`` samples a device (its batch fit's times there, cached; without a fit, as is),
        with every layer's backward its I + W where the schedule splits it (:func:`_split_profile`)."""
        split = self.splitting
        if self.costs.batch_fit is None and not split:
            return self.costs
        if (batch, split) not in self.rebased:
            rebased = self.costs if self.costs.batch_fit is None else self.costs.at_batch(batch)
            self.rebased[batch, split] = _split_profile(rebased) if split else rebased
        return self.rebased[batch, split]

    def pool(self, devices: int) -> tuple[LayerStrategy, ...]:
        key = (devices, self.mesh_tp)
        if key not in self.pools:
            full = stage_strategies(devices, **self.pool_options)
            self.pools[key] = full if self.mesh_tp is None else tuple(s for s in full if s.tp_degree <= self.mesh_tp)
        return self.pools[key]

    def ranks(self, pp: int, stage: int) -> tuple[int, ...] | None:
        """The cluster ranks of stage ``stage``'s local ranks under the plan's mesh (dp, pp, tp: data parallelism
        outermost), or None when every placement crosses the same links."""
        t = self.mesh_tp
        if t is None:
            return None
        if (pp, stage, t) not in self.placed:
            n = self.world // pp
            self.placed[pp, stage, t] = tuple(d * pp * t + stage * t + j for d in range(n // t) for j in range(t))
        return self.placed[pp, stage, t]

    def in_flight(self, pp: int, m: int) -> tuple[int, ...]:
        """Micro-batches each stage holds at once: what the schedule being searched keeps on it (one stage: one),
        read off the schedule (in closed form for 1F1B, ZB-H1 and ZB-H2)."""
        kind = self.schedule if pp > 1 else OneFOneB.kind
        if (kind, pp, m) not in self.held:
            self.held[kind, pp, m] = stage_memory(ParallelPlan.for_pipeline(kind, pp, m)).in_flight
        return self.held[kind, pp, m]

    def spec(self, pp: int, m: int, stage: int, first: int, last: int) -> StageSpec:
        """The stage as the search sees it (made once per stage, so it keeps the layer costs it has computed):
        schedules that hold as many micro-batches on it and cost its backward alike share it."""
        key = (pp, m, stage, first, last, self.mesh_tp, self.in_flight(pp, m)[stage], self.splitting)
        if key not in self.specs:
            self.specs[key] = self._spec(pp, m, stage, first, last).share_costs(self.cost_tables)
        return self.specs[key]

    def _spec(self, pp: int, m: int, stage: int, first: int, last: int) -> StageSpec:
        n = self.world // pp
        return StageSpec(self.costs_at(max(1, self.global_batch // m // n)), self.cluster, devices=n,
                         microbatch_size=self.global_batch // m,
                         layers=(first, last), num_microbatches=m, in_flight=self.in_flight(pp, m)[stage],
                         first_rank=stage * n, ranks=self.ranks(pp, stage), optimizer=self.optimizer,
                         kinds=self.kinds[first:last + 1])

    def stage(self, template: str, strategy: LayerStrategy | None, pp: int, m: int, stage: int, first: int,
              last: int) -> StageAssignment | str:
        """The best assignment of one stage (or why none fits), cached: a schedule that holds as many
        micro-batches on it and costs its backward alike (ZB-H1's first stage, 1F1B's) finds the same."""
        key = (template, strategy, self.mesh_tp, pp, m, stage, first, last, self.in_flight(pp, m)[stage],
               self.splitting)
        if key in self.cache:
            return self.cache[key]
        spec = self.spec(pp, m, stage, first, last)
        self.searched += 1
        need: float | None = None
        if strategy is None:
            try:
                found: StageAssignment | str = search_stage(spec, self.pool(spec.devices), self.budget)
            except NoFit as exc:
                found, need = str(exc), exc.needed_bytes
        else:
            found = assignment_cost(spec, _template_layers(strategy, [spec.kind(i) for i in range(last - first + 1)]))
            if found.memory_bytes > self.budget:
                need = found.memory_bytes
                found = f"stage {stage} (layers {first}-{last}) needs {need / 2**30:.3f} GiB per device"
        if need is not None:
            for name in ([template] if strategy is None else _template_names(strategy, pp, TEMPLATES)):
                self._miss(name, need, found, pp, m)
        self.cache[key] = found
        return found

    def _miss(self, template: str, need: float, reason: str, pp: int, m: int) -> None:
        """Keep, per template, the failure that needs the least memory."""
        if template not in self.misses or need < self.misses[template][0]:
            schedule = f" ({self.schedule})" if pp > 1 else ""
            self.misses[template] = (need, f"pipeline degree {pp}{schedule}, {m} micro-batches: {reason}")


def _splits(kind: str) -> bool:
    """Whether pipeline kind ``kind`` runs split backwards (input gradient I and weight gradient W apart)."""
    return bool(getattr(PIPELINE_KINDS.get(kind), "split_backward", False))


def _split_profile(costs: ModelCosts) -> ModelCosts:
    """The profile with every layer's backward its split one, I + W (:attr:`LayerCost.split_backward_ms`: measured,
    else the fused backward shared out, which sums to it): what a zero-bubble schedule pays."""
    layers = tuple(l if sum(l.split_backward_ms) == l.backward_ms else replace(l, backward_ms=sum(l.split_backward_ms))
                   for l in costs.layers)
    return replace(costs, layers=layers)


def _template_layers(strategy: LayerStrategy, kinds: list[LayerKind]) -> list[LayerStrategy]:
    """The template's strategy of each layer of these kinds (:func:`_as_template`; a run of one kind asks once)."""
    out: list[LayerStrategy] = []
    for i, kind in enumerate(kinds):
        out.append(out[-1] if i and kind is kinds[i - 1] else _as_template(strategy, kind))
    return out


def _as_template(strategy: LayerStrategy, kind: LayerKind) -> LayerStrategy:
    """The template's strategy for a layer of ``kind``: without tensor parallelism where the kind has none."""
    if strategy.tp == "none" or strategy.tp in kind.tp_kinds:
        return strategy
    return _without_tp(strategy)


@lru_cache(maxsize=4096)
def _without_tp(strategy: LayerStrategy) -> LayerStrategy:
    return LayerStrategy(1, strategy.dp, "none", True, strategy.recompute, strategy.devices)


def _microbatch_options(pp: int, global_batch: int, devices: int, given: Sequence[int] | None) -> list[int]:
    options = given if given is not None else ([1] if pp == 1 else [pp, 2 * pp, 4 * pp])
    return sorted({m for m in options if global_batch % m == 0 and (global_batch // m) % devices == 0})


def _pp_options(world: int, num_layers: int, given: Sequence[int] | None) -> list[int]:
    options = given if given is not None else [1 << e for e in range(world.bit_length()) if (1 << e) <= world]
    return [p for p in options if world % p == 0 and (world // p) & (world // p - 1) == 0 and p <= num_layers]


def _to_plan(assignments: list[StageAssignment], bounds: list[tuple[int, int]], pp: int, m: int, world: int,
             mesh_tp: int | None, schedule: str = OneFOneB.kind) -> ParallelPlan:
    """The ParallelPlan of a search result: mesh dp x pp x tp (tp the largest degree, or the mesh's when it
    decided placement); a pipeline runs ``schedule`` over stages of one tensor-parallel unit each."""
    strategies = [s for a in assignments for s in a.strategies]
    layers = tuple(s.to_layer_plan() for s in strategies)
    distinct = set({id(l): l for l in layers}.values())  # a strategy's LayerPlan is one object
    tp_kinds = {l.tp for l in distinct if l.tp != "none"}
    if len(tp_kinds) > 1:
        raise ValueError("a plan's layers use one tensor-parallel kind (1D or 2D), not both")
    n = world // pp
    # a pipeline's stage is one tensor-parallel unit of n ranks when placement is free (one node): layers use
    # part of it for TP and the rest as their data-parallel group, and the pipeline is a plain one of its kind
    t = mesh_tp or (n if pp > 1 and not tp_kinds else max(l.tp_degree for l in distinct))
    if tp_kinds == {"2d"}:
        q = math.isqrt(t)
        if q * q != t:
            raise ValueError(f"2D layers need a square tensor-parallel mesh; {t} is not one")
        mesh = Topology((("dp", n // t), ("pp", pp), ("tp_row", q), ("tp_col", q)))
    else:
        mesh = Topology((("dp", n // t), ("pp", pp), ("tp", t)))
    if pp == 1:
        pipeline: Any = NoPipeline()
    else:
        pipeline = PIPELINE_KINDS[schedule]()  # n == t: the stage is one tensor-parallel unit (search_hybrid's)
    partition = "uniform" if pp == 1 else "|".join(f"{a}-{b}" for a, b in bounds)
    if len(distinct) == 1:
        layers = layers[:1]
    return ParallelPlan(mesh=mesh, pipeline=pipeline, microbatches=m, partition=partition, layers=layers)


def _p2p_ms(search: _Search, bounds: list[tuple[int, int]], pp: int, m: int) -> float:
    """Fill and drain cross every boundary once forward and once backward: the slowest boundary's transfer of one
    micro-batch's activation (each rank of the stage sends its share, in parallel) on the link between stages."""
    if pp == 1:
        return 0.0
    n = search.world // pp
    costs, total, known = search.costs, 0.0, search.boundaries
    for k, (_, last) in enumerate(bounds[:-1]):
        key = (pp, m, k, costs.layers[last].activation_bytes, search.mesh_tp)
        if key not in known:
            nbytes = key[3] * (search.global_batch / m) / costs.batch_size / n
            here, there = search.ranks(pp, k), search.ranks(pp, k + 1)
            link = search.cluster.link(here[0] if here else k * n, there[0] if there else (k + 1) * n)
            known[key] = 2 * link.transfer_ms(nbytes)
        total += known[key]
    return total


def _evaluate(search: _Search, template: str, strategy: LayerStrategy | None, pp: int, m: int,
              bounds: list[tuple[int, int]]) -> HybridEstimate | None:
    assignments = []
    for k, (a, b) in enumerate(bounds):
        found = search.stage(template, strategy, pp, m, k, a, b)
        if isinstance(found, str):
            return None
        assignments.append(found)
    try:
        plan = _to_plan(assignments, bounds, pp, m, search.world, search.mesh_tp, search.schedule)
    except ValueError:  # layers mixing 1D and 2D tensor parallelism: no mesh holds them
        return None
    return _timed(search, plan, bounds, assignments, template, strategy)


def _timed(search: _Search, plan: ParallelPlan, bounds: list[tuple[int, int]], assignments: list[StageAssignment],
           template: str, strategy: LayerStrategy | None) -> HybridEstimate:
    """The plan (run with the search's schedule) with its iteration: slowest stage, fill and drain, boundary
    transfers (see :mod:`.hybrid`)."""
    pp, m, n = plan.pp, plan.microbatches, search.world // plan.pp
    held = search.in_flight(pp, m)
    stages = tuple(StageEstimate(a, b, k * n, n, held[k], found)
                   for k, ((a, b), found) in enumerate(zip(bounds, assignments)))
    slowest = max(s.time_ms for s in stages)
    bubble = _bubble_ms(search, stages, pp, m)
    p2p = _p2p_ms(search, bounds, pp, m)
    return HybridEstimate(plan, stages, template, search.global_batch, slowest + bubble + p2p, bubble, p2p,
                          tuple(l.name for l in search.costs.layers), strategy)


def fill_drain_ms(schedule: str, pp: int, m: int, forward: float, input_grad: float, weight_grad: float) -> float:
    """The fill and drain of a flushed pipeline of ``pp`` stages and ``m`` micro-batches running ``schedule`` whose
    slowest stage takes ``forward`` (F), ``input_grad`` (I) and ``weight_grad`` (W) ms a micro-batch: what the
    kind's spec gives (:meth:`~workbench.core.pipelines.base.PipelineSpec.fill_drain_ms`; see :mod:`.hybrid`)."""
    if pp == 1:
        return 0.0
    found = PIPELINE_KINDS[schedule]().fill_drain_ms(pp, m, forward, input_grad, weight_grad)
    if found is None:
        raise ValueError(f"the per-layer search does not cost pipeline kind {schedule!r}")
    return found


def _bubble_ms(search: _Search, stages: tuple[StageEstimate, ...], pp: int, m: int) -> float:
    """The search's schedule's :func:`fill_drain_ms` from the stage slowest a micro-batch: its F, its I (the rest
    of its compute: the input gradient with any recomputed forward) and its W, with its tensor-parallel and
    layout-changing time on F and I in proportion (a weight gradient communicates nothing)."""
    if pp == 1:
        return 0.0
    per_microbatch = [(s.part("compute_ms") + s.part("tp_comm_ms") + s.assignment.transition_ms) / m for s in stages]
    slowest = max(per_microbatch)
    if not _splits(search.schedule):
        return (pp - 1) * slowest
    k = per_microbatch.index(slowest)
    forward, weight = _forward_and_weight_ms(search, pp, m, k, stages[k])
    compute = stages[k].part("compute_ms") / m
    input_grad = max(0.0, compute - forward - weight)
    comm = slowest - compute
    on_forward = comm * forward / (forward + input_grad) if forward + input_grad > 0 else comm / 2
    return fill_drain_ms(search.schedule, pp, m, forward + on_forward, input_grad + comm - on_forward, weight)


def _forward_and_weight_ms(search: _Search, pp: int, m: int, k: int, stage: StageEstimate) -> tuple[float, float]:
    """Stage ``k``'s forward and weight-gradient compute for one micro-batch, as :func:`layer_cost` charges them:
    each layer's profile times at its group's share of the micro-batch, divided by its TP degree."""
    spec = search.spec(pp, m, k, stage.first, stage.last)
    forward = weight = 0.0
    for layer, s in zip(spec.layer_costs, stage.assignment.strategies):
        share = samples_share(spec, s) / s.tp_degree
        forward += layer.forward_ms * share
        weight += layer.split_backward_ms[1] * share
    return forward, weight
