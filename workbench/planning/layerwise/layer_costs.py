"""Per-layer costs on one pipeline stage: the stage as the search sees it, each layer under each strategy,
and the moves between layouts.

Cost model, per layer and strategy, on each device of the stage, for one
iteration of ``num_microbatches`` micro-batches (see :func:`layer_cost`):

* compute: the profile scaled to the group's share of the micro-batch and
  divided by the TP degree; recomputation re-runs the forward in backward;
* tensor parallelism, on the critical path: 1D runs Megatron's f / g, one
  all-reduce of the layer's output per pair of linears in each pass (an
  all-gather + reduce-scatter under sequence parallelism moves the same
  bytes); 2D broadcasts every linear's activation and weight blocks along
  grid rows and columns (SUMMA), twice as much in backward;
* data parallelism: DDP all-reduces gradients once per iteration (no sync on
  the other micro-batches), behind the last backward, a layer paying the
  fixed cost of the stage's 25 MiB buckets in proportion to its gradients;
  ZeRO-2 reduce-scatters
  gradients every micro-batch behind its backward, then all-gathers the
  updated parameters after the step (exposed); FSDP all-gathers parameters
  in every forward and backward and reduce-scatters gradients. Overlapped
  communication and compute both run ``overlap_slowdown`` (γ) times slower:
  together they take γ·min + |difference| (Galvatron's formula), never more
  than one after the other;
* memory: parameters, gradients and optimizer state divided by the TP
  degree and then as the DP kind shards them; saved activations for the
  micro-batches in flight divided by the TP degree, or with recomputation
  only the layer's input (whole on every rank of a 1D group);
* transitions: where consecutive layers' layouts differ (TP kind, degree or
  the consecutive flag), each rank fetches the part of the boundary tensor
  it lacks, forward and again for the gradient backward, on the link to the
  nearest rank holding it (:func:`transition_ms`); the layer-by-layer
  runtime does it with collectives over the stage (an all-gather forward
  where the rows were split, an all-reduce of the gradient backward where
  they are split again), each paying the cluster's per-step call cost;
* collective calls on ranks that time-share cores (``collective_call_ms``
  per step of a collective): every step waits for its peer to be scheduled
  when the group has more ranks than there are cores; a group that fits on
  the cores waits once, for its last member to arrive, and then runs its
  steps back to back (:func:`paying_steps`).

Left out, as Galvatron leaves them out: the optimizer step, the transient
full copy of one layer's parameters that FSDP gathers, the backward-time
peak of a recomputed layer, and compute time-sharing on CPU ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import lru_cache
from operator import attrgetter
from typing import Callable, Sequence

from ...core.costs import ClusterSpec, LayerCost, LinkSpec, ModelCosts
from ...core.fields import ErrorForm, check_int, field_error, is_int
from ...core.pods import level_link, span_level
from ...scheduling.stagecosts import OPTIMIZER_STATE_FACTORS, optimizer_bytes
from ..costs.clusters import shared_cores
from .layer_strategies import LayerKind, LayerStrategy, layer_kinds

__all__ = ["StageSpec", "LayerChoiceCost", "layer_cost", "transition_ms", "paying_steps", "MIB", "DDP_BUCKET_BYTES"]

MIB = 2**20
DDP_BUCKET_BYTES = 25 * MIB  # torch DDP's default bucket


_error: ErrorForm = field_error("layerwise")
# what a layer's cost may read of its profile: every value but the name
_profile_values = attrgetter(*(f.name for f in fields(LayerCost) if f.name != "name"))


def _kind_values(kind: LayerKind) -> tuple:
    """What a layer's cost may read of its kind, hashable whatever sequence holds its TP kinds."""
    return kind.name, tuple(kind.tp_kinds), kind.linears


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage as the search sees it.

    ``layers``: the stage's ``(first, last)`` layer indices of ``costs``
    (inclusive). ``microbatch_size``: samples per micro-batch through the
    stage, split over its data-parallel ranks. ``in_flight``: micro-batches
    whose activations the stage holds at once (1F1B: stages - stage index;
    GPipe: all). ``first_rank``: where the stage's ``devices`` ranks start
    in the cluster, which decides the links its groups cross; ``ranks``
    instead lists the cluster rank of each of the stage's local ranks (a
    plan's mesh puts data parallelism outermost, so a stage's ranks may be
    strided). Groups of layers (:meth:`LayerStrategy.tp_ranks`) are made of
    local ranks. ``kinds``: per
    layer :class:`LayerKind`, a function of the layer, or None to guess
    from the names. Collectives reach the cluster's ``collective_link``
    where it has one.
    """

    costs: ModelCosts
    cluster: ClusterSpec
    devices: int
    microbatch_size: int
    layers: tuple[int, int] | None = None
    num_microbatches: int = 1
    in_flight: int = 1
    first_rank: int = 0
    ranks: tuple[int, ...] | None = None
    optimizer: str = "adam"
    kinds: Sequence[LayerKind] | Callable[[LayerCost], LayerKind] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.costs, ModelCosts):
            raise _error("costs", type(self.costs).__name__, "expected a ModelCosts profile")
        if not isinstance(self.cluster, ClusterSpec):
            raise _error("cluster", type(self.cluster).__name__, "expected a ClusterSpec")
        check_int("devices", self.devices, 1, error=_error)
        if self.devices & (self.devices - 1):
            raise _error("devices", self.devices, "a power of two (the strategy trees split devices evenly)")
        for name in ("microbatch_size", "num_microbatches", "in_flight"):
            check_int(name, getattr(self, name), 1, error=_error)
        check_int("first_rank", self.first_rank, 0, error=_error)
        if self.ranks is not None:
            ranks = tuple(self.ranks) if isinstance(self.ranks, (tuple, list)) else ()
            if len(ranks) != self.devices or len(set(ranks)) != len(ranks) or not all(
                    is_int(r) and 0 <= r < self.cluster.world_size for r in ranks):
                raise _error("ranks", self.ranks, f"{self.devices} distinct ranks of the cluster's "
                             f"{self.cluster.world_size}, or None for first_rank onwards")
            object.__setattr__(self, "ranks", ranks)
        elif self.first_rank + self.devices > self.cluster.world_size:
            raise _error("first_rank", self.first_rank, f"the stage's {self.devices} ranks must lie inside the "
                         f"cluster's {self.cluster.world_size}")
        if self.microbatch_size % self.devices:
            raise _error("microbatch_size", self.microbatch_size, f"a multiple of the stage's {self.devices} devices, "
                         "so every data-parallel degree gets whole samples")
        if self.optimizer not in OPTIMIZER_STATE_FACTORS:
            raise _error("optimizer", self.optimizer, f"one of {sorted(OPTIMIZER_STATE_FACTORS)}")
        last = self.costs.num_layers - 1
        layers = (0, last) if self.layers is None else self.layers
        whole = isinstance(layers, (tuple, list)) and len(layers) == 2 \
            and all(is_int(i) for i in layers)
        if not (whole and 0 <= layers[0] <= layers[1] <= last):
            raise _error("layers", self.layers, f"(first, last) with 0 <= first <= last <= {last}")
        object.__setattr__(self, "layers", tuple(layers))
        object.__setattr__(self, "_layer_costs", self.costs.layers[layers[0]:layers[1] + 1])
        object.__setattr__(self, "_kinds", tuple(layer_kinds(self.layer_costs, self.kinds)))
        per_node = self.cluster.devices_per_node  # the ranks are checked: node_of's arithmetic without its check
        object.__setattr__(self, "_nodes", tuple(r // per_node for r in self.global_ranks))
        object.__setattr__(self, "_links", {})
        object.__setattr__(self, "_moves", {})  # transition_ms per (boundary bytes, layout before, after)
        object.__setattr__(self, "_costs", {})  # layer_cost per (layer class, strategy, gradient bytes if they matter)
        object.__setattr__(self, "_class_ids", {})  # layer class: what a layer's cost reads of it -> a number
        object.__setattr__(self, "_classes", None)  # each of the stage's layers' class, once asked
        object.__setattr__(self, "_grad_bytes", sum(l.grad_bytes for l in self.layer_costs))
        object.__setattr__(self, "_cores", shared_cores(self.cluster))

    @property
    def layer_costs(self) -> tuple[LayerCost, ...]:
        return self._layer_costs  # type: ignore[attr-defined]

    def kind(self, index: int) -> LayerKind:
        """The kind of the stage's ``index``-th layer (0 = its first)."""
        return self._kinds[index]  # type: ignore[attr-defined]

    def input_bytes(self, index: int) -> int:
        """Bytes of the stage's ``index``-th layer's input at the profile's batch (the previous layer's output)."""
        absolute = self.layers[0] + index
        return self.costs.input_bytes if absolute == 0 else self.costs.layers[absolute - 1].activation_bytes

    def share_costs(self, tables: dict) -> "StageSpec":
        """This stage, keeping its layer costs in ``tables`` (a dict, first empty), where every other stage given
        the same dict finds them: its entries are per profile, cluster, devices, micro-batch size and count,
        in-flight count, nodes and optimizer, so only stages that cost a layer alike share one. Returns self."""
        env = (id(self.costs), id(self.cluster), self.devices, self.microbatch_size, self.num_microbatches,
               self.in_flight, self._nodes, self.optimizer)  # type: ignore[attr-defined]
        if env not in tables:  # the entry holds the profile and cluster, so their ids stay theirs
            tables[env] = (self.costs, self.cluster, {}, {})
        _, _, known, ids = tables[env]
        object.__setattr__(self, "_costs", known)
        object.__setattr__(self, "_class_ids", ids)
        object.__setattr__(self, "_classes", None)
        return self

    def layer_classes(self) -> tuple[int, ...]:
        """A number per layer of the stage; equal numbers: the layers cost the same under every strategy (same
        profile values but the name, kind and input size)."""
        if self._classes is None:  # type: ignore[attr-defined]
            ids, kinds = self._class_ids, self._kinds  # type: ignore[attr-defined]
            keys = [(_kind_values(kinds[i]), self.input_bytes(i), _profile_values(layer))
                    for i, layer in enumerate(self.layer_costs)]
            object.__setattr__(self, "_classes", tuple(ids.setdefault(key, len(ids)) for key in keys))
        return self._classes  # type: ignore[attr-defined]

    @property
    def global_ranks(self) -> tuple[int, ...]:
        """The cluster rank of each of the stage's local ranks."""
        return self.ranks if self.ranks is not None else tuple(range(self.first_rank, self.first_rank + self.devices))

    @property
    def nodes(self) -> tuple[int, ...]:
        """The node of each of the stage's local ranks."""
        return self._nodes  # type: ignore[attr-defined]

    @property
    def node_pattern(self) -> tuple[int, ...]:
        """:attr:`nodes` numbered in order of first appearance (which ranks share a node, not which node)."""
        if "_pattern" not in self.__dict__:
            object.__setattr__(self, "_pattern", _renumbered(self._nodes))  # type: ignore[attr-defined]
        return self._pattern  # type: ignore[attr-defined]

    def group_link(self, groups: list[list[int]]) -> LinkSpec:
        """The link the slowest of these groups' collectives crosses (groups of the stage's local ranks)."""
        nodes, cluster = self.nodes, self.cluster
        if cluster.collective_link is not None:
            return cluster.collective_link
        return level_link(cluster, max((span_level(cluster, {nodes[r] for r in g}) for g in groups), default=0))

    def strategy_link(self, strategy: LayerStrategy, group: str) -> LinkSpec:
        """The link of ``strategy``'s ``"tp"`` or ``"dp"`` groups on this stage (cached per layout)."""
        key = (strategy.tp_degree, strategy.consecutive, group)
        links = self._links  # type: ignore[attr-defined]
        if key not in links:
            links[key] = self.group_link(strategy.tp_ranks() if group == "tp" else strategy.dp_ranks())
        return links[key]


