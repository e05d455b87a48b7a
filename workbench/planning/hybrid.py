"""Fine-grained hybrid plans: the pipeline around the per-layer programme, and the templates it is judged against.

Problem. :func:`~.layerwise.search_stage` picks the best strategy of every
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
  the schedule is 1F1B: in this model GPipe costs the same time and holds
  more activations (all ``m`` in flight against ``pp - k``), so it never
  wins;
* the partition: first the split that balances each layer's fastest time
  (the bottleneck AMPA minimises, on the per-layer choices' costs), then
  the split that balances the chosen plan's own per-layer times. When a
  stage of the first split cannot fit even at its leanest, the split that
  balances time among those whose every stage fits at its leanest (stage k
  holds ``min(pp - k, m)`` micro-batches in flight, so early stages take
  fewer layers: Galvatron-BMW's memory balance, as a constraint), and if
  none does, the split that balances the leanest memory itself; and the
  splits of the :data:`TEMPLATE_SPLITS` fastest template pipelines. All
  candidates are searched and the fastest feasible kept;
* iteration time of a plan: the slowest stage's whole iteration (its
  ``m`` micro-batches, data-parallel communication included) plus the
  fill and drain, ``(pp - 1)`` times the slowest stage's per-micro-batch
  time, plus the activations and gradients sent across stage boundaries
  on the way in and out.

Templates (:data:`TEMPLATES`) are the same search with one strategy for
every layer: pure DP, pure FSDP (ZeRO-3), Megatron-style 3D (pipeline x
consecutive 1D TP x DDP) and the best uniform plan of any kind. Layers a
template's TP cannot split (embeddings, convolutions) keep its DP kind
without TP, as Megatron replicates them. A template never beats the
per-layer plan in this model (it is one of the assignments the programme
considers); how much the mix gains is the question.

Pure Python; the plans are :class:`~workbench.core.plan.ParallelPlan` values.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core.costs import ClusterSpec, LayerCost, LinkSpec, ModelCosts
from ..core.partition import Partition
from ..core.plan import GroPipe, NoPipeline, OneFOneB, ParallelPlan
from ..core.topology import Topology
from .estimate import Estimate
from .layer_strategies import LayerKind, LayerStrategy, for_layer, layer_kinds, stage_strategies
from .layerwise import NoFit, StageAssignment, StageSpec, assignment_cost, layer_cost, search_stage

__all__ = ["StagePlan", "HybridPlan", "HybridResult", "search_hybrid", "cost_plan", "as_estimate", "TEMPLATES",
           "TEMPLATE_TEXT", "template_of"]

TEMPLATES = ("per-layer", "uniform", "dp", "fsdp", "3d")
TEMPLATE_SPLITS = 4  # the fastest template pipelines whose partitions the per-layer search also tries
TEMPLATE_TEXT = {"per-layer": "per-layer mix (dynamic programming)",
                 "uniform": "uniform plan (one strategy for every layer; layers its TP cannot split keep its DP kind)",
                  "dp": "pure DP (DDP)", "fsdp": "pure FSDP (ZeRO-3)", "3d": "Megatron-style 3D (PP x TP x DDP)"}


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage of a plan: its layers, ranks and per-layer assignment."""

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
class HybridPlan:
    """A plan found by :func:`search_hybrid`, with the cost breakdown of the per-layer model."""

    plan: ParallelPlan
    stages: tuple[StagePlan, ...]
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

    def _critical(self) -> StagePlan:
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
                "partition": self.plan.partition, **self.breakdown(), "layers": self.layers()}


@dataclass
class HybridResult:
    """The best plan of every template (``best["per-layer"]`` first), the plans behind them and the search cost."""

    best: dict[str, HybridPlan]
    plans: list[HybridPlan]
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


def _split(weights: Sequence[float], parts: int) -> list[tuple[int, int]] | None:
    """Contiguous split of ``weights`` into ``parts`` non-empty runs minimising the largest run's sum."""
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    return _split_by_stage(lambda _k, a, b: prefix[b + 1] - prefix[a], len(weights), parts)


