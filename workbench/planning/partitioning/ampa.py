"""AMPA: exact contiguous partitioning by performance projection, and the outer search.

Problem. Cut L profiled layers into S contiguous stages so the pipeline's
projected iteration time, ``(m + S - 1) x bottleneck`` for ``m`` micro-batches,
is smallest. A stage's cost per micro-batch is its forward plus backward
time plus twice its output boundary transfer (the activation goes down, its
gradient comes back): ``T_k + 2 C_k``. Every stage must fit a per-device
memory cap counting weights, gradients, optimizer state and the saved
activations of the micro-batches the schedule keeps in flight on it and
the older weight versions it keeps, both read off the generated schedule
(``workbench.scheduling.registry.stage_memory``; 1F1B keeps
``min(S - k, m)`` on stage ``k``, GPipe ``m``, ZB-H2 up to ``2S - 1``).

Approach (exact). For a bound ``tau``, "can layers ``0..b`` end stage ``k``"
is a reachability question: stage ``k`` may span ``(a, b]`` iff ``a`` was
reachable by ``k`` stages and ``a >= lb_k(b)``, where the lower bound comes
from the time bound (prefix sums of ``T`` are increasing, so it is a
bisection) and from the memory cap (likewise). One sweep per stage answers
it in O(S L) with prefix counts. The optimum is the smallest feasible
``tau``: bisection on ``tau`` (whose upper end always jumps to the
*achieved* bottleneck of the partition found) narrows the interval until
only a few stage-cost values lie inside; those are enumerated (for a fixed
stage end, the cost falls with the start, so each end contributes one
bisected range) and binary-searched, which pins the optimum exactly (the
tests check it against brute force). A memory cap no
partition meets is reported with the smallest cap that would work and the
stage that needs it.

:func:`search` runs AMPA for every ``groups x stages`` factorisation of the
world size and every micro-batch count, adds the projected exposed gradient
all-reduce (GroPipe, delay 0 or 1), and ranks the alternatives.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from operator import gt
from typing import Any, Sequence

from ...core.costs import ClusterSpec, LinkSpec, ModelCosts
from ...core.fields import check_int
from ...core.partition import Partition
from ...core.plan import PIPELINE_KINDS, ParallelPlan
from ...scheduling.registry import StageMemory, stage_memory
from ...scheduling.stagecosts import layer_times_ms, optimizer_bytes

__all__ = ["ampa", "search", "PartitionResult", "SearchCandidate", "Projection", "kind_memory"]

_REL_TOL = 1e-9
GIB = 2**30


def kind_memory(kind: str, num_stages: int, num_microbatches: int) -> StageMemory:
    """What pipeline ``kind`` keeps per (virtual) stage with ``num_stages`` stages and ``num_microbatches``,
    read off its schedule (one pipeline; GroPipe's groups keep what their inner kind keeps)."""
    if kind not in PIPELINE_KINDS or kind == "none":
        raise ValueError(f"schedule must be a pipeline kind, one of {', '.join(k for k in PIPELINE_KINDS if k != 'none')}"
                         f"; got {kind!r}")
    cls = PIPELINE_KINDS[kind]
    chunks = cls().chunks
    if num_stages % chunks:
        raise ValueError(f"pipeline kind {kind!r} holds {chunks} stages per rank; {num_stages} stages do not divide")
    if num_stages // chunks < cls.min_stages:  # one stage: each micro-batch's backward follows its forward
        return StageMemory((1,) * num_stages, (0,) * num_stages)
    return stage_memory(ParallelPlan.for_pipeline(kind, num_stages // chunks, num_microbatches))


@dataclass(frozen=True)
class PartitionResult:
    """A partition with its projected per-stage costs (per micro-batch) and memory."""

    partition: Partition
    algorithm: str
    stage_forward_ms: list[float]
    stage_backward_ms: list[float]
    stage_comm_ms: list[float]
    stage_memory_bytes: list[int]
    bottleneck_ms: float
    bottleneck_stage: int
    num_microbatches: int
    microbatch_size: int
    schedule: str
    memory_cap_bytes: int | None = None
    projected_iteration_ms: float = 0.0

    @property
    def stage_compute_ms(self) -> list[float]:
        return [f + b for f, b in zip(self.stage_forward_ms, self.stage_backward_ms)]

    @property
    def stage_cost_ms(self) -> list[float]:
        """What the bottleneck is the max of: compute plus boundary transfers."""
        return [c + t for c, t in zip(self.stage_compute_ms, self.stage_comm_ms)]

    @property
    def fits(self) -> bool:
        cap = self.memory_cap_bytes
        return cap is None or max(self.stage_memory_bytes) <= cap

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": str(self.partition), "algorithm": self.algorithm, "schedule": self.schedule,
            "num_microbatches": self.num_microbatches, "microbatch_size": self.microbatch_size,
            "stages": [{"layers": [a, b], "compute_ms": c, "forward_ms": f, "backward_ms": bw, "comm_ms": t,
                        "memory_bytes": mem}
                       for (a, b), c, f, bw, t, mem in zip(self.partition.bounds, self.stage_compute_ms,
                                                          self.stage_forward_ms, self.stage_backward_ms,
                                                          self.stage_comm_ms, self.stage_memory_bytes)],
            "bottleneck_ms": self.bottleneck_ms, "bottleneck_stage": self.bottleneck_stage,
            "memory_cap_bytes": self.memory_cap_bytes, "projected_iteration_ms": self.projected_iteration_ms,
        }


class Projection:
    """Per-layer numbers at one micro-batch size, with prefix sums, for one (S, m, schedule).

    ``schedule`` is the pipeline kind whose schedule's memory the stages
    keep (a kind name), or that memory itself (a ``StageMemory``).
    """

    def __init__(self, costs: ModelCosts, num_stages: int, *, num_microbatches: int,
                 schedule: str | StageMemory = "1f1b",
                 batch_size: int | None = None, cluster: ClusterSpec | None = None, optimizer: str = "adam",
                 first_rank: int = 0) -> None:
        L = costs.num_layers
        check_int("num_stages", num_stages, 1)
        if num_stages > L:
            raise ValueError(f"num_stages={num_stages} is more stages than the model's {L} layers; use at most {L}")
        check_int("num_microbatches", num_microbatches, 1)
        if cluster is not None and cluster.world_size < first_rank + num_stages:
            raise ValueError(f"cluster {cluster.name!r} has {cluster.world_size} devices, too few for "
                             f"{num_stages} stages")
        batch = costs.batch_size if batch_size is None else batch_size
        if batch % num_microbatches:
            raise ValueError(f"num_microbatches={num_microbatches} does not divide the batch of {batch} samples; "
                             f"use a divisor of {batch}")
        self.memory = schedule if isinstance(schedule, StageMemory) else kind_memory(schedule, num_stages,
                                                                                     num_microbatches)
        if len(self.memory.in_flight) != num_stages:
            raise ValueError(f"the schedule's memory covers {len(self.memory.in_flight)} stages, expected {num_stages}")
        self.costs, self.num_stages, self.num_microbatches = costs, num_stages, num_microbatches
        self.schedule = schedule if isinstance(schedule, str) else (schedule.kind or "planned")
        self.microbatch_size = batch // num_microbatches
        scale = self.microbatch_size / costs.batch_size
        self.forward, self.backward = layer_times_ms(costs, self.microbatch_size,
                                                     device=cluster.device if cluster else None)
        self.pre_f = [0.0, *accumulate(self.forward)]
        self.pre_b = [0.0, *accumulate(self.backward)]
        self.pre_t = [f + b for f, b in zip(self.pre_f, self.pre_b)]
        layers = costs.layers
        static = [l.param_bytes + (l.grad_bytes or 0) + optimizer_bytes(l, optimizer) for l in layers]
        self.pre_static = [0, *accumulate(static)]
        self.pre_saved = [0.0, *accumulate((l.saved_bytes or l.activation_bytes) * scale for l in layers)]
        self.pre_param = [0, *accumulate(l.param_bytes for l in layers)]
        act = [l.activation_bytes * scale for l in layers]
        # the link after stage k runs between ranks first_rank + k and first_rank + k + 1
        self.links: list[LinkSpec | None] = [
            cluster.link(first_rank + k, first_rank + k + 1) if cluster and k + 1 < num_stages else None
            for k in range(num_stages)]
        self._boundary: dict[str, list[float]] = {}
        for link in self.links:
            if link is not None and link.name not in self._boundary:
                self._boundary[link.name] = [0.0] + [2 * link.transfer_ms(a) for a in act[:-1]] + [0.0]
        self.zero_boundary = [0.0] * (L + 1)
        self._memory: dict[tuple[int, int], list[float]] = {}

    def boundary(self, stage: int) -> list[float]:
        """Per cut position ``b`` (stage ends after layer ``b - 1``), the stage's two boundary transfers."""
        link = self.links[stage]
        return self.zero_boundary if link is None else self._boundary[link.name]

    def memory_prefix(self, stage: int) -> list[float]:
        """Prefix sums of stage ``stage``'s memory: static state + in-flight activations (+ stashed versions)."""
        n, stash = self.memory.in_flight[stage], self.memory.extra_versions[stage]
        key = (n, stash)
        if key not in self._memory:
            self._memory[key] = [s + n * a + stash * p for s, a, p in zip(self.pre_static, self.pre_saved,
                                                                           self.pre_param)]
        return self._memory[key]

    def stage_cost(self, stage: int, a: int, b: int) -> float:
        return self.pre_t[b] - self.pre_t[a] + self.boundary(stage)[b]

    def evaluate(self, partition: Partition, algorithm: str, memory_cap_bytes: int | None = None) -> PartitionResult:
        partition.check_covers(self.costs.num_layers)
        if partition.num_stages != self.num_stages:
            raise ValueError(f"partition {partition} has {partition.num_stages} stages, expected {self.num_stages}")
        cuts = [(a, b + 1) for a, b in partition.bounds]
        fwd = [self.pre_f[b] - self.pre_f[a] for a, b in cuts]
        bwd = [self.pre_b[b] - self.pre_b[a] for a, b in cuts]
        comm = [self.boundary(k)[b] for k, (_, b) in enumerate(cuts)]
        mem = [int(round(self.memory_prefix(k)[b] - self.memory_prefix(k)[a])) for k, (a, b) in enumerate(cuts)]
        cost = [f + g + c for f, g, c in zip(fwd, bwd, comm)]
        worst = max(range(len(cost)), key=cost.__getitem__)
        return PartitionResult(partition, algorithm, fwd, bwd, comm, mem, cost[worst], worst, self.num_microbatches,
                               self.microbatch_size, self.schedule, memory_cap_bytes,
                               (self.num_microbatches + self.num_stages - 1) * cost[worst])


def check_fits(result: PartitionResult) -> None:
    """Raise naming the stage and the excess when ``result`` breaks its memory cap."""
    cap = result.memory_cap_bytes
    if cap is None:
        return
    for k, mem in enumerate(result.stage_memory_bytes):
        if mem > cap:
            raise ValueError(f"partition {result.partition} breaks the memory cap of {cap / GIB:.3f} GiB: stage {k} "
                             f"needs {mem / GIB:.3f} GiB, {(mem - cap) / GIB:.3f} GiB over")


def _reachable(proj: Projection, tau: float, mem_lbs: list[list[int]]) -> list[tuple[int, int]] | None:
    """Stage bounds (first, last layer) with every stage cost <= tau and within memory, or None."""
    S, L = proj.num_stages, proj.costs.num_layers
    pre_t = proj.pre_t
    # Candidate bounds are computed as x - pre_t[a]; undo that subtraction's rounding so start a stays admissible.
    slack = 1e-13 * max(1.0, pre_t[-1])
    time_lbs: dict[int, list[int]] = {}
    combined: dict[tuple[int, int], list[int]] = {}
    reach: list[list[bool]] = [[True] + [False] * L]
    lbs: list[list[int]] = []
    for k in range(S):
        boundary = proj.boundary(k)
        key = (id(boundary), id(mem_lbs[k]))
        if key not in combined:
            if key[0] not in time_lbs:
                time_lbs[key[0]] = [bisect_left(pre_t, t + c - tau - slack) for t, c in zip(pre_t, boundary)]
            combined[key] = list(map(max, time_lbs[key[0]], mem_lbs[k]))
        lb = combined[key]
        counts = [0, *accumulate(reach[-1])]
        row = list(map(gt, counts[: L + 1], map(counts.__getitem__, lb)))
        if not any(row):
            return None
        reach.append(row)
        lbs.append(lb)
    if not reach[S][L]:
        return None
    bounds, b = [], L
    for k in reversed(range(S)):
        a = next(a for a in range(b - 1, lbs[k][b] - 1, -1) if reach[k][a])
        bounds.append((a, b - 1))
        b = a
    return bounds[::-1]


def _memory_lower_bounds(proj: Projection, cap: float | None) -> list[list[int]]:
    L = proj.costs.num_layers
    if cap is None:
        return [[0] * (L + 1)] * proj.num_stages
    by_prefix: dict[int, list[int]] = {}
    out = []
    for k in range(proj.num_stages):
        pre = proj.memory_prefix(k)
        if id(pre) not in by_prefix:
            by_prefix[id(pre)] = [bisect_left(pre, v - cap - 1e-6) for v in pre]
        out.append(by_prefix[id(pre)])
    return out


def _memory_failure(proj: Projection, cap: int) -> ValueError:
    lo, hi = float(cap), float(max(proj.memory_prefix(k)[-1] for k in range(proj.num_stages)))
    bounds = _reachable(proj, float("inf"), _memory_lower_bounds(proj, hi))
    while hi - lo > max(1.0, 1e-6 * hi):
        mid = (lo + hi) / 2
        found = _reachable(proj, float("inf"), _memory_lower_bounds(proj, mid))
        if found:
            hi, bounds = mid, found
        else:
            lo = mid
    result = proj.evaluate(Partition(tuple(bounds)), "ampa", cap)
    worst = max(range(proj.num_stages), key=result.stage_memory_bytes.__getitem__)
    need = result.stage_memory_bytes[worst]
    return ValueError(
        f"no partition of {proj.costs.num_layers} layers into {proj.num_stages} stages fits the memory cap of "
        f"{cap / GIB:.3f} GiB ({proj.schedule}, {proj.num_microbatches} micro-batch"
        f"{'' if proj.num_microbatches == 1 else 'es'}): even the most "
        f"memory-balanced partition {result.partition} needs {need / GIB:.3f} GiB on stage {worst}, "
        f"{(need - cap) / GIB:.3f} GiB over the cap")


def _candidates(proj: Projection, lo: float, hi: float, limit: int) -> list[float] | None:
    """Every stage-cost value in ``(lo, hi)``, sorted, or None when there are more than ``limit``.

    For a fixed end ``b`` a stage's cost falls as its start ``a`` grows, so
    the starts whose cost lies in the window are one bisected range.
    """
    pre_t = proj.pre_t
    classes = {id(proj.boundary(k)): proj.boundary(k) for k in range(proj.num_stages)}
    ranges = []
    count = 0
    for boundary in classes.values():
        for b in range(1, len(pre_t)):
            x = pre_t[b] + boundary[b]
            first, stop = bisect_left(pre_t, x - hi), min(bisect_left(pre_t, x - lo), b)
            if stop > first:
                count += stop - first
                if count > limit:
                    return None
                ranges.append((x, first, stop))
    values = {x - pre_t[a] for x, first, stop in ranges for a in range(first, stop)}
    return sorted(v for v in values if lo < v < hi)


def _even_time_split(proj: Projection) -> Partition:
    """Cut where the running compute time crosses k/S of the total (a cheap, usually close, starting bound)."""
    L, S, pre_t = proj.costs.num_layers, proj.num_stages, proj.pre_t
    cuts, prev = [], 0
    for k in range(1, S):
        prev = min(max(bisect_left(pre_t, pre_t[-1] * k / S), prev + 1), L - (S - k))
        cuts.append(prev)
    return Partition.from_cuts(cuts, L)


def solve(proj: Projection, memory_cap_bytes: int | None = None) -> PartitionResult:
    """The exact AMPA partition for one projection (see the module docstring).

    Bisection on the bound narrows ``(lo, hi]`` (the optimum is above ``lo``
    and ``hi`` is achieved) until few stage-cost values remain inside; a
    binary search over exactly those values then pins the optimum.
    """
    mem_lbs = _memory_lower_bounds(proj, memory_cap_bytes)
    bounds = _reachable(proj, float("inf"), mem_lbs)
    if bounds is None:
        raise _memory_failure(proj, memory_cap_bytes)
    best = proj.evaluate(Partition(tuple(bounds)), "ampa", memory_cap_bytes)
    even = proj.evaluate(_even_time_split(proj), "ampa", memory_cap_bytes)
    if even.fits and even.bottleneck_ms < best.bottleneck_ms:
        best = even

    def attempt(tau: float) -> bool:
        nonlocal best
        found = _reachable(proj, tau, mem_lbs)
        if found is None:
            return False
        result = proj.evaluate(Partition(tuple(found)), "ampa", memory_cap_bytes)
        if result.bottleneck_ms < best.bottleneck_ms:
            best = result
        return True

    lo = max(max(f + b for f, b in zip(proj.forward, proj.backward)), proj.pre_t[-1] / proj.num_stages) * (1 - 1e-12)
    while best.bottleneck_ms - lo > _REL_TOL * best.bottleneck_ms:
        values = _candidates(proj, lo, best.bottleneck_ms, limit=4096)
        if values is not None:
            while values:
                mid = len(values) // 2
                if attempt(values[mid]):
                    values = [v for v in values[:mid] if v < best.bottleneck_ms]
                else:
                    values = values[mid + 1:]
            break
        mid = (lo + best.bottleneck_ms) / 2
        if not attempt(mid):
            lo = mid
    return best


def ampa(costs: ModelCosts, num_stages: int, *, num_microbatches: int, schedule: str = "1f1b",
         memory_cap_bytes: int | None = None, cluster: ClusterSpec | None = None, batch_size: int | None = None,
         optimizer: str = "adam") -> PartitionResult:
    """Optimal contiguous partition of ``costs`` into ``num_stages`` stages (see the module docstring).

    ``batch_size`` is the samples one pipeline processes per iteration
    (default: the profile's batch); it is split into ``num_microbatches``.
    Without ``memory_cap_bytes`` the cluster's device memory is the cap.
    """
    proj = Projection(costs, num_stages, num_microbatches=num_microbatches, schedule=schedule, batch_size=batch_size,
                      cluster=cluster, optimizer=optimizer)
    cap = memory_cap_bytes if memory_cap_bytes is not None else (cluster.device.memory_bytes if cluster else None)
    return solve(proj, cap)


@dataclass(frozen=True)
class SearchCandidate:
    """One (groups, stages, micro-batches) configuration with its projection, or why it is infeasible."""

    groups: int
    stages: int
    num_microbatches: int
    microbatch_size: int
    projected_iteration_ms: float = float("inf")
    throughput: float = 0.0
    exposed_allreduce_ms: float = 0.0
    result: PartitionResult | None = field(default=None, compare=False)
    infeasible: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "result"}
        out["partition"] = str(self.result.partition) if self.result else None
        return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _allreduce_exposed(proj: Projection, result: PartitionResult, cluster: ClusterSpec | None, groups: int,
                       delay: int) -> float:
    if groups == 1 or cluster is None:
        return 0.0
    S = proj.num_stages
    grad = [proj.pre_param[b + 1] - proj.pre_param[a] for a, b in result.partition.bounds]
    times = []
    for k in range(S):  # stage k of every group (rank g * S + k, as Topology(dp=groups, pp=S) numbers them)
        link = cluster.allreduce_link(list(range(k, groups * S, S)))
        times.append(link.allreduce_ms(grad[k], groups) + cluster.allreduce_call_ms(groups))
    if delay == 1:
        return max(0.0, max(times) - result.projected_iteration_ms)
    tail = result.stage_backward_ms[result.bottleneck_stage]
    return max(max(0.0, t - k * tail) for k, t in enumerate(times))


def search(costs: ModelCosts, world_size: int, *, global_batch: int, cluster: ClusterSpec | None = None,
           schedule: str = "1f1b", delay: int = 1, memory_cap_bytes: int | None = None,
           microbatch_counts: Sequence[int] | None = None, stages: int | None = None,
           groups: int | None = None) -> list[SearchCandidate]:
    """Rank every ``groups x stages = world_size`` and micro-batch count by projected iteration time.

    Feasible candidates come first, fastest first; infeasible ones follow
    with the reason. ``stages`` / ``groups`` pin one factor (it must divide
    ``world_size``). Gradient all-reduces reach the cluster's
    ``collective_link`` where it has one.
    """
    for name, value in (("world_size", world_size), ("global_batch", global_batch)):
        check_int(name, value, 1)
    if delay not in (0, 1):
        raise ValueError(f"delay must be 0 or 1, got {delay!r}")
    for name, value in (("stages", stages), ("groups", groups)):
        if value is not None and (not isinstance(value, int) or value < 1 or world_size % value):
            raise ValueError(f"{name}={value!r} does not divide world_size={world_size}; "
                             f"valid: {_divisors(world_size)}")
    if cluster is not None and cluster.world_size < world_size:
        raise ValueError(f"cluster {cluster.name!r} has {cluster.world_size} devices, fewer than world_size={world_size}")
    cap = memory_cap_bytes if memory_cap_bytes is not None else (cluster.device.memory_bytes if cluster else None)
    out: list[SearchCandidate] = []
    for S in _divisors(world_size):
        G = world_size // S
        if (stages is not None and S != stages) or (groups is not None and G != groups):
            continue
        if S > costs.num_layers:
            out.append(SearchCandidate(G, S, 0, 0, infeasible=f"{S} stages > {costs.num_layers} layers"))
            continue
        if global_batch % G:
            out.append(SearchCandidate(G, S, 0, 0, infeasible=f"global batch {global_batch} not divisible by {G} groups"))
            continue
        batch = global_batch // G
        for m in microbatch_counts or _divisors(batch):
            if batch % m:
                continue
            proj = Projection(costs, S, num_microbatches=m, schedule=schedule, batch_size=batch, cluster=cluster)
            try:
                result = solve(proj, cap)
            except ValueError as exc:
                out.append(SearchCandidate(G, S, m, batch // m, infeasible=str(exc)))
                continue
            exposed = _allreduce_exposed(proj, result, cluster, G, delay)
            iteration = result.projected_iteration_ms + exposed
            out.append(SearchCandidate(G, S, m, batch // m, iteration, global_batch / (iteration / 1e3), exposed,
                                       result))
    out.sort(key=lambda c: (c.infeasible is not None, c.projected_iteration_ms, c.stages))
    return out
