"""The hybrid strategy space: every way to spread one model over N devices.

A strategy fixes the parallel degrees and the options the runtimes support:
data parallelism (``dp``), GroPipe (``groups x stages`` pipelines with a
per-stage gradient all-reduce across the groups, delay 0 or 1), plain
pipelines and the asynchronous pipeline (with data parallel replicas), and
2D (``q x q``) or 1D tensor parallelism with data parallelism outside. Each
strategy is a uniform :class:`~workbench.core.plan.ParallelPlan` (every
layer with the same options) whose short stable name is used in tables,
configs and the CLI::

    dp8                       8-way data parallel
    gropipe-2x4-1f1b-m8-d1    2 groups x 4 stages, 1F1B, 8 micro-batches, delay 1
    pp4-gpipe-m16             one 4-stage GPipe pipeline, 16 micro-batches
    async-2x4-m8              2 replicas of a 4-stage async pipeline, 8 micro-batches in flight
    tp2d-2x2-dp2              2 data-parallel copies of a 2x2 tensor grid
    tp1d-4-dp2                2 copies of 4-way Megatron tensor parallelism
    (+ "-rc" when activations are recomputed)

:func:`enumerate_strategies` lists the valid points for a world size and a
model shape; invalid combinations are not generated (and
:func:`check_plan` explains why a hand-made one cannot run a model).
Tensor parallelism follows the runtime's rule
(:mod:`workbench.core.tensor_support`): the uniform ``tp1d-*`` and ``tp2d-*``
plans shard a GPT-2 whole, so they are offered only for a model with a
transformer shape (the planner's ``Workload.shape``, which the CLI gives GPT-2
models only), and :func:`runtime_refusal` says why the runtime would refuse a
plan's tensor parallelism for a model.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ...core.fields import check_int
from ...core.plan import PIPELINE_KINDS, PLAN_FAMILIES, LayerPlan, NoPipeline, \
    ParallelPlan
from ...core.tensor_support import UNIFORM_TP_NEEDS, runs_uniform_tp
from ...core.topology import Topology

__all__ = ["enumerate_strategies", "check_plan", "factorizations", "runtime_refusal", "tensor_parallel_note",
           "STRATEGY_KINDS", "TP_FAMILIES"]

STRATEGY_KINDS = tuple(f for f in PLAN_FAMILIES if f != "torch")  # the families the planner searches
TP_FAMILIES = ("tp2d", "tp1d")  # the uniform tensor-parallel families, which shard a GPT-2 whole


def runtime_refusal(plan: ParallelPlan, *, model: str, shaped: bool, tp_limits: Sequence[int] | None = None) -> str:
    """Why the runtime would refuse ``plan``'s tensor parallelism for ``model`` ("" if it would not), by the rule of
    :mod:`workbench.core.tensor_support`: a plan that runs on a uniform tensor-parallel strategy needs a GPT-2
    (``shaped``: the model has a transformer shape); one that runs layer by layer may split no layer further
    than its entry in ``tp_limits`` (the runtime's largest degree per layer; None: not known, not checked)."""
    if plan.tp_kind == "none":
        return ""
    if runs_uniform_tp(plan):
        return "" if shaped else f"{UNIFORM_TP_NEEDS}; {model} has no GPT-2 shape the runtime can split"
    if tp_limits is None or len(plan.layers) not in (1, len(tp_limits)):
        return ""
    layers = plan.layers_for(len(tp_limits))
    for i, (layer, limit) in enumerate(zip(layers, tp_limits)):
        if layer.tp_degree > limit:
            most = "does not split it" if limit == 1 else f"splits it at most {limit} ways"
            return f"layer {i} is split {layer.tp_degree} ways; the runtime {most}"
    return ""


def tensor_parallel_note(model: str, reasons: Sequence[str] = ()) -> str:
    """The planner's one note on the plans it leaves out by the runtime's rule: the uniform tensor-parallel ones
    (no ``reasons``, or one of theirs among them), else per-layer plans (``reasons``: :func:`runtime_refusal`'s)."""
    if not reasons or any(UNIFORM_TP_NEEDS in r for r in reasons):
        return (f"tensor-parallel plans (tp1d-*, tp2d-*) skipped: {model} has no GPT-2 shape the runtime can split "
                f"({UNIFORM_TP_NEEDS}; per-layer plans still split single layers the runtime has rules for)")
    return f"per-layer plans that split a layer of {model} further than the runtime does skipped (e.g. {reasons[0]})"


def check_plan(plan: ParallelPlan, *, num_layers: int, global_batch: int, num_heads: int | None = None,
               hidden: int | None = None) -> None:
    """Raise ValueError saying why ``plan`` cannot run this model at this batch."""
    name = plan.name
    if plan.num_virtual_stages > num_layers:
        raise ValueError(f"{name}: {plan.num_virtual_stages} stages for {num_layers} layers "
                         f"(at most {num_layers} stages)")
    per_replica, rem = divmod(global_batch, plan.dp)
    if rem:
        raise ValueError(f"{name}: global batch {global_batch} does not split over {plan.dp} replicas")
    if per_replica % plan.microbatches:
        raise ValueError(f"{name}: {plan.microbatches} micro-batches do not divide the per-replica batch {per_replica}")
    if plan.tp > 1:
        if any(layer.recompute for layer in plan.layers):
            raise ValueError(f"{name}: the tensor-parallel runtime does not recompute activations (recomputation "
                             f"is offered for data parallelism and pipelines)")
        if num_heads is None or hidden is None:
            refusal = runtime_refusal(plan, model="this model", shaped=False)
            raise ValueError(f"{name}: " + (refusal or "the planner costs tensor parallelism from a transformer "
                                            "shape (heads and hidden size), which this model lacks; the per-layer "
                                            "search (fine_grained) splits single layers"))
        split = plan.q if plan.tp_kind == "2d" else plan.tp
        if num_heads % split or hidden % split:
            raise ValueError(f"{name}: {num_heads} heads / hidden {hidden} are not divisible by {split}")
        if plan.tp_kind == "2d" and per_replica % plan.q:
            raise ValueError(f"{name}: per-grid batch {per_replica} is not divisible by q={plan.q}")


def _pipeline_plans(mesh: dict[str, int], microbatches: int, recompute: bool, families: tuple[str, ...],
                    num_layers: int) -> list[ParallelPlan]:
    """Every registered pipeline kind's search variants at this shape (``PipelineSpec.search_variants``), in
    the registry's order, that the model has layers for and whose family is asked for."""
    out = []
    for cls in PIPELINE_KINDS.values():
        if cls.family not in families:
            continue
        for spec in cls.search_variants(stages=mesh["pp"], microbatches=microbatches, replicas=mesh["dp"]):
            if mesh["pp"] * spec.chunks > num_layers:
                continue
            try:
                out.append(_plan(mesh, spec, microbatches, recompute))
            except ValueError:  # a shape this kind refuses (micro-batch multiples and the like)
                continue
    return out


def _plan(mesh: dict[str, int], pipeline=None, microbatches: int = 1, recompute: bool = False,
          tp: tuple[str, int] = ("none", 1)) -> ParallelPlan:
    layer = LayerPlan(tp=tp[0], tp_degree=tp[1], recompute=recompute)
    return ParallelPlan(Topology(tuple(mesh.items())), pipeline or NoPipeline(), microbatches, layers=(layer,))


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """All ordered ``parts``-tuples of positive ints whose product is ``n``."""
    check_int("world size", n, 1)
    if parts == 1:
        return [(n,)]
    out = []
    for d in range(1, n + 1):
        if n % d == 0:
            out.extend((d, *rest) for rest in factorizations(n // d, parts - 1))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_strategies(
    world_size: int,
    *,
    num_layers: int,
    global_batch: int,
    num_heads: int | None = None,
    hidden: int | None = None,
    kinds: Iterable[str] = STRATEGY_KINDS,
    microbatch_options: Iterable[int] | None = None,
    recompute_options: Iterable[bool] = (False,),
    max_microbatches: int = 64,
) -> list[ParallelPlan]:
    """Every valid uniform plan for this world size and model shape.

    ``kinds`` picks families (:data:`STRATEGY_KINDS`: ``dp``, ``pipeline``,
    GroPipe, ``async``, ``tp2d``, ``tp1d``). Micro-batch counts default to
    the powers of two (and the stage count) that divide the per-replica
    batch, up to ``max_microbatches``.
    """
    check_int("world size", world_size, 1)
    kinds = tuple(kinds)
    unknown = set(kinds) - set(STRATEGY_KINDS)
    if unknown:
        raise ValueError(f"unknown strategy kinds {sorted(unknown)}; valid: {STRATEGY_KINDS}")
    candidates: list[ParallelPlan] = []

    def mb_options(per_replica: int, stages: int) -> list[int]:
        if microbatch_options is not None:
            opts = sorted(set(microbatch_options))
        else:
            opts = sorted({2**k for k in range(0, 7)} | {stages, 2 * stages, 4 * stages})
        return [m for m in opts if m <= max_microbatches and per_replica % m == 0 and m >= 1]

    for rc in recompute_options:
        for dp, pp in factorizations(world_size, 2):
            if global_batch % dp:
                continue
            per_replica = global_batch // dp
            if pp == 1:
                if "dp" in kinds:
                    candidates.append(_plan({"dp": dp}, recompute=rc))
                continue
            if pp > num_layers:
                continue
            mesh = {"dp": dp, "pp": pp}
            for m in mb_options(per_replica, pp):
                candidates += _pipeline_plans(mesh, m, rc, kinds, num_layers)
        if num_heads is not None and hidden is not None and not rc:  # the tensor runtime does not recompute
            for dp, tp in factorizations(world_size, 2):
                if tp == 1 or global_batch % dp:
                    continue
                q = int(round(tp**0.5))
                if "tp2d" in kinds and q * q == tp:
                    candidates.append(_plan({"dp": dp, "tp_row": q, "tp_col": q}, tp=("2d", tp)))
                if "tp1d" in kinds:
                    candidates.append(_plan({"dp": dp, "tp": tp}, tp=("1d", tp)))

    valid = []
    for plan in candidates:
        try:
            check_plan(plan, num_layers=num_layers, global_batch=global_batch, num_heads=num_heads, hidden=hidden)
        except ValueError:
            continue
        valid.append(plan)
    if not valid:
        raise ValueError(
            f"no valid strategy for world size {world_size}, {num_layers} layers and global batch {global_batch}: "
            f"the batch must split over the replicas (divisors of {world_size}: {_divisors(world_size)})"
        )
    return valid
