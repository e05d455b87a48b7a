"""Golden predicted iteration times: every plan the search ranks for a few fixed cost models and clusters.

``python tests/planning/golden_plans.py OUT.json`` writes them; the test
compares today's search with the recorded values, so a change to how plans
are represented cannot change a prediction unnoticed. The cost models are
synthetic (no profiling), so the values do not depend on the machine.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from workbench.core.costs import ModelCosts
from workbench.planning import Budget, SearchOptions, Workload, plan
from workbench.planning.costs.tensor_costs import TransformerShape


def _uneven() -> ModelCosts:
    """A VGG-like chain: cheap big-activation convolutions, then heavy fully connected layers."""
    base = ModelCosts.uniform(10, forward_ms=1.0, backward_ms=2.0, param_bytes=1_000_000, activation_bytes=4_000_000,
                              batch_size=8)
    layers = tuple(replace(l, name=f"l{i}", forward_ms=0.5 + 0.3 * i, backward_ms=1.0 + 0.6 * i,
                           param_bytes=(200_000 if i < 7 else 40_000_000), activation_bytes=4_000_000 // (i + 1),
                           grad_bytes=(200_000 if i < 7 else 40_000_000))
                   for i, l in enumerate(base.layers))
    return replace(base, model="uneven", layers=layers)


CASES = {
    "uniform16-local4": dict(model=lambda: ModelCosts.uniform(16, forward_ms=1.0, backward_ms=2.0,
                                                              param_bytes=20_000_000, activation_bytes=2_000_000,
                                                              batch_size=8),
                             cluster="local", global_batch=32, world_size=4),
    "uneven-v100x8": dict(model=_uneven, cluster="8xV100-PCIe", global_batch=64, world_size=8),
    "uneven-local4": dict(model=_uneven, cluster="local", global_batch=32, world_size=4),
    "transformer-local4": dict(model=lambda: ModelCosts.uniform(6, forward_ms=2.0, backward_ms=4.0,
                                                                param_bytes=4_000_000, activation_bytes=1_000_000,
                                                                batch_size=8),
                               cluster="local", global_batch=16, world_size=4,
                               shape=TransformerShape(hidden=256, heads=4, layers=6, vocab=1000, positions=64, batch=16, seq=64)),
}


def golden() -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for case, args in CASES.items():
        workload = Workload(args["model"](), args["global_batch"], shape=args.get("shape"))
        result = plan(workload, args["cluster"], Budget(world_size=args["world_size"]),
                      SearchOptions(simulate_top=10_000))
        out[case] = {p.name: {"iteration_ms": round(p.estimate.iteration_ms, 9),
                              "memory_bytes": int(p.estimate.memory_bytes), "method": p.estimate.method,
                              "partition": str(p.estimate.partition) if p.estimate.partition else None}
                     for p in result.plans}
    return out


if __name__ == "__main__":
    data = golden()
    with open(sys.argv[1], "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    print({k: len(v) for k, v in data.items()})