def _split_by_stage(cost: Callable[[int, int, int], float], n: int, parts: int) -> list[tuple[int, int]] | None:
    """Contiguous split of ``n`` layers into ``parts`` stages minimising the largest ``cost(stage, first, last)``.

    ``cost`` must not decrease as a stage takes more layers (times and memory do not), so scanning the start of
    the last stage downwards can stop once that stage alone costs as much as the best split found.
    """
    if parts > n:
        return None
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        before, here = best[k - 1], best[k]
        for end in range(k, n - (parts - k) + 1):
            for start in range(end - 1, k - 2, -1):
                last = cost(k - 1, start, end - 1)
                if last >= here[end]:
                    break
                value = max(before[start], last)
                if value < here[end]:
                    here[end], cut[k][end] = value, start
    bounds, end = [], n
    for k in range(parts, 0, -1):
        start = cut[k][end]
        bounds.append((start, end - 1))
        end = start
    return bounds[::-1]


class _Search:
    """The state of one :func:`search_hybrid` call: the stage searches are cached across partitions."""

    def __init__(self, costs: ModelCosts, cluster: ClusterSpec, global_batch: int, world: int, budget: float,
                 pool_options: dict[str, Any], optimizer: str, collective_link: LinkSpec | None,
                 kinds: list[LayerKind]):
        self.costs, self.cluster, self.global_batch, self.world, self.budget = costs, cluster, global_batch, world, budget
        self.pool_options, self.optimizer, self.link, self.kinds = pool_options, optimizer, collective_link, kinds
        self.pools: dict[tuple[int, int | None], tuple[LayerStrategy, ...]] = {}
        self.cache: dict[tuple, StageAssignment | str] = {}
        self.searched = 0
        self.misses: dict[str, tuple[float, str]] = {}
        # the mesh's tensor-parallel size when it decides placement (several nodes), else None (see search_hybrid)
        self.mesh_tp: int | None = None

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
        n = self.world // pp
        return tuple(d * pp * t + stage * t + j for d in range(n // t) for j in range(t))

    def spec(self, pp: int, m: int, stage: int, first: int, last: int) -> StageSpec:
        n = self.world // pp
        return StageSpec(self.costs, self.cluster, devices=n, microbatch_size=self.global_batch // m,
                         layers=(first, last), num_microbatches=m, in_flight=min(pp - stage, m),
                         first_rank=stage * n, ranks=self.ranks(pp, stage), optimizer=self.optimizer,
                         collective_link=self.link, kinds=self.kinds[first:last + 1])

    def stage(self, template: str, strategy: LayerStrategy | None, pp: int, m: int, stage: int, first: int,
              last: int) -> StageAssignment | str:
        """The best assignment of one stage (or why none fits), cached."""
        key = (template, strategy, self.mesh_tp, pp, m, stage, first, last)
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
            fixed = [_as_template(strategy, spec.kind(i)) for i in range(last - first + 1)]
            found = assignment_cost(spec, fixed)
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
            self.misses[template] = (need, f"pipeline degree {pp}, {m} micro-batches: {reason}")


def _as_template(strategy: LayerStrategy, kind: LayerKind) -> LayerStrategy:
    """The template's strategy for a layer of ``kind``: without tensor parallelism where the kind has none."""
    if strategy.tp == "none" or strategy.tp in kind.tp_kinds:
        return strategy
    return LayerStrategy(1, strategy.dp, "none", True, strategy.recompute, strategy.devices)


def _microbatch_options(pp: int, global_batch: int, devices: int, given: Sequence[int] | None) -> list[int]:
    options = given if given is not None else ([1] if pp == 1 else [pp, 2 * pp, 4 * pp])
    return sorted({m for m in options if global_batch % m == 0 and (global_batch // m) % devices == 0})


def _pp_options(world: int, num_layers: int, given: Sequence[int] | None) -> list[int]:
    options = given if given is not None else [1 << e for e in range(world.bit_length()) if (1 << e) <= world]
    return [p for p in options if world % p == 0 and (world // p) & (world // p - 1) == 0 and p <= num_layers]


def _to_plan(assignments: list[StageAssignment], bounds: list[tuple[int, int]], pp: int, m: int, world: int,
             mesh_tp: int | None) -> ParallelPlan:
    """The ParallelPlan of a search result: mesh dp x pp x tp (tp the largest degree, or the mesh's when it
    decided placement); a pipeline is 1F1B over stages of one tensor-parallel unit each."""
    strategies = [s for a in assignments for s in a.strategies]
    layers = tuple(s.to_layer_plan() for s in strategies)
    tp_kinds = {l.tp for l in layers if l.tp != "none"}
    if len(tp_kinds) > 1:
        raise ValueError("a plan's layers use one tensor-parallel kind (1D or 2D), not both")
    n = world // pp
    # a pipeline's stage is one tensor-parallel unit of n ranks when placement is free (one node): layers use
    # part of it for TP and the rest as their data-parallel group, and the pipeline is a plain 1F1B one
    t = mesh_tp or (n if pp > 1 and not tp_kinds else max(l.tp_degree for l in layers))
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
        pipeline = OneFOneB()  # n == t: the stage is one tensor-parallel unit (search_hybrid places it so)
    partition = "uniform" if pp == 1 else "|".join(f"{a}-{b}" for a, b in bounds)
    if len(set(layers)) == 1:
        layers = layers[:1]
    return ParallelPlan(mesh=mesh, pipeline=pipeline, microbatches=m, partition=partition, layers=layers)


def _p2p_ms(search: _Search, bounds: list[tuple[int, int]], pp: int, m: int) -> float:
    """Fill and drain cross every boundary once forward and once backward: the slowest boundary's transfer of one
    micro-batch's activation (each rank of the stage sends its share, in parallel) on the link between stages."""
    if pp == 1:
        return 0.0
    n = search.world // pp
    costs, total = search.costs, 0.0
    for k, (_, last) in enumerate(bounds[:-1]):
        nbytes = costs.layers[last].activation_bytes * (search.global_batch / m) / costs.batch_size / n
        here, there = search.ranks(pp, k), search.ranks(pp, k + 1)
        link = search.cluster.link(here[0] if here else k * n, there[0] if there else (k + 1) * n)
        total += 2 * link.transfer_ms(nbytes)
    return total


def _evaluate(search: _Search, template: str, strategy: LayerStrategy | None, pp: int, m: int,
              bounds: list[tuple[int, int]]) -> HybridPlan | None:
    assignments = []
    for k, (a, b) in enumerate(bounds):
        found = search.stage(template, strategy, pp, m, k, a, b)
        if isinstance(found, str):
            return None
        assignments.append(found)
    try:
        plan = _to_plan(assignments, bounds, pp, m, search.world, search.mesh_tp)
    except ValueError:  # layers mixing 1D and 2D tensor parallelism: no mesh holds them
        return None
    return _timed(search, plan, bounds, assignments, template, strategy)


def _timed(search: _Search, plan: ParallelPlan, bounds: list[tuple[int, int]], assignments: list[StageAssignment],
           template: str, strategy: LayerStrategy | None) -> HybridPlan:
    """The plan with its iteration: slowest stage, fill and drain, boundary transfers (module docstring)."""
    pp, m, n = plan.pp, plan.microbatches, search.world // plan.pp
    stages = tuple(StagePlan(a, b, k * n, n, min(pp - k, m), found)
                   for k, ((a, b), found) in enumerate(zip(bounds, assignments)))
    slowest = max(s.time_ms for s in stages)
    bubble = (pp - 1) * max((s.part("compute_ms") + s.part("tp_comm_ms") + s.assignment.transition_ms) / m
                            for s in stages)
    p2p = _p2p_ms(search, bounds, pp, m)
    return HybridPlan(plan, stages, template, search.global_batch, slowest + bubble + p2p, bubble, p2p,
                      tuple(l.name for l in search.costs.layers), strategy)


def _fastest_times(search: _Search, pp: int, m: int, strategy: LayerStrategy | None) -> list[float]:
    """Each layer's fastest time in a stage of this pipeline (memory ignored), or its template time."""
    spec = search.spec(pp, m, 0, 0, search.costs.num_layers - 1)
    pool = search.pool(spec.devices)
    out = []
    for i in range(search.costs.num_layers):
        options = [_as_template(strategy, spec.kind(i))] if strategy is not None else for_layer(pool, spec.kind(i))
        out.append(min(layer_cost(spec, i, s).time_ms for s in options))
    return out


def _least_memory(search: _Search, pp: int, m: int, strategy: LayerStrategy | None) -> list[tuple[float, float]]:
    """Per layer (state bytes, activation bytes per in-flight micro-batch) of its leanest option."""
    spec = search.spec(pp, m, pp - 1, 0, search.costs.num_layers - 1)  # in_flight 1
    pool = search.pool(spec.devices)
    out = []
    for i in range(search.costs.num_layers):
        options = [_as_template(strategy, spec.kind(i))] if strategy is not None else for_layer(pool, spec.kind(i))
        costs = [layer_cost(spec, i, s) for s in options]
        out.append(min(((c.state_bytes, c.activation_bytes) for c in costs), key=lambda sa: sa[0] + pp * sa[1]))
    return out


def _partitions(search: _Search, template: str, strategy: LayerStrategy | None, pp: int, m: int,
                seen: set[tuple]) -> list[HybridPlan]:
    """The plans of the partition candidates of the module docstring (one list entry per feasible split);
    ``seen`` collects the splits tried."""
    num = search.costs.num_layers
    if pp == 1:
        seen.add(((0, num - 1),))
        plan = _evaluate(search, template, strategy, 1, m, [(0, num - 1)])
        return [plan] if plan else []
    found: list[HybridPlan] = []

    def attempt(bounds: list[tuple[int, int]] | None) -> HybridPlan | None:
        if bounds is None or tuple(bounds) in seen:
            return None
        seen.add(tuple(bounds))
        plan = _evaluate(search, template, strategy, pp, m, bounds)
        if plan is not None:
            found.append(plan)
        return plan

    first = attempt(_split(_fastest_times(search, pp, m, strategy), pp))
    if first is not None:  # balance the chosen times (transitions counted on the layer they enter)
        chosen = [c.time_ms for s in first.stages for c in s.assignment.layer_costs]
        attempt(_split(chosen, pp))
    least = _least_memory(search, pp, m, strategy)
    prefix_state, prefix_act = [0.0], [0.0]
    for state, act in least:
        prefix_state.append(prefix_state[-1] + state)
        prefix_act.append(prefix_act[-1] + act)
    memory = lambda k, a, b: (prefix_state[b + 1] - prefix_state[a]) \
        + min(pp - k, m) * (prefix_act[b + 1] - prefix_act[a])  # noqa: E731
    if first is None:  # some stage of the time-balanced split does not fit even at its leanest
        times = _fastest_times(search, pp, m, strategy)
        prefix_time = [0.0]
        for t in times:
            prefix_time.append(prefix_time[-1] + t)
        fits = lambda k, a, b: (prefix_time[b + 1] - prefix_time[a]  # noqa: E731
                                if memory(k, a, b) <= search.budget else math.inf)
        bounds = _split_by_stage(fits, num, pp)
        if bounds is None or any(memory(k, a, b) > search.budget for k, (a, b) in enumerate(bounds)):
            bounds = _split_by_stage(memory, num, pp)  # nothing balances time under the budget: balance memory
        attempt(bounds)
    return found


def search_hybrid(costs: ModelCosts, cluster: ClusterSpec, global_batch: int, *, budget_bytes: float | None = None,
                  world_size: int | None = None, pp_options: Sequence[int] | None = None,
                  microbatch_options: Sequence[int] | None = None, templates: Sequence[str] = TEMPLATES,
                  dp_kinds: Sequence[str] = ("replicate", "zero2", "fsdp"), tp_kinds: Sequence[str] = ("1d",),
                  recompute: Sequence[bool] = (False, True), max_tp: int | None = None, optimizer: str = "adam",
                  collective_link: LinkSpec | None = None,
                  kinds: Sequence[LayerKind] | Callable[[LayerCost], LayerKind] | None = None,
                  progress: Callable[[str], None] | None = None) -> HybridResult:
    """The fastest per-layer plan and the best plan of each template (see the module docstring).

    ``budget_bytes``: memory per device (default: the device's). ``max_tp``:
    the largest tensor-parallel degree (default: the devices of one node,
    so TP never crosses the slow link). ``templates``: which of
    :data:`TEMPLATES` to search. ValueError for bad input; a template that
    nothing fits is absent from ``best`` and its closest miss is in
    ``misses``.
    """
    started = time.perf_counter()
    if not isinstance(costs, ModelCosts):
        raise ValueError(f"costs must be a ModelCosts profile, got {type(costs).__name__}")
    if not isinstance(cluster, ClusterSpec):
        raise ValueError(f"cluster must be a ClusterSpec, got {type(cluster).__name__}")
    world = cluster.world_size if world_size is None else world_size
    for name, value in (("global_batch", global_batch), ("world_size", world)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if world > cluster.world_size or world & (world - 1):
        raise ValueError(f"world_size must be a power of two no larger than {cluster.name}'s {cluster.world_size} "
                         f"devices, got {world}")
    unknown = [t for t in templates if t not in TEMPLATES]
    if unknown or not templates:
        raise ValueError(f"templates must be some of {', '.join(TEMPLATES)}, got {list(templates)}")
    budget = cluster.device.memory_bytes if budget_bytes is None else budget_bytes
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
        raise ValueError(f"budget_bytes must be a number of bytes > 0, got {budget_bytes!r}")
    limit = max_tp if max_tp is not None else 1 << (cluster.devices_per_node.bit_length() - 1)
    pool_options = dict(dp_kinds=tuple(dp_kinds), tp_kinds=tuple(tp_kinds), recompute=tuple(recompute), max_tp=limit)
    stage_strategies(1, **pool_options)  # bad options fail here, with their own message
    search = _Search(costs, cluster, global_batch, world, budget, pool_options, optimizer, collective_link,
                     layer_kinds(costs.layers, kinds))
    pps = _pp_options(world, costs.num_layers, pp_options)
    if not pps:
        raise ValueError(f"no pipeline degree in {list(pp_options or [])} divides {world} devices into power-of-two "
                         f"stages of at least one of the {costs.num_layers} layers")
    plans: list[HybridPlan] = []
    configs = [(pp, m) for pp in pps for m in _microbatch_options(pp, global_batch, world // pp, microbatch_options)]
    if not configs:
        raise ValueError(f"global batch {global_batch} does not split into whole samples per device for any pipeline "
                         f"degree in {pps} on {world} devices; use a multiple of {world}")
    tried: dict[tuple, set[tuple]] = {}
    several_nodes = world > cluster.devices_per_node
    for i, (pp, m) in enumerate(configs):
        if progress:
            progress(f"pipeline degree {pp}, {m} micro-batches ({i + 1}/{len(configs)})")
        n = world // pp
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
            if "per-layer" in templates:
                plans += _partitions(search, "per-layer", None, pp, m, tried.setdefault((pp, m, mesh_tp), set()))
            if set(templates) - {"per-layer"}:
                for strategy in search.pool(n):
                    if _template_names(strategy, pp, templates):  # the pool holds degrees up to mesh_tp
                        plans += _partitions(search, "uniform", strategy, pp, m, set())
    if "per-layer" in templates:  # the best templates' own splits, searched per layer too
        for p in sorted((p for p in plans if p.source is not None and p.plan.pp > 1),
                        key=lambda p: p.iteration_ms)[:TEMPLATE_SPLITS]:
            bounds = tuple((s.first, s.last) for s in p.stages)
            search.mesh_tp = p.plan.tp if several_nodes else None
            key = (p.plan.pp, p.plan.microbatches, search.mesh_tp)
            if bounds not in tried.setdefault(key, set()):
                tried[key].add(bounds)
                found = _evaluate(search, "per-layer", None, p.plan.pp, p.plan.microbatches, list(bounds))
                plans += [found] if found else []
    best: dict[str, HybridPlan] = {}
    for p in plans:
        names = ["per-layer"] if p.source is None else _template_names(p.source, p.plan.pp, templates)
        if "per-layer" in templates:
            names = sorted({*names, "per-layer"})  # a uniform assignment is one the programme costs too
        for name in names:
            if name not in best or (p.iteration_ms, p.name) < (best[name].iteration_ms, best[name].name):
                best[name] = p
    plans.sort(key=lambda p: (p.iteration_ms, p.name))
    misses = {name: miss for name, miss in search.misses.items() if name not in best}
    search.mesh_tp = None
    return HybridResult(best, plans, search.searched, time.perf_counter() - started, budget,
                        {n: search.pool(n) for n in (world // pp for pp in pps)}, misses)


def _template_names(strategy: LayerStrategy, pp: int, templates: Sequence[str]) -> list[str]:
    """The templates a uniform plan of ``strategy`` at pipeline degree ``pp`` stands for."""
    names = {"uniform"} | template_of(strategy)
    if pp > 1:
        names -= {"dp", "fsdp"}
    elif strategy.tp_degree == 1:
        names.discard("3d")  # no pipeline and no TP: that is pure DP
    return sorted(names & set(templates) - {"per-layer"})


def as_estimate(found: HybridPlan) -> Estimate:
    """The planner's :class:`~.estimate.Estimate` of a per-layer plan: compute of the slowest stage, the bubble,
    and as exposed communication its TP, DP and transition time plus the boundary transfers."""
    b = found.breakdown()
    exposed = b["tp_comm_ms"] + b["dp_comm_ms"] + b["transition_ms"] + found.p2p_ms
    partition = Partition.parse(found.plan.partition) if found.plan.pp > 1 else None
    detail = {k: v for k, v in b.items() if k not in ("bubble_ms",)}
    return Estimate(found.plan, found.iteration_ms, found.throughput, found.memory_bytes, b["compute_ms"],
                    found.bubble_ms, exposed, "per-layer DP", partition,
                    detail={**detail, "template": found.template, "layers": found.layers()})


def cost_plan(costs: ModelCosts, cluster: ClusterSpec, global_batch: int, plan: ParallelPlan | str, *,
              optimizer: str = "adam", collective_link: LinkSpec | None = None,
              kinds: Sequence[LayerKind] | Callable[[LayerCost], LayerKind] | None = None) -> HybridPlan:
    """What the per-layer model predicts for one given plan (as :func:`search_hybrid` costs its candidates):
    iteration time, its breakdown and each stage's memory per device (not checked against a budget).

    The plan runs without a pipeline, with 1F1B, or as GroPipe's groups without delay; its partition is
    ranges, or ``uniform`` (equal layer counts). ValueError for what the model does not cost.
    """
    plan = ParallelPlan.parse(plan) if isinstance(plan, str) else plan
    if not isinstance(plan, ParallelPlan):
        raise ValueError(f"plan must be a ParallelPlan or a plan name, got {type(plan).__name__}")
    spec_ = plan.pipeline
    if not (isinstance(spec_, (NoPipeline, OneFOneB)) or (isinstance(spec_, GroPipe) and spec_.delay == 0
                                                           and spec_.inner == "1f1b")):
        raise ValueError(f"plan {plan.name!r}: the per-layer model costs plans without a pipeline, with 1F1B, or "
                         f"GroPipe's 1F1B groups without delay; not {spec_.kind!r}")
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
    search = _Search(costs, cluster, global_batch, world, math.inf, {}, optimizer, collective_link,
                     layer_kinds(costs.layers, kinds))
    search.mesh_tp = plan.tp if world > cluster.devices_per_node else None
    layers = plan.layers_for(num)
    assignments = []
    for k, (a, b) in enumerate(bounds):
        spec = search.spec(pp, m, k, a, b)
        strategies = [LayerStrategy(l.tp_degree, l.dp, l.tp, l.consecutive, l.recompute, n) for l in layers[a:b + 1]]
        assignments.append(assignment_cost(spec, strategies))
    return _timed(search, plan, bounds, assignments, "given", None)