@dataclass(frozen=True)
class LayerChoiceCost:
    """One layer under one strategy: iteration time on each device of the stage and its memory."""

    compute_ms: float
    tp_comm_ms: float
    dp_comm_ms: float  # what data-parallel communication adds beyond compute, after overlap
    state_bytes: int
    activation_bytes: int

    @property
    def time_ms(self) -> float:
        return self.compute_ms + self.tp_comm_ms + self.dp_comm_ms

    @property
    def memory_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


def _overlapped(compute: float, comm: float, slowdown: float) -> float:
    """Compute and communication at once, each slowed by ``slowdown`` while both run; never worse than serial."""
    return min(compute + comm, slowdown * min(compute, comm) + abs(compute - comm))


def paying_steps(spec: StageSpec, n: int, steps: int) -> int:
    """How many of a collective's ``steps`` among ``n`` ranks pay the cluster's per-step call cost.

    All of them where ``n`` exceeds the cores the node's ranks time-share
    (each step waits for its peer to be scheduled); one where the group fits
    on the cores (it waits for its last member, then runs its steps back to
    back); all of them on devices of their own, whose ``collective_call_ms``
    is the per-step cost as measured.
    """
    cores = spec._cores  # type: ignore[attr-defined]
    return min(steps, 1) if cores is not None and n <= cores else steps


