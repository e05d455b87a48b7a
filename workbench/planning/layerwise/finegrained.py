"""Fine-grained choices per layer by dynamic programming under the per-device memory budget.

Problem. A pipeline whose stages do not fit the memory budget need not
recompute every activation: Galvatron's observation is that the best plan
picks, layer by layer, among the options the runtime offers, trading time
for memory, and that this is a knapsack over layers solvable exactly by
dynamic programming.

Approach. :func:`choose_per_layer` takes, per layer, a list of options
``(time_ms, memory_bytes)`` and answers with the per-layer programme of
:mod:`.layer_dp` (:func:`~.layer_dp.bucket_dp`, the same table over
memory buckets the per-layer hybrid search uses): memory is counted in
``resolution`` units of the budget (rounded up, so a chosen plan always
fits). O(L x resolution x options).

:func:`selective_recompute_plans` applies it to the pipelines the search
found too big: for each stage of the time-optimal partition, each layer
either keeps its saved activations for every in-flight micro-batch or
keeps only its output and recomputes its forward in the backward pass. The
result is a per-layer :class:`~workbench.core.plan.ParallelPlan` that marks
exactly the recomputed layers, which the layer-by-layer runtime runs as
planned (the pipeline kinds marked ``per_layer``; GroPipe and the
asynchronous pipeline run one option for all layers, so they get none). A
split backward (the zero-bubble kinds) pays the recomputed forwards before
its input gradient.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from ...scheduling.stagecosts import StageCosts, layer_times_ms
from ..partitioning.ampa import solve
from ..costs.estimate import CostContext, Estimate, _stage_costs, simulate_strategy
from .layer_dp import bucket_dp
from ...core.plan import LayerPlan, NoPipeline, ParallelPlan

__all__ = ["choose_per_layer", "selective_recompute_plans"]

def choose_per_layer(options: Sequence[Sequence[tuple[float, float]]], budget_bytes: float, *,
                     resolution: int = 512) -> tuple[float, list[int]] | None:
    """Least-time choice of one option per layer with total memory <= ``budget_bytes`` (None if none fits):
    the per-layer programme (:func:`~.layer_dp.bucket_dp`, ``resolution`` buckets) with each option its
    own layout and nothing to pay between layers. Of equally fast choices, the last layer's earliest option,
    then the least memory."""
    found = bucket_dp([[(t, m, o) for o, (t, m) in enumerate(layer)] for layer in options], _free, budget_bytes,
                      resolution)
    return None if found is None else (found[0], found[2])


def _free(layer: int, before: int, after: int) -> float:
    """Switching options between layers costs nothing."""
    return 0.0


def _recomputed(base: StageCosts, extra_ms: Sequence[float]) -> dict[str, tuple[float, ...]]:
    """The stages' backward times with each stage's recomputed forwards (``extra_ms``) added: to the fused
    backward, and of a split backward to the input gradient the recomputation precedes, so that a zero-bubble
    schedule pays them too (on the first stage to the weight gradient: nothing waits for its input gradient, so
    :meth:`~workbench.scheduling.stagecosts.StageCosts.from_model` counts its whole split backward as W)."""
    on_input = [x if k else 0.0 for k, x in enumerate(extra_ms)]
    return {"backward_ms": tuple(b + x for b, x in zip(base.backward_ms, extra_ms)),
            "input_grad_ms": tuple(i + x for i, x in zip(base.input_grad_ms, on_input)),
            "weight_grad_ms": tuple(w + x - y for w, x, y in zip(base.weight_grad_ms, extra_ms, on_input))}


def selective_recompute_plans(ctx: CostContext, strategies: Sequence[ParallelPlan],
                              infeasible: list[dict[str, Any]]) -> list[Estimate]:
    """Pipelines listed as not fitting, made to fit by recomputing the fewest layers (one plan per strategy)."""
    cap = ctx.cap
    missing = {i["name"] for i in infeasible}
    out = []
    for strategy in strategies:
        if not strategy.pipeline.per_layer or strategy.name not in missing or cap is None:
            continue  # the layer-by-layer runtime recomputes per layer inside the pipelines marked per_layer
        proj = ctx.projection(strategy)
        result = solve(proj, None)
        microbatch = ctx.global_batch // strategy.dp // strategy.microbatches
        forward, _ = layer_times_ms(ctx.model_costs(False, strategy, microbatch), microbatch,
                                   device=ctx.cluster.device)
        scale = microbatch / ctx.costs.batch_size
        chosen_layers: list[int] = []
        extra_ms, kept_bytes = [], []
        for k, (a, b) in enumerate(result.partition.bounds):
            in_flight_mb = proj.memory.in_flight[k]
            static = proj.pre_static[b + 1] - proj.pre_static[a]
            options = []
            for layer in range(a, b + 1):
                lc = ctx.costs.layers[layer]
                keep = in_flight_mb * (lc.saved_bytes or lc.activation_bytes) * scale
                again = in_flight_mb * lc.activation_bytes * scale
                options.append([(0.0, keep), (forward[layer], again)])
            found = choose_per_layer(options, cap - static)
            if found is None:
                break
            _, picks = found
            recomputed = [a + i for i, o in enumerate(picks) if o == 1]
            chosen_layers += recomputed
            extra_ms.append(sum(forward[l] for l in recomputed))
            kept_bytes.append(int(sum(options[i][o][1] for i, o in enumerate(picks)) / in_flight_mb))
        else:
            base = _stage_costs(ctx, strategy, result.partition, microbatch)  # solo times, like extra_ms
            sc = replace(base, activation_bytes=tuple(kept_bytes), **_recomputed(base, extra_ms))
            # the plan says exactly which layers recompute; the layer-by-layer runtime runs exactly those
            labelled = strategy.with_layers(tuple(LayerPlan(recompute=layer in chosen_layers)
                                                  for layer in range(ctx.costs.num_layers)))
            try:
                out.append(simulate_strategy(ctx, labelled, result.partition, sc, recompute_layers=chosen_layers,
                                             recompute_choice="per layer (dynamic programming)"))
            except ValueError as exc:
                infeasible.append({"name": labelled.name + " (selective)", "reason": str(exc)})
    return out
