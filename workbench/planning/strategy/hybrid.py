"""Fine-grained hybrid plans: the pipeline around the per-layer programme, and the templates it is judged against.

Problem. :func:`~workbench.planning.layerwise.stage_search.search_stage` picks the best strategy of every
layer of *one* pipeline stage under a memory budget. A plan also needs the
pipeline degree, the micro-batch count and where the stages cut the model;
and a claim that per-layer mixing wins needs the templates it beats,
costed the same way.

Approach (Galvatron's outer loop, with the workbench's partitioner):

* pipeline degree ``pp``: every power of two that divides the devices and
  leaves each stage a power of two (pipeline parallelism is the tree root,
  one degree per model); every stage gets ``devices / pp`` ranks, stage k
  the ranks ``[k n, (k + 1) n)``, so a stage stays inside a node when it
  can;
* micro-batches ``m``: ``pp``, ``2 pp`` and ``4 pp`` (one without a
  pipeline) where the global batch splits into whole samples per rank;
* the schedule (``schedules``, :data:`SCHEDULES`): 1F1B, ZB-H1 and ZB-H2,
  each a search of its own, its stages holding the micro-batches its
  schedule keeps in flight on them (1F1B ``min(pp - k, m)`` on stage k,
  ZB-H1 ``min(pp, m)`` on every stage, its deferred W's, ZB-H2
  ``min(2 pp - 1, m)``), so the extra activations count against the budget. The
  zero-bubble kinds split every backward into the input gradient I and the
  weight gradient W and pay both: a layer's backward is its I + W (the
  profile's measured pair, which may cost more than the fused backward B;
  unmeasured, B shared out, which sums to B). Stage searches that hold as
  many micro-batches and cost the backward alike are shared between
  schedules (ZB-H1's first stage is 1F1B's where I + W = B). ZB-H2 with
  fewer than ``2 pp - 1`` micro-batches cannot run ahead: it is ZB-H1's
  schedule at ZB-H1's memory or more, so it is not searched beside ZB-H1.
  1F1B is searched first; a zero-bubble schedule then only where it can
  beat the best plan so far (per template): its slowest stage takes at
  least an even share of the layers' fastest times. GPipe costs 1F1B's
  time in this model and holds more activations (all ``m`` in flight
  against ``pp - k``), so it never wins;
* the partition: first the split that balances each layer's fastest time
  (the bottleneck AMPA minimises, on the per-layer choices' costs), then
  the split that balances the chosen plan's own per-layer times. When a
  stage of the first split cannot fit even at its leanest, the split that
  balances time among those whose every stage fits at its leanest (with
  the micro-batches the schedule keeps in flight on it: under 1F1B early
  stages take fewer layers, Galvatron-BMW's memory balance, as a
  constraint), and if
  none does, the split that balances the leanest memory itself; and the
  splits of the :data:`TEMPLATE_SPLITS` fastest template pipelines. All
  candidates are searched and the fastest feasible kept;
* iteration time of a plan: the slowest stage's whole iteration (its
  ``m`` micro-batches, data-parallel communication included) plus the
  fill and drain, plus the activations and gradients sent across stage
  boundaries on the way in and out. The fill and drain reads F, I and W of
  the stage slowest per micro-batch (its tensor-parallel and layout
  changes on F and I in proportion; a weight gradient communicates
  nothing): 1F1B ``(pp - 1)(F + I + W)``, that stage's whole
  per-micro-batch time; ZB-H1 ``(pp - 1)(F + I - W)``, never less than
  ``(pp - 1)`` forwards (the last stage starts that late in any flushed
  schedule) nor ``(pp - 1)`` input gradients (the wave that drains it), so
  never more than 1F1B's; ZB-H2 ``(pp - 1) F``, no bubble in the steady
  state, while the weight gradients it defers cover the drain
  (each kind's ``PipelineSpec.fill_drain_ms``, which also gives the rest;
  the simulator's numbers for these schedules on equal stages).

Templates (:data:`TEMPLATES`) are the same search with one strategy for
every layer: pure DP, pure FSDP (ZeRO-3), Megatron-style 3D (pipeline x
consecutive 1D TP x DDP) and the best uniform plan of any kind. Layers a
template's TP cannot split (embeddings, convolutions) keep its DP kind
without TP, as Megatron replicates them. A template never beats the
per-layer plan in this model (it is one of the assignments the programme
considers); how much the mix gains is the question.

The answer's types are in :mod:`.hybrid_results`, the search's state and the
timing of a split in :mod:`.hybrid_stages`, the partition candidates in
:mod:`.hybrid_partitions`; the public names are re-exported here.

Pure Python; the plans are :class:`~workbench.core.plan.ParallelPlan` values.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

from ...core.costs import ClusterSpec, LayerCost, ModelCosts
from ...core.fields import check_int, number
from ...core.partition import Partition
from ...core.plan import ZBH1, ZBH2, GroPipe, NoPipeline, OneFOneB, ParallelPlan
from .hybrid_partitions import _fastest_times, _partitions, _split
from .hybrid_results import (SCHEDULE_TEXT, SCHEDULES, TEMPLATE_SPLITS, TEMPLATE_TEXT, TEMPLATES, HybridEstimate,
                             HybridResult, StageEstimate, _template_names, as_estimate, schedules_text, template_of)
from .hybrid_stages import _evaluate, _microbatch_options, _pp_options, _Search, _timed, fill_drain_ms
from ..layerwise.layer_strategies import LayerKind, LayerStrategy, layer_kinds, stage_strategies
from ..layerwise.stage_search import assignment_cost

__all__ = ["StageEstimate", "HybridEstimate", "HybridResult", "search_hybrid", "cost_plan", "as_estimate",
           "TEMPLATES", "TEMPLATE_TEXT", "SCHEDULES", "SCHEDULE_TEXT", "template_of", "fill_drain_ms"]


def search_hybrid(costs: ModelCosts, cluster: ClusterSpec, global_batch: int, *, budget_bytes: float | None = None,
                  world_size: int | None = None, pp_options: Sequence[int] | None = None,
                  microbatch_options: Sequence[int] | None = None, templates: Sequence[str] = TEMPLATES,
                  dp_kinds: Sequence[str] = ("replicate", "zero2", "fsdp"), tp_kinds: Sequence[str] = ("1d",),
                  recompute: Sequence[bool] = (False, True), max_tp: int | None = None, optimizer: str = "adam",
                  kinds: Sequence[LayerKind] | Callable[[LayerCost], LayerKind] | None = None,
                  progress: Callable[[str], None] | None = None,
                  schedules: Sequence[str] = SCHEDULES) -> HybridResult:
    """The fastest per-layer plan and the best plan of each template (see the module docstring).

    ``budget_bytes``: memory per device (default: the device's). ``max_tp``:
    the largest tensor-parallel degree (default: the devices of one node,
    so TP never crosses the slow link). ``templates``: which of
    :data:`TEMPLATES` to search. ``schedules``: which pipeline schedules of
    :data:`SCHEDULES` a pipeline may run. ValueError for bad input; a
    template that nothing fits is absent from ``best`` and its closest miss
    is in ``misses``.
    """
    started = time.perf_counter()
    world, budget = _checked_inputs(costs, cluster, global_batch, world_size, templates, budget_bytes)
    schedules = _checked_schedules(schedules)
    limit = max_tp if max_tp is not None else 1 << (cluster.devices_per_node.bit_length() - 1)
    pool_options = dict(dp_kinds=tuple(dp_kinds), tp_kinds=tuple(tp_kinds), recompute=tuple(recompute), max_tp=limit)
    stage_strategies(1, **pool_options)  # bad options fail here, with their own message
    search = _Search(costs, cluster, global_batch, world, budget, pool_options, optimizer,
                     layer_kinds(costs.layers, kinds))
    pps = _pp_options(world, costs.num_layers, pp_options)
    if not pps:
        raise ValueError(f"no pipeline degree in {list(pp_options or [])} divides {world} devices into power-of-two "
                         f"stages of at least one of the {costs.num_layers} layers")
    plans: list[HybridEstimate] = []
    configs = [(pp, m) for pp in pps for m in _microbatch_options(pp, global_batch, world // pp, microbatch_options)]
    if not configs:
        raise ValueError(f"global batch {global_batch} does not split into whole samples per device for any pipeline "
                         f"degree in {pps} on {world} devices; use a multiple of {world}")
    tried: dict[tuple, set[tuple]] = {}
    several_nodes = world > cluster.devices_per_node
    plans += _search_shapes(search, templates, configs, schedules, tried, several_nodes, limit, progress)
    if "per-layer" in templates:  # the best templates' own splits, searched per layer too
        plans += _on_template_splits(search, plans, tried, several_nodes)
    best = _best_per_template(plans, templates)
    plans.sort(key=lambda p: (p.iteration_ms, p.name))
    misses = {name: miss for name, miss in search.misses.items() if name not in best}
    search.mesh_tp = None
    return HybridResult(best, plans, search.searched, time.perf_counter() - started, budget,
                        {n: search.pool(n) for n in (world // pp for pp in pps)}, misses)


def _checked_inputs(costs: ModelCosts, cluster: ClusterSpec, global_batch: int, world_size: int | None,
                    templates: Sequence[str], budget_bytes: float | None) -> tuple[int, float]:
    """The search's world size and memory budget per device; ValueError naming a bad argument."""
    if not isinstance(costs, ModelCosts):
        raise ValueError(f"costs must be a ModelCosts profile, got {type(costs).__name__}")
    if not isinstance(cluster, ClusterSpec):
        raise ValueError(f"cluster must be a ClusterSpec, got {type(cluster).__name__}")
    world = cluster.world_size if world_size is None else world_size
    for name, value in (("global_batch", global_batch), ("world_size", world)):
        check_int(name, value, 1)
    if world > cluster.world_size or world & (world - 1):
        raise ValueError(f"world_size must be a power of two no larger than {cluster.name}'s {cluster.world_size} "
                         f"devices, got {world}")
    unknown = [t for t in templates if t not in TEMPLATES]
    if unknown or not templates:
        raise ValueError(f"templates must be some of {', '.join(TEMPLATES)}, got {list(templates)}")
    budget = cluster.device.memory_bytes if budget_bytes is None else budget_bytes
    if not number(0, strict=True).accepts(budget):
        raise ValueError(f"budget_bytes must be a number of bytes > 0, got {budget_bytes!r}")
    return world, budget


def _checked_schedules(schedules: Sequence[str]) -> tuple[str, ...]:
    """The schedules to search, each once; ValueError naming ``schedules`` unless some of :data:`SCHEDULES`."""
    given = list(schedules) if isinstance(schedules, (list, tuple)) else None
    if not given or any(k not in SCHEDULES for k in given):
        raise ValueError(f"schedules must be a non-empty list of pipeline schedules among {', '.join(SCHEDULES)}, "
                         f"got {schedules!r}")
    return tuple(dict.fromkeys(given))


def _schedules_of(pp: int, m: int, schedules: tuple[str, ...]) -> list[str]:
    """The schedules searched at ``pp`` stages and ``m`` micro-batches: none but the plain one without a
    pipeline; ZB-H2 not beside ZB-H1 where it cannot run ahead of it (``m < 2 pp - 1``: ZB-H1's schedule at as
    much memory or more)."""
    if pp == 1:
        return [OneFOneB.kind]
    return [k for k in schedules if not (k == ZBH2.kind and m < 2 * pp - 1 and ZBH1.kind in schedules)]


def _search_shapes(search: _Search, templates: Sequence[str], configs: list[tuple[int, int]],
                   schedules: tuple[str, ...], tried: dict[tuple, set[tuple]], several_nodes: bool, limit: int,
                   progress: Callable[[str], None] | None) -> list[HybridEstimate]:
    """The plans of every pipeline degree and micro-batch count: first without a pipeline and with 1F1B, then
    with the zero-bubble schedules, each only where it can beat the best plan so far of what it searches for
    (:func:`_beaten`)."""
    shapes = [(pp, m, kind) for pp, m in configs for kind in _schedules_of(pp, m, schedules)]
    shapes.sort(key=lambda shape: shape[2] != OneFOneB.kind)  # stable: 1F1B's shapes in their order first
    plans: list[HybridEstimate] = []
    bests: dict[str, HybridEstimate] = {}
    for i, (pp, m, kind) in enumerate(shapes):
        if progress:
            progress(f"pipeline degree {pp}, {m} micro-batches{f', {kind}' if pp > 1 else ''} "
                     f"({i + 1}/{len(shapes)})")
        search.schedule = kind
        best = None if kind == OneFOneB.kind else {name: p.iteration_ms for name, p in bests.items()}
        found = _search_shape(search, templates, pp, m, tried, several_nodes, limit, best)
        _best_per_template(found, templates, bests)
        plans += found
    return plans


def _beaten(search: _Search, pp: int, m: int, strategy: LayerStrategy | None, names: Sequence[str],
            best: dict[str, float] | None) -> bool:
    """Whether no plan of this shape (per layer, or of a template's ``strategy``) can beat the best of ``names``
    so far: its slowest stage takes at least an even share of the layers' fastest times, or the slowest layer's,
    before any fill, drain or transfer."""
    if best is None or not all(name in best for name in names):
        return False
    times = _fastest_times(search, pp, m, strategy)
    bound = max(sum(times) / pp, max(times))
    return all(bound > best[name] * (1 + 1e-9) for name in names)


def _search_shape(search: _Search, templates: Sequence[str], pp: int, m: int, tried: dict[tuple, set[tuple]],
                  several_nodes: bool, limit: int, best: dict[str, float] | None = None) -> list[HybridEstimate]:
    """The plans of one pipeline degree, micro-batch count and the search's schedule: per layer and per template
    strategy (with ``best``, the iteration times to beat per template, only those that can)."""
    plans: list[HybridEstimate] = []
    n = search.world // pp
    # across nodes the mesh's TP size decides which ranks a stage gets. A pipeline's stage is one
    # tensor-parallel unit (consecutive ranks, as in Galvatron's trees, and what the layer-by-layer runtime
    # runs); without a pipeline each TP size is a different placement of the layers' groups, so each is
    # searched. In one node every placement crosses the same links: the mesh takes the largest degree
    if not several_nodes:
        mesh_sizes: list[int | None] = [None]
    elif pp > 1:
        mesh_sizes = [n]
    else:
        mesh_sizes = [1 << e for e in range(n.bit_length()) if 1 << e <= min(n, limit)]
    for mesh_tp in mesh_sizes:
        search.mesh_tp = mesh_tp
        if "per-layer" in templates and not _beaten(search, pp, m, None, ["per-layer"], best):
            plans += _partitions(search, "per-layer", None, pp, m,
                                 tried.setdefault((pp, m, mesh_tp, search.schedule), set()))
        if set(templates) - {"per-layer"}:
            for strategy in search.pool(n):
                names = _template_names(strategy, pp, templates)  # the pool holds degrees up to mesh_tp
                if names and not _beaten(search, pp, m, strategy, names, best):
                    plans += _partitions(search, "uniform", strategy, pp, m, set())
    return plans


def _on_template_splits(search: _Search, plans: list[HybridEstimate], tried: dict[tuple, set[tuple]],
                        several_nodes: bool) -> list[HybridEstimate]:
    """The per-layer plans on the splits of the :data:`TEMPLATE_SPLITS` fastest template pipelines not yet tried."""
    found_plans: list[HybridEstimate] = []
    for p in sorted((p for p in plans if p.source is not None and p.plan.pp > 1),
                    key=lambda p: p.iteration_ms)[:TEMPLATE_SPLITS]:
        bounds = tuple((s.first, s.last) for s in p.stages)
        search.mesh_tp = p.plan.tp if several_nodes else None
        search.schedule = p.plan.pipeline.kind
        key = (p.plan.pp, p.plan.microbatches, search.mesh_tp, search.schedule)
        if bounds not in tried.setdefault(key, set()):
            tried[key].add(bounds)
            found = _evaluate(search, "per-layer", None, p.plan.pp, p.plan.microbatches, list(bounds))
            found_plans += [found] if found else []
    return found_plans


def _best_per_template(plans: list[HybridEstimate], templates: Sequence[str],
                       best: dict[str, HybridEstimate] | None = None) -> dict[str, HybridEstimate]:
    """The fastest plan of each template (ties by name), of ``plans`` and those already in ``best`` (updated); a
    uniform plan also counts as a per-layer one."""
    best = {} if best is None else best
    for p in plans:
        names = ["per-layer"] if p.source is None else _template_names(p.source, p.plan.pp, templates)
        if "per-layer" in templates:
            names = sorted({*names, "per-layer"})  # a uniform assignment is one the programme costs too
        for name in names:
            if name not in best or (p.iteration_ms, p.name) < (best[name].iteration_ms, best[name].name):
                best[name] = p
    return best


def cost_plan(costs: ModelCosts, cluster: ClusterSpec, global_batch: int, plan: ParallelPlan | str, *,
              optimizer: str = "adam",
              kinds: Sequence[LayerKind] | Callable[[LayerCost], LayerKind] | None = None) -> HybridEstimate:
    """What the per-layer model predicts for one given plan (as :func:`search_hybrid` costs its candidates):
    iteration time, its breakdown and each stage's memory per device (not checked against a budget).

    The plan runs without a pipeline, with 1F1B, ZB-H1 or ZB-H2, or as GroPipe's 1F1B groups without delay;
    its partition is ranges, or ``uniform`` (equal layer counts). ValueError for what the model does not cost.
    """
    plan = ParallelPlan.parse(plan) if isinstance(plan, str) else plan
    if not isinstance(plan, ParallelPlan):
        raise ValueError(f"plan must be a ParallelPlan or a plan name, got {type(plan).__name__}")
    spec_ = plan.pipeline
    grouped = isinstance(spec_, GroPipe) and spec_.delay == 0 and spec_.inner == OneFOneB.kind
    if not (isinstance(spec_, NoPipeline) or spec_.kind in SCHEDULES or grouped):
        raise ValueError(f"plan {plan.name!r}: the per-layer model costs plans without a pipeline, with "
                         f"{schedules_text('or')}, or GroPipe's 1F1B groups without delay; "
                         f"not {spec_.kind!r}")
    if plan.tp_kind == "2d":
        raise ValueError(f"plan {plan.name!r}: the per-layer model costs 1D tensor parallelism only")
    world, pp, m = plan.world_size, plan.pp, plan.microbatches
    if world > cluster.world_size:
        raise ValueError(f"plan {plan.name!r} needs {world} devices; {cluster.name} has {cluster.world_size}")
    n = world // pp
    if n & (n - 1) or global_batch % m or (global_batch // m) % n:
        raise ValueError(f"plan {plan.name!r}: stages of {n} devices and micro-batches of {global_batch} / {m} "
                         f"samples must be a power of two and split into whole samples per device")
    num = costs.num_layers
    if pp == 1:
        bounds = [(0, num - 1)]
    elif plan.partition in ("uniform", "ampa"):
        if plan.partition == "ampa":
            raise ValueError(f"plan {plan.name!r}: give the partition as ranges (or 'uniform') to cost it")
        bounds = _split([1.0] * num, pp)
    else:
        bounds = list(Partition.parse(plan.partition).bounds)
    if bounds is None or bounds[-1][1] != num - 1:
        raise ValueError(f"plan {plan.name!r}: its partition does not cover the model's {num} layers")
    search = _Search(costs, cluster, global_batch, world, math.inf, {}, optimizer, layer_kinds(costs.layers, kinds))
    search.mesh_tp = plan.tp if world > cluster.devices_per_node else None
    search.schedule = spec_.kind if spec_.kind in SCHEDULES else OneFOneB.kind
    layers = plan.layers_for(num)
    assignments = []
    for k, (a, b) in enumerate(bounds):
        spec = search.spec(pp, m, k, a, b)
        strategies = [LayerStrategy(l.tp_degree, l.dp, l.tp, l.consecutive, l.recompute, n) for l in layers[a:b + 1]]
        assignments.append(assignment_cost(spec, strategies))
    return _timed(search, plan, bounds, assignments, "given", None)
