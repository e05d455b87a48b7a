"""What one strategy costs on one cluster: iteration time, its breakdown and memory per device.

Problem. The planner compares data parallelism, plain and asynchronous
pipelines, GroPipe and tensor parallelism on one footing, so each needs the
same answer: how long an iteration takes, where that time goes (compute,
pipeline bubble, communication left exposed) and how much memory the
busiest device needs, before anything runs.

Approach. Every estimate is built from the workbench's own models, never a
second formula for the same thing:

* partition: AMPA (:mod:`~workbench.planning.partitioning.ampa`) cuts the profile into the strategy's
  stages under the memory cap, for its schedule's in-flight micro-batches;
* schedule: the generator the runtime executes (:mod:`~workbench.scheduling.
  generators`), lowered with its sends, receives and gradient all-reduces;
* timed simulation (:func:`~workbench.scheduling.simulate.simulate`) on the
  cluster's links, intra- vs inter-node, all-reduces on the collective link,
  with the cluster's overlap slowdown; steady-state iterations (GroPipe
  delay 1, async) are read between consecutive optimizer steps;
* memory: the simulator's per-rank walk of the schedule (weights, gradients,
  optimizer state, in-flight activations, stashed versions);
* tensor parallelism: the 2D / 1D closed forms of :mod:`.tensor_costs` for
  communication and memory, with the profile's compute split over the grid.

On a node whose ranks time-share fewer cores than there are ranks
(``local``), compute is stretched by processor sharing. Simulated pipelines
and data parallelism share the cores inside the simulator
(:mod:`~workbench.scheduling.sharing`): a rank is slowed by the threads of
its node runnable while it computes (compute, all-reduces, sends), so a
pipeline's bubble relieves its neighbours and a gradient all-reduce takes
cores from the backward beside it. Closed forms (tensor parallelism, the
projection) stretch every compute time by ranks / cores, all ranks busy.
Other work already crowding the cores (``background_load``) lowers both.
``project`` is the cheap closed form (AMPA's ``(m + S - 1) x bottleneck``
plus the exposed all-reduce) the search uses to rank many candidates before
simulating the best ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable

from ...core.costs import ClusterSpec, DeviceSpec, ModelCosts
from ...core.partition import Partition
from ...core.plan import GroPipe, NoPipeline, ParallelPlan
from ...core.timeline import Timeline
from ...core.topology import Topology
from ...scheduling.registry import schedule_for, stage_memory
from ...scheduling.sharing import CoreSharing
from ...scheduling.simulate import SimResult, simulate
from ...scheduling.stagecosts import StageCosts
from ..partitioning.ampa import PartitionResult, Projection, _allreduce_exposed, solve
from .clusters import collective_wait_fraction, core_sharing, shared_cores, time_sharing_slowdown
from .compute_scaling import ComputeModel, runtime_family, scale_compute
from .tensor_costs import TransformerShape, estimate_step, simulate_step, step_flops

__all__ = ["Estimate", "estimate", "project", "simulate_strategy", "CostContext", "cost_context", "DDP_BUCKET_BYTES"]

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket size
GIB = 2**30


@dataclass
class CostContext:
    """The inputs every estimate of one search shares, with AMPA results cached across strategies."""

    costs: ModelCosts
    cluster: ClusterSpec
    global_batch: int
    memory_cap_bytes: int | None = None
    shape: TransformerShape | None = None
    optimizer: str = "adam"
    world_size: int | None = None
    background_load: float = 0.0
    # the runtime families' compute against the profile (compute_scaling.compute_models); empty: as profiled
    compute_models: dict[str, ComputeModel] = field(default_factory=dict)
    _partitions: dict[tuple, PartitionResult | ValueError] = field(default_factory=dict, repr=False)
    _projections: dict[tuple, Projection] = field(default_factory=dict, repr=False)
    _scaled: dict[tuple[bool, float, int], ModelCosts] = field(default_factory=dict, repr=False)

    @property
    def cap(self) -> int | None:
        return self.memory_cap_bytes if self.memory_cap_bytes is not None else self.cluster.device.memory_bytes

    def compute_scale(self, ranks: int) -> float:
        """How much slower compute runs when ``ranks`` processes share the node's cores with other work."""
        cores = shared_cores(self.cluster)
        on_node = min(ranks, self.cluster.devices_per_node)
        return time_sharing_slowdown(on_node, cores, self.background_load) if cores else 1.0

    def sharing(self) -> CoreSharing | None:
        """The cores the ranks of a node time-share, for the simulator (None: a device per rank)."""
        return core_sharing(self.cluster, self.background_load)

    def calibration_factor(self, plan: ParallelPlan | None, microbatch: int) -> float:
        """How much longer ``plan``'s runtime computes a micro-batch than the profile predicts
        (its own runtime family's model; else the scheduled runtimes'; else any calibrated family's)."""
        if not self.compute_models:
            return 1.0
        family = runtime_family(plan) if plan is not None else None
        model = (self.compute_models.get(family) or self.compute_models.get("scheduled")
                 or next(iter(self.compute_models.values())))
        return model.factor(microbatch)

    def model_costs(self, recompute: bool, plan: ParallelPlan | None = None, microbatch: int = 1) -> ModelCosts:
        """The profile for ``plan`` at micro-batches of ``microbatch``: a profile with a batch fit taken at that
        size (:meth:`~workbench.core.costs.ModelCosts.at_batch`: every layer's fitted time for ``microbatch``
        samples), scaled by its runtime family's calibration (which multiplies the fitted time: a calibration's
        ``k + c / b`` is what the runtime adds beyond the profile at that size), and with recomputation folded in
        (backward re-runs the forward).

        For partitioning, a recomputed layer keeps only its output (an upper
        bound of the stage input the runtime keeps).
        """
        k = self.calibration_factor(plan, microbatch)
        fitted = self.costs.batch_fit is not None
        key = (recompute, k, microbatch if fitted else 0)
        if key not in self._scaled:  # a fitted profile is charged at the plan's micro-batch: its fit's times there
            costs = scale_compute(self.costs.at_batch(microbatch) if fitted else self.costs, k)
            self._scaled[key] = replace(costs, layers=tuple(
                replace(l, backward_ms=l.backward_ms + l.forward_ms, saved_bytes=l.activation_bytes)
                for l in costs.layers)) if recompute else costs
        return self._scaled[key]

    def projection(self, strategy: ParallelPlan) -> Projection:
        """AMPA's per-layer prefix sums for the strategy's stages, micro-batches and schedule (cached)."""
        key = self._partition_key(strategy)
        return self._projections[key] if key in self._projections else self._project(strategy)

    def _partition_key(self, strategy: ParallelPlan) -> tuple:
        """What AMPA's result depends on: stages, micro-batches, the memory schedule, replicas, recomputation,
        and the compute calibration the strategy's runtime family has at its micro-batch."""
        memory = stage_memory(strategy)
        microbatch = max(1, self.global_batch // strategy.dp // strategy.microbatches)
        return (strategy.pp * strategy.chunks, strategy.microbatches, memory, strategy.dp, strategy.recompute,
                self.calibration_factor(strategy, microbatch))

    def _project(self, strategy: ParallelPlan) -> Projection:
        stages, m, memory, _, _, _ = key = self._partition_key(strategy)
        # interleaved: virtual stage k runs on rank k mod p, so the chain of stages wraps around the same devices
        cluster = replace(self.cluster, devices_per_node=self.cluster.devices_per_node * strategy.chunks)
        microbatch = max(1, self.global_batch // strategy.dp // m)
        proj = Projection(self.model_costs(strategy.recompute, strategy, microbatch), stages, num_microbatches=m,
                          schedule=memory,
                          batch_size=self.global_batch // strategy.dp, cluster=cluster, optimizer=self.optimizer)
        self._projections[key] = proj
        return proj

    def partition(self, strategy: ParallelPlan) -> PartitionResult:
        """AMPA for the strategy's stages and micro-batches (cached; raises the memory failure)."""
        key = self._partition_key(strategy)
        if key not in self._partitions:
            try:
                self._partitions[key] = solve(self.projection(strategy), self.cap)
            except ValueError as exc:
                self._partitions[key] = exc
        found = self._partitions[key]
        if isinstance(found, ValueError):
            raise ValueError(str(found))
        return found


def cost_context(costs: ModelCosts, cluster: ClusterSpec, global_batch: int, *, world_size: int,
                 memory_cap_bytes: int | None = None,
                 shape: TransformerShape | None = None, optimizer: str = "adam", background_load: float = 0.0,
                 compute_models: dict[str, ComputeModel] | None = None) -> CostContext:
    """The context one search (or one calibration) estimates in: on a node whose ranks share its cores, a
    collective step waits for a core only as far as the cores are oversubscribed, so its call cost is scaled
    by :func:`~.clusters.collective_wait_fraction` for ``world_size`` ranks."""
    cores = shared_cores(cluster)
    if cores and cluster.collective_call_ms:
        wait = collective_wait_fraction(min(world_size, cluster.devices_per_node), cores, background_load)
        cluster = replace(cluster, collective_call_ms=cluster.collective_call_ms * wait)
    return CostContext(costs, cluster, global_batch, memory_cap_bytes,
                       shape.with_batch(global_batch) if shape else None, optimizer, world_size, background_load,
                       dict(compute_models or {}))


@dataclass(frozen=True)
class Estimate:
    """One strategy's predicted iteration and memory, with the breakdown of the busiest rank.

    ``compute_ms + bubble_ms + exposed_comm_ms == iteration_ms``; ``method``
    says how it was costed: ``"simulated"`` (the timed schedule), ``"projected"``
    (the closed form of a pipeline), ``"closed form"`` (data or tensor
    parallelism, no schedule to simulate) or ``"per-layer DP"`` (a per-layer plan).
    """

    strategy: ParallelPlan
    iteration_ms: float
    throughput: float
    memory_bytes: int
    compute_ms: float
    bubble_ms: float
    exposed_comm_ms: float
    method: str
    partition: Partition | None = None
    sim: SimResult | None = field(default=None, compare=False, repr=False)
    timeline: Timeline | None = field(default=None, compare=False, repr=False)
    detail: dict[str, Any] = field(default_factory=dict, compare=False)
    make_timeline: Callable[[], Timeline] | None = field(default=None, compare=False, repr=False)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.strategy.name, "iteration_ms": self.iteration_ms, "throughput": self.throughput,
                "memory_gib": self.memory_gib, "compute_ms": self.compute_ms, "bubble_ms": self.bubble_ms,
                "exposed_comm_ms": self.exposed_comm_ms, "method": self.method,
                "partition": str(self.partition) if self.partition else None, **self.detail}


def _stage_costs(ctx: CostContext, strategy: ParallelPlan, partition: Partition, microbatch: int) -> StageCosts:
    costs = ctx.model_costs(strategy.recompute, strategy, microbatch)
    sc = StageCosts.from_model(costs, partition, microbatch, device=ctx.cluster.device, optimizer=ctx.optimizer)
    if strategy.recompute:  # a stage keeps only its input per micro-batch in flight
        sc = replace(sc, activation_bytes=(int(ctx.costs.input_bytes * microbatch / ctx.costs.batch_size),
                                           *sc.send_bytes[:-1]))
    return _gradient_passes(ctx, strategy, sc)  # solo times: the simulator shares the cores (CostContext.sharing)


def _gradient_passes(ctx: CostContext, strategy: ParallelPlan, sc: StageCosts) -> StageCosts:
    """The passes over each stage's gradients that the pipeline runtimes make beyond the profile (which times a
    backward into fresh gradients), each a read or a write of them at the device's memory bandwidth:

    * accumulating: a micro-batch's weight gradients are added to the ones already there (read both, write one),
      for every micro-batch after the first of an iteration, and for every one under GroPipe, whose gradients
      accumulate in a zeroed flat buffer;
    * GroPipe's step also divides the all-reduced buffer by the groups (a read and a write) and zeroes it for
      the next iteration (a write), passes the optimizer's own traffic does not hold.
    """
    bandwidth = ctx.cluster.device.memory_bandwidth_gbs
    buffer = strategy.gradient_buffer
    if not bandwidth or not buffer:
        return sc
    pass_ms = [g / (bandwidth * 1e9) * 1e3 for g in sc.grad_bytes]
    m = strategy.microbatches
    accumulating = 1.0 if buffer == "flat" else (m - 1) / m  # of the micro-batches, on average
    add = [3 * accumulating * t for t in pass_ms]
    sc = replace(sc, backward_ms=tuple(b + a for b, a in zip(sc.backward_ms, add)),
                 weight_grad_ms=tuple(w + a for w, a in zip(sc.weight_grad_ms, add)))
    if buffer == "flat":
        passes = 3 if strategy.dp > 1 else 1
        sc = replace(sc, step_ms=tuple(s + passes * t for s, t in zip(sc.step_ms, pass_ms)))
    return sc


def _schedule(plan: ParallelPlan, num_buckets: int = 1, stage_costs: StageCosts | None = None,
              cluster: ClusterSpec | None = None):
    """The runtime's schedule for ``plan`` (``zb-auto`` built from ``stage_costs`` and the ``cluster``'s links)
    and the iterations it is simulated over: three for a delayed
    all-reduce; for the asynchronous pipeline four, or as many as its fill and drain take and two more
    (a pipeline of S stages with m micro-batches a step fills over ceil(S / m) steps), so the steady state
    lies between optimizer steps."""
    fill = -(-plan.pp * plan.chunks // plan.microbatches)
    iterations = 3 if plan.delayed_update else (max(4, 2 * fill + 2) if plan.iterates_across_steps else 1)
    return schedule_for(plan, num_iterations=iterations, num_buckets=num_buckets, stage_costs=stage_costs,
                        cluster=cluster), iterations


def _steady_iteration_ms(sim: SimResult, iterations: int) -> float:
    """One iteration: the makespan, or (several iterations) the time between the last optimizer steps."""
    if iterations == 1:
        return sim.metrics["makespan_ms"]
    steps = sim.step_ends()
    done = sorted({it for _, it in steps})
    first, last = (done[1], done[-1]) if len(done) > 2 else (done[0], done[-1])
    if len(done) > 4:  # a long fill and drain: the steps in between
        first, last = done[len(done) // 4], done[-1 - len(done) // 4]
    ranks = {r for r, _ in steps}
    return max((steps[(r, last)] - steps[(r, first)]) / (last - first) for r in ranks
               if (r, last) in steps and (r, first) in steps)


def _breakdown(sim: SimResult, iteration_ms: float, iterations: int) -> tuple[float, float, float]:
    busy = sim.work_ms()
    r = max(range(len(busy)), key=busy.__getitem__)
    compute = min(busy[r] / iterations, iteration_ms)
    exposed = min(sim.metrics["exposed_comm_ms"][r] / iterations, iteration_ms - compute)
    return compute, max(0.0, iteration_ms - compute - exposed), exposed


def _replica_allreduce_ms(ctx: CostContext, grad_bytes: float, strategy: ParallelPlan) -> float:
    """Gradient all-reduce across the strategy's replicas (ranks r, r + unit, r + 2 unit, ...)."""
    if strategy.dp == 1 or grad_bytes <= 0:
        return 0.0
    link = ctx.cluster.allreduce_link(strategy.mesh.group_of(0, "dp"))
    return link.allreduce_ms(grad_bytes, strategy.dp) + ctx.cluster.allreduce_call_ms(strategy.dp)


def _finish(ctx: CostContext, strategy: ParallelPlan, iteration_ms: float, memory: int, compute: float, bubble: float,
            exposed: float, method: str, **extra: Any) -> Estimate:
    cap = ctx.cap
    if cap is not None and memory > cap:
        raise ValueError(f"{strategy.name} needs {memory / GIB:.3f} GiB per device, {(memory - cap) / GIB:.3f} GiB "
                         f"over the cap of {cap / GIB:.3f} GiB")
    return Estimate(strategy, iteration_ms, ctx.global_batch / (iteration_ms / 1e3), memory, compute, bubble, exposed,
                    method, **extra)


def _estimate_tensor(ctx: CostContext, strategy: ParallelPlan) -> Estimate:
    shape = ctx.shape
    if shape is None:
        raise ValueError(f"{strategy.name}: tensor parallelism needs the transformer's shape (heads, hidden, ...); "
                         f"pass shape=TransformerShape(...) or profile a GPT-2/BERT model")
    batch = ctx.global_batch // strategy.dp
    mode, degree = (strategy.tp_kind, strategy.q if strategy.tp_kind == "2d" else strategy.tp)
    if strategy.recompute:
        raise ValueError(f"{strategy.name}: the tensor-parallel runtime does not recompute activations")
    costs = ctx.model_costs(False, strategy, batch)
    scale = batch / costs.batch_size * ctx.compute_scale(strategy.world_size)
    compute_ms = sum(l.forward_ms + l.backward_ms for l in costs.layers) * scale / strategy.tp
    grid = list(range(strategy.tp))
    link = ctx.cluster.group_link(grid)
    sized = shape.with_batch(batch)
    # a device exactly as fast as the profile: the closed form's FLOPs take the profiled time
    tflops = step_flops(sized) / strategy.tp / (compute_ms * 1e-3) / 1e12
    device = DeviceSpec(f"{ctx.cluster.device.name}-profiled", {shape.dtype: tflops}, ctx.cluster.device.memory_bytes,
                        ctx.cluster.device.memory_bandwidth_gbs, efficiency=1.0)
    call_ms = ctx.cluster.collective_call_ms
    step = estimate_step(sized, mode, degree, device, link, call_ms=call_ms)
    grad_sync = _replica_allreduce_ms(ctx, step["param_bytes"], strategy)
    iteration = step["step_ms"] + grad_sync
    memory = step["memory_bytes"]
    return _finish(ctx, strategy, iteration, int(memory), compute_ms, 0.0, iteration - compute_ms, "closed form",
                   make_timeline=partial(simulate_step, sized, mode, degree, device, link, call_ms=call_ms),
                   detail={"collective_calls": step["collective_calls"], "comm_bytes": step["comm_bytes"],
                           "step_comm_ms": step["step_ms"] - compute_ms, "grad_sync_ms": grad_sync})


def estimate(ctx: CostContext, strategy: ParallelPlan) -> Estimate:
    """Simulate ``strategy`` (see the module docstring); ValueError when it cannot run or does not fit."""
    if strategy.tp > 1:
        return _estimate_tensor(ctx, strategy)
    microbatch = ctx.global_batch // strategy.dp // strategy.microbatches
    if isinstance(strategy.pipeline, NoPipeline):
        partition = Partition.from_cuts([], ctx.costs.num_layers)
        grads = ctx.costs.total("grad_bytes")
        buckets = max(1, min(ctx.costs.num_layers, math.ceil(grads / DDP_BUCKET_BYTES)))
        return simulate_strategy(ctx, strategy, partition, _stage_costs(ctx, strategy, partition, microbatch),
                                 num_buckets=buckets)
    partition = ctx.partition(strategy).partition
    return simulate_strategy(ctx, strategy, partition, _stage_costs(ctx, strategy, partition, microbatch))


def replica_block(cluster: ClusterSpec, strategy: ParallelPlan) -> int | None:
    """How many of ``strategy``'s replicas a simulation needs to time all of them: the fewest (two at least) that
    fill whole nodes, when the other replicas are that block again, shifted by whole nodes, on the same links;
    None when every replica must be simulated (one replica, a block as large as the plan, or links that differ
    from block to block, as across the pods of a pod cluster).

    Every replica runs the same program on the same costs, so the block's ranks keep the times of the whole
    plan's; its all-reduces are timed over their whole groups (``reduce_groups`` of the simulator)."""
    stages, dp = strategy.pp, strategy.dp
    block = max(2, math.lcm(stages, cluster.devices_per_node) // stages)
    if strategy.tp > 1 or block >= dp or dp % block:
        return None
    span = block * stages
    pairs = [(g * stages + s, g * stages + (s + 1) % stages) for g in range(block) for s in range(stages)
             if stages > 1]
    links = [cluster.link(a, b) for a, b in pairs]
    for shift in range(span, dp * stages, span):
        if any(cluster.link(a + shift, b + shift) != link for (a, b), link in zip(pairs, links)):
            return None
    return block


def _whole_groups(block_schedule, strategy: ParallelPlan) -> tuple[tuple[int, ...], ...] | None:
    """Per stage, the whole all-reduce group the block's group of ``block_schedule`` stands for; None when a
    group is not one rank of each replica laid out replica by replica (then the block is not used)."""
    stride, whole = strategy.pp, []
    for group in block_schedule.meta.dp_groups:
        first = group[0]
        if list(group) != [first + k * stride for k in range(len(group))]:
            return None
        whole.append(tuple(first + k * stride for k in range(strategy.dp)))
    return tuple(whole)


def _placement(ctx: CostContext, strategy: ParallelPlan, sc: StageCosts):
    """The topology-aware placement of a pipeline's (replica, stage) pairs on a multi-node cluster, when its
    link cost beats the node-major order's (:mod:`~workbench.planning.partitioning.placement`; the simulator
    then times both and keeps the faster); None otherwise, or where it does not apply (one node,
    fewer ranks than the cluster's devices, no pipeline, tensor parallelism or interleaved chunks inside the
    pipeline, too many pairs to enumerate). The run config carries it (``RunConfig.placement``), so the
    launched processes take the places the estimate's links assumed."""
    if ctx.cluster.num_nodes < 2 or strategy.world_size != ctx.cluster.world_size \
            or isinstance(strategy.pipeline, NoPipeline) or strategy.tp > 1 or strategy.chunks > 1 \
            or len(sc.send_bytes) != strategy.pp:
        return None
    from ..partitioning.placement import place

    try:
        found = place(sc.send_bytes, ctx.cluster, grad_bytes=sc.grad_bytes if strategy.dp > 1 else None,
                      num_replicas=strategy.dp, num_microbatches=strategy.microbatches, max_assignments=200_000)
    except ValueError:
        return None
    return found if found.rejected else None


def simulate_strategy(ctx: CostContext, strategy: ParallelPlan, partition: Partition, sc: StageCosts,
                      num_buckets: int = 1, **detail: Any) -> Estimate:
    """Simulate ``strategy`` with these stage costs and read off the estimate: every replica, or a block of them
    that stands for all (:func:`replica_block`, where the ranks do not share cores and no placement is tried)."""
    # a kind built from the stages' costs (zb-auto) is built from the ones it is simulated with
    uses_costs = not isinstance(strategy.pipeline, NoPipeline) and strategy.pipeline.uses_costs
    microbatch = ctx.global_batch // strategy.dp // strategy.microbatches

    def run(schedule_, groups=None) -> SimResult:
        return simulate(schedule_, sc, ctx.cluster, microbatch_size=microbatch, sharing=ctx.sharing(),
                        reduce_groups=groups)

    placement = _placement(ctx, strategy, sc)
    block = replica_block(ctx.cluster, strategy) if placement is None and ctx.sharing() is None else None
    if block is not None:
        schedule, iterations = _schedule(strategy.replace(mesh=Topology({**dict(strategy.mesh.axes), "dp": block})), num_buckets,
                                         stage_costs=sc if uses_costs else None, cluster=ctx.cluster)
        groups = _whole_groups(schedule, strategy)
        if groups is not None:
            sim = run(schedule, groups)
            detail = {**detail, "simulated_replicas": block}
            return _simulated(ctx, strategy, partition, sim, _steady_iteration_ms(sim, iterations), iterations,
                              detail)
    schedule, iterations = _schedule(strategy, num_buckets, stage_costs=sc if uses_costs else None,
                                     cluster=ctx.cluster)
    sim = run(schedule)
    iteration = _steady_iteration_ms(sim, iterations)
    if placement is not None:  # the links' cost model prefers another placement: keep it if the simulator agrees
        from ..partitioning.placement import placed_schedule

        placed = run(placed_schedule(schedule, placement.device_of, ctx.cluster))
        placed_iteration = _steady_iteration_ms(placed, iterations)
        if placed_iteration < iteration:
            detail = {**detail, "placement": list(placement.device_of),
                      "placement_saves_ms": round(iteration - placed_iteration, 3)}
            sim, iteration = placed, placed_iteration
    return _simulated(ctx, strategy, partition, sim, iteration, iterations, detail)


def _simulated(ctx: CostContext, strategy: ParallelPlan, partition: Partition, sim: SimResult, iteration: float,
               iterations: int, detail: dict) -> Estimate:
    compute, bubble, exposed = _breakdown(sim, iteration, iterations)
    memory = max(sim.metrics["peak_memory_bytes"])
    return _finish(ctx, strategy, iteration, int(memory), compute, bubble, exposed, "simulated", partition=partition,
                   sim=sim, make_timeline=lambda: sim.timeline, detail=detail)


def project(ctx: CostContext, strategy: ParallelPlan) -> Estimate:
    """The closed form: AMPA's ``(m + S - 1) x bottleneck`` plus the exposed gradient all-reduce.

    Data and tensor parallel strategies are cheap to estimate exactly, so
    they are simulated / computed here too.
    """
    if isinstance(strategy.pipeline, NoPipeline):
        return estimate(ctx, strategy)
    result = ctx.partition(strategy)
    k = ctx.compute_scale(strategy.world_size)
    stage_time = [c * k + t for c, t in zip(result.stage_compute_ms, result.stage_comm_ms)]
    bottleneck = max(stage_time)
    S, m = strategy.pp * strategy.chunks, strategy.microbatches
    fill = (S - 1) / strategy.chunks
    iteration = m * bottleneck if strategy.iterates_across_steps else (m + fill) * bottleneck
    if strategy.split_backward:  # the kind's own bubble at the bottleneck's backward / forward ratio
        k_stage = result.stage_cost_ms.index(result.bottleneck_ms)
        forward, backward = result.stage_forward_ms[k_stage], result.stage_backward_ms[k_stage]
        stated = strategy.pipeline.uniform_bubble(strategy.pp, m, backward / forward if forward > 0 else 2.0)
        if stated is not None:  # a rank runs its chunks' work for each micro-batch
            iteration = m * strategy.chunks * bottleneck / (1.0 - stated[0])
    exposed = 0.0
    if isinstance(strategy.pipeline, GroPipe):
        scaled = replace(result, projected_iteration_ms=iteration)
        exposed = _allreduce_exposed(ctx.projection(strategy), scaled, ctx.cluster, strategy.dp,
                                     strategy.pipeline.delay)
    compute = m * result.stage_compute_ms[result.stage_cost_ms.index(result.bottleneck_ms)] * k
    total = iteration + exposed
    static = max(result.stage_memory_bytes)
    return _finish(ctx, strategy, total, static, min(compute, iteration), max(0.0, iteration - compute), exposed,
                   "projected", partition=result.partition)