def _gather_ms(spec: StageSpec, link: LinkSpec, nbytes: float, n: int) -> float:
    """Ring all-gather (or reduce-scatter) of a tensor of ``nbytes`` over ``n`` ranks: n - 1 steps."""
    if n == 1 or nbytes <= 0:
        return 0.0
    steps = n - 1
    return steps * link.latency_us * 1e-3 + paying_steps(spec, n, steps) * spec.cluster.collective_call_ms \
        + steps / n * nbytes / (link.bandwidth_gbs * 1e9) * 1e3


def _allreduce_call_ms(spec: StageSpec, n: int) -> float:
    return paying_steps(spec, n, 2 * (n - 1)) * spec.cluster.collective_call_ms if n > 1 else 0.0


def _allreduce_ms(spec: StageSpec, link: LinkSpec, nbytes: float, n: int) -> float:
    return link.allreduce_ms(nbytes, n) + _allreduce_call_ms(spec, n) if nbytes > 0 else 0.0


def _bucketed_allreduce_ms(spec: StageSpec, link: LinkSpec, nbytes: float, n: int, index: int) -> float:
    """DDP's gradient all-reduce of the stage's ``index``-th layer: its bytes, and its share of the per-step
    latency and call cost of the stage's buckets (DDP packs the layers' gradients into 25 MiB buckets, one
    collective each): the layer's part of the stage's gradients times the number of buckets they fill."""
    if nbytes <= 0 or n == 1:
        return 0.0
    steps = 2 * (n - 1)
    latency = steps * link.latency_us * 1e-3
    fixed = latency + _allreduce_call_ms(spec, n)
    total = spec._grad_bytes or 1  # type: ignore[attr-defined]
    share = spec.layer_costs[index].grad_bytes / total * math.ceil(total / DDP_BUCKET_BYTES)
    return link.allreduce_ms(nbytes, n) - latency + share * fixed


