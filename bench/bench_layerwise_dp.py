"""Which dynamic programme the per-layer search should use: Pareto frontier or Galvatron's memory buckets.

The case: a 48-layer GPT-like stage (alternating heavier and lighter blocks,
an embedding and a head) on 8 devices straddling two nodes, with the 22
strategies of a stage of 8 (Galvatron's 11 trees, each with and without
recomputation), under a budget halfway between the least and the most memory
an assignment can use, so the optimum mixes strategies. Both solvers get the
same precomputed options and transition table, so only the search is timed:
the exact Pareto frontier (:func:`~workbench.planning.layerwise.stage_search.pareto_dp`),
the bucket table at Galvatron's 1 MiB and at 512 coarse buckets
(:func:`~workbench.planning.layerwise.stage_search.bucket_dp`), and the frontier bounded by
the time of a coarse bucket answer (what ``search_stage`` runs). Prints median wall-clock
times and how far each bucket answer is above the exact optimum, and writes
``bench/results/layerwise_dp.json``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from workbench.core.costs import LayerCost, ModelCosts
from workbench.planning.costs.clusters import get_cluster
from workbench.planning.layerwise.layer_strategies import OTHER, TRANSFORMER, stage_strategies
from workbench.planning.layerwise.stage_search import (BOUND_BUCKETS, StageSpec, bucket_dp, layer_cost, pareto_dp,
                                                       search_stage, transition_ms)

RESULTS = Path(__file__).resolve().parent / "results" / "layerwise_dp.json"
LAYERS = 48


def gpt_like_stage() -> StageSpec:
    """Per-sample profile at batch 1: 46 blocks alternating 1x / 1.5x width, an embedding and a head."""
    layers = [LayerCost("embeddings", 0.2, 0.4, param_bytes=160 * 2**20, activation_bytes=8 * 2**20,
                        saved_bytes=8 * 2**20)]
    for i in range(LAYERS - 2):
        w = 1.5 if i % 2 else 1.0
        layers.append(LayerCost(f"block_{i}", 2.0 * w, 4.0 * w, param_bytes=int(48 * 2**20 * w * w),
                                activation_bytes=8 * 2**20, saved_bytes=int(70 * 2**20 * w)))
    layers.append(LayerCost("head", 0.5, 1.0, param_bytes=160 * 2**20, activation_bytes=100 * 2**20,
                            saved_bytes=100 * 2**20))
    costs = ModelCosts("gpt-like", 1, "gpu", tuple(layers), input_bytes=2**16)
    kinds = [OTHER] + [TRANSFORMER] * (LAYERS - 2) + [OTHER]
    return StageSpec(costs, get_cluster("2x8xH100-IB"), devices=8, microbatch_size=8, num_microbatches=8,
                     in_flight=2, first_rank=4, kinds=kinds)


def timed(fn, repeats: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


def main() -> dict:
    spec = gpt_like_stage()
    pool = stage_strategies(8, recompute=(False, True))
    assert len(pool) == 22
    per_layer = [[s for s in pool if s.tp == "none" or s.tp in spec.kind(i).tp_kinds] for i in range(LAYERS)]
    options = [[(c.time_ms, c.memory_bytes, s.layout) for s in ss for c in [layer_cost(spec, i, s)]]
               for i, ss in enumerate(per_layer)]
    table = {(l, a.layout, b.layout): transition_ms(spec, l, a, b)
             for l in range(1, LAYERS) for a in pool for b in pool}
    move = lambda l, a, b: table[(l, a, b)]  # noqa: E731
    least = sum(min(o[1] for o in layer) for layer in options)
    most = sum(max(o[1] for o in layer) for layer in options)
    budget = (least + most) / 2
    exact_s, exact = timed(lambda: pareto_dp(options, move, budget), 3)

    def bounded():
        coarse = bucket_dp(options, move, budget, resolution=BOUND_BUCKETS)
        return pareto_dp(options, move, budget, coarse[0] * (1 + 1e-9) if coarse and coarse[1] <= budget else math.inf)

    bounded_s, bounded_found = timed(bounded, 5)
    assert bounded_found[0] == exact[0]
    mib_s, mib = timed(lambda: bucket_dp(options, move, budget), 1)
    coarse_s, coarse = timed(lambda: bucket_dp(options, move, budget, resolution=512), 3)
    search_s, found = timed(lambda: search_stage(spec, pool, budget), 1)
    distinct = len(set(found.strategies))
    result = {
        "layers": LAYERS, "strategies": len(pool), "budget_mib": budget / 2**20,
        "pareto_s": exact_s, "pareto_bounded_s": bounded_s, "buckets_1mib_s": mib_s, "buckets_512_s": coarse_s,
        "search_stage_s": search_s,
        "buckets_1mib_count": int(budget // 2**20) + 1,
        "pareto_time_ms": exact[0], "buckets_1mib_time_ms": mib[0], "buckets_512_time_ms": coarse[0],
        "distinct_strategies_in_optimum": distinct, "optimum": [s.text for s in found.strategies],
    }
    assert abs(found.time_ms - exact[0]) < 1e-6 * exact[0]
    print(f"{LAYERS} layers x {len(pool)} strategies, budget {budget / 2**30:.2f} GiB "
          f"(least {least / 2**30:.2f}, most {most / 2**30:.2f}); optimum mixes {distinct} strategies")
    print(f"  pareto (exact)        {exact_s * 1e3:9.1f} ms   iteration {exact[0]:.3f} ms")
    print(f"  pareto, bounded by a {BOUND_BUCKETS}-bucket answer {bounded_s * 1e3:6.1f} ms (exact)")
    print(f"  buckets, 1 MiB        {mib_s * 1e3:9.1f} ms   iteration {mib[0]:.3f} ms "
          f"(+{(mib[0] / exact[0] - 1) * 100:.3f}%, {result['buckets_1mib_count']} buckets)")
    print(f"  buckets, 512          {coarse_s * 1e3:9.1f} ms   iteration {coarse[0]:.3f} ms "
          f"(+{(coarse[0] / exact[0] - 1) * 100:.3f}%)")
    print(f"  search_stage (costs + pareto) {search_s * 1e3:.1f} ms")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