def layer_cost(spec: StageSpec, index: int, strategy: LayerStrategy) -> LayerChoiceCost:
    """The cost model of the module docstring for the stage's ``index``-th layer (0 = its first); each stage
    keeps what it has costed, per class of layer (:meth:`StageSpec.layer_classes`)."""
    known = spec._costs  # type: ignore[attr-defined]
    ddp = strategy.dp == "replicate" and strategy.tp_degree < spec.devices  # its buckets: the stage's gradients
    classes = spec._classes or spec.layer_classes()  # type: ignore[attr-defined]
    key = (classes[index], strategy, spec._grad_bytes if ddp else None)  # type: ignore[attr-defined]
    found = known.get(key)
    if found is None:
        found = known[key] = _layer_cost(spec, index, strategy)
    return found


def samples_share(spec: StageSpec, strategy: LayerStrategy) -> float:
    """A layer's samples on each tensor-parallel group of the stage, against the profile's batch: what its
    profiled times are scaled by (and divided by its tensor-parallel degree)."""
    return spec.microbatch_size / strategy.dp_degree / spec.costs.batch_size


def _layer_cost(spec: StageSpec, index: int, strategy: LayerStrategy) -> LayerChoiceCost:
    if strategy.devices != spec.devices:
        raise _error("strategy.devices", strategy.devices, f"the stage's {spec.devices} devices")
    layer, kind = spec.layer_costs[index], spec.kind(index)
    t, d, m = strategy.tp_degree, strategy.dp_degree, spec.num_microbatches
    if strategy.tp != "none" and strategy.tp not in kind.tp_kinds:
        raise _error("strategy.tp", strategy.tp, f"layer {layer.name!r} ({kind.name}) admits "
                     f"{', '.join(kind.tp_kinds) or 'no tensor parallelism'}")
    share = samples_share(spec, strategy)
    forward = layer.forward_ms * share / t
    backward = layer.backward_ms * share / t + (forward if strategy.recompute else 0.0)
    output = layer.activation_bytes * share
    tp_ms = 0.0
    if t > 1:
        link = spec.strategy_link(strategy, "tp")
        passes = 3 if strategy.recompute else 2  # forward, backward (and the forward again)
        if strategy.tp == "1d":
            tp_ms = passes * math.ceil(kind.linears / 2) * _allreduce_ms(spec, link, output, t)
        else:
            q = math.isqrt(t)
            forward_bytes = (q - 1) / t * (kind.linears * output + layer.param_bytes)
            forward_ms = forward_bytes / (link.bandwidth_gbs * 1e9) * 1e3 + 2 * kind.linears * (
                (q - 1) * link.latency_us * 1e-3 + paying_steps(spec, q, q - 1) * spec.cluster.collective_call_ms)
            tp_ms = (passes + 1) * forward_ms  # backward moves twice the forward's blocks
    params, grads = layer.param_bytes / t, layer.grad_bytes / t
    states = optimizer_bytes(layer, spec.optimizer) / t
    solo = m * (forward + backward)
    if d == 1:
        busy = solo
    else:
        link, gamma = spec.strategy_link(strategy, "dp"), spec.cluster.overlap_slowdown
        if strategy.dp == "replicate":
            reduce = _bucketed_allreduce_ms(spec, link, grads, d, index)
            busy = m * forward + (m - 1) * backward + _overlapped(backward, reduce, gamma)
        elif strategy.dp == "zero2":
            scatter = _gather_ms(spec, link, grads, d)
            busy = m * (forward + _overlapped(backward, scatter, gamma)) + _gather_ms(spec, link, params, d)
        else:
            gather, scatter = _gather_ms(spec, link, params, d), _gather_ms(spec, link, grads, d)
            busy = m * (_overlapped(forward, gather, gamma) + _overlapped(backward, gather + scatter, gamma))
    sharded = {"replicate": params + grads + states, "zero2": params + (grads + states) / d,
               "fsdp": (params + grads + states) / d}[strategy.dp]
    if strategy.recompute:
        kept = spec.input_bytes(index) * share / (t if strategy.tp == "2d" else 1)
    else:
        kept = (layer.saved_bytes or layer.activation_bytes) * share / t
    return LayerChoiceCost(solo, m * tp_ms, busy - solo, math.ceil(sharded), math.ceil(kept * spec.in_flight))


def _block(layout: tuple[str, int, bool], devices: int, rank: int) -> tuple[int, int, int, int]:
    """The units of a boundary tensor ``rank`` holds, as a block ``(first slice, end, first piece, end)``: the
    micro-batch is cut into ``devices`` sample slices, each cut into ``devices`` hidden pieces. Data-parallel
    index i (rank // t when consecutive, rank mod d when strided) owns the i-th of d equal runs of samples.
    1D / no TP: every rank of a group holds its samples whole; 2D: grid rank (a, b) holds their row block a,
    hidden block b."""
    tp, t, consecutive = layout
    n, d = devices, devices // t
    group, pos = (rank // t, rank % t) if consecutive else (rank % d, rank // d)
    if tp != "2d":
        return group * t, (group + 1) * t, 0, n  # a group owns n / d = t slices
    q = math.isqrt(t)
    row, col = divmod(pos, q)
    return group * t + row * q, group * t + (row + 1) * q, col * (n // q), (col + 1) * (n // q)


def _cells(block: tuple[int, int, int, int], slice_unit: int, piece_unit: int) -> frozenset[tuple[int, int]]:
    """The block as cells of ``slice_unit`` slices x ``piece_unit`` pieces (blocks are whole cells)."""
    s0, s1, p0, p1 = block
    return frozenset((s, p) for s in range(s0 // slice_unit, s1 // slice_unit)
                     for p in range(p0 // piece_unit, p1 // piece_unit))


def _fetch_units(have: tuple[str, int, bool], need: tuple[str, int, bool], devices: int,
                 node: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The distinct ``(from its node, from others)`` counts of units a rank fetches to go from layout ``have`` to
    ``need`` (see :func:`_block`): it lacks what it needs minus what it holds, finds on its node what any rank
    there holds. Only which ranks share a node matters, so the nodes are renumbered in order of appearance."""
    return _fetches(have, need, devices, _renumbered(node))


def _renumbered(node: tuple[int, ...]) -> tuple[int, ...]:
    """The nodes numbered in order of first appearance: equal for stages whose ranks share nodes alike."""
    numbers: dict[int, int] = {}
    return tuple(numbers.setdefault(x, len(numbers)) for x in node)


@lru_cache(maxsize=4096)
def _fetches(have: tuple[str, int, bool], need: tuple[str, int, bool], devices: int,
             node: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """:func:`_fetch_units` counted on cells both layouts' blocks are made of, so a stage of many ranks stays
    cheap: a node's cells once, each distinct block's once."""
    if have[0] != "2d" and need[0] != "2d":
        return _fetches_1d(have, need, devices, node)
    held = [_block(have, devices, r) for r in range(devices)]
    wanted = [_block(need, devices, r) for r in range(devices)]
    slice_unit = min(held[0][1] - held[0][0], wanted[0][1] - wanted[0][0])  # powers of two: the smaller divides
    piece_unit = min(held[0][3] - held[0][2], wanted[0][3] - wanted[0][2])
    size = slice_unit * piece_unit
    on_node: dict[int, set[tuple[int, int]]] = {}
    for x, block in dict.fromkeys(zip(node, held)):
        on_node.setdefault(x, set()).update(_cells(block, slice_unit, piece_unit))
    found: dict[tuple, int] = {}  # cells of a wanted block on a node
    out: dict[tuple[int, int], None] = {}
    for r in range(devices):
        w0, w1, q0, q1 = want = wanted[r]
        if (want, node[r]) not in found:
            found[want, node[r]] = len(_cells(want, slice_unit, piece_unit) & on_node[node[r]])
        here = found[want, node[r]]  # the rank's own block is among its node's
        s0, s1, p0, p1 = held[r]
        own = max(0, min(s1, w1) - max(s0, w0)) * max(0, min(p1, q1) - max(p0, q0))
        out[(here * size - own, (w1 - w0) * (q1 - q0) - here * size)] = None
    return tuple(out)


def _fetches_1d(have: tuple[str, int, bool], need: tuple[str, int, bool], devices: int,
                node: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """:func:`_fetches` where every block holds whole slices (no 2D layout): runs of slices, counted in units
    of the smaller group's run."""
    n, (_, th, ch), (_, tn, cn) = devices, have, need
    dh, dn, unit = n // th, n // tn, min(th, tn)
    on_node: dict[int, set[int]] = {}
    for x, g in dict.fromkeys(zip(node, (r // th if ch else r % dh for r in range(n)))):
        on_node.setdefault(x, set()).update(range(g * th // unit, (g + 1) * th // unit))
    found: dict[tuple[int, int], int] = {}  # units of a wanted run on a node
    out: dict[tuple[int, int], None] = {}
    for r in range(n):
        h0, w0, x = (r // th if ch else r % dh) * th, (r // tn if cn else r % dn) * tn, node[r]
        here = found.get((w0, x))
        if here is None:
            units = on_node[x]
            here = found[w0, x] = sum(u in units for u in range(w0 // unit, (w0 + tn) // unit)) * unit
        own = max(0, min(h0 + th, w0 + tn) - max(h0, w0))  # the rank's own run is among its node's
        out[((here - own) * n, (tn - here) * n)] = None
    return tuple(out)


def transition_ms(spec: StageSpec, index: int, before: LayerStrategy, after: LayerStrategy) -> float:
    """Redistribution of the boundary tensor into the stage's ``index``-th layer, forward and backward, per
    iteration: the slowest rank's fetches over point-to-point links (0 when the layouts match)."""
    if index == 0 or before.layout == after.layout:
        return 0.0
    nbytes = spec.costs.layers[spec.layers[0] + index - 1].activation_bytes
    key = (nbytes, before.layout, after.layout)
    moves = spec._moves  # type: ignore[attr-defined]
    if key not in moves:
        moves[key] = _redistribution_ms(spec, nbytes, before.layout, after.layout)
    return moves[key]


def _redistribution_ms(spec: StageSpec, nbytes: int, before: tuple[str, int, bool],
                       after: tuple[str, int, bool]) -> float:
    """:func:`transition_ms` of a boundary tensor of ``nbytes`` at the profile's batch between two layouts."""
    n, cluster = spec.devices, spec.cluster
    unit = nbytes * spec.microbatch_size / spec.costs.batch_size / (n * n)
    far_link = level_link(cluster, span_level(cluster, spec.nodes))  # the slowest link inside the stage
    total = 0.0
    for have, need in ((before, after), (after, before)):  # activation, then gradient
        fetches = _fetches(have, need, n, spec.node_pattern)
        total += max(cluster.intra_node.transfer_ms(near * unit) + far_link.transfer_ms(far * unit)
                     for near, far in fetches)
    # the runtime's calls: an all-gather over the stage where the rows were split (before), an all-reduce of
    # the gradient where they are split again (after); a 1D layout of degree n holds every row on every rank
    split = [layout[1] < n for layout in (before, after)]
    total += split[0] * paying_steps(spec, n, n - 1) * cluster.collective_call_ms
    total += split[1] * _allreduce_call_ms(spec, n)
    return spec.num_microbatches * total
