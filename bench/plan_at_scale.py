"""The best plan on 1,024 H100s for GPT-2 with 48 layers and for a 70B-class transformer, beside Megatron-LM's shape.

Two models on ``128x8xH100-IB`` (128 DGX H100-like nodes on NDR InfiniBand), each planned with the
per-layer search (``--fine-grained``):

* GPT-2 small with 48 layers, its profile taken here (batch 2, cached) and projected to the H100,
  global batch 1024;
* a 70B-class decoder: 80 layers, hidden 8192, 64 heads, sequence 2048, vocabulary 51200, bf16,
  its costs from its shape (:func:`workbench.planning.costs.analytic.transformer_costs`), global
  batch 2048 (Megatron-LM's 76B run used 1792 on 1,024 GPUs; the per-layer model wants a power of
  two per stage).

Each best plan is printed with its breakdown. The per-layer model then costs the 3D shape
Megatron-LM published for such a model at that scale (Narayanan et al., SC'21, Table 1: the 76.1B
model, 60 layers of hidden 10240, on 1,024 GPUs: tensor parallelism 8 inside a node, pipeline 4
across nodes, data parallelism 32): ``pp4-1f1b-m8-tp1d256`` with every block split 8 ways and
data parallelism around it, and its neighbours with pipeline 8 and 16. Writes
``bench/results/plan_at_scale.json``; bench/RESULTS.md "Planning at scale" discusses it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from workbench.core.hardware import DEVICES
from workbench.planning import Budget, SearchOptions, Workload, plan
from workbench.planning.costs.analytic import transformer_costs
from workbench.planning.costs.clusters import load_cluster
from workbench.planning.costs.tensor_costs import TransformerShape
from workbench.planning.strategy.hybrid import cost_plan

RESULTS = Path(__file__).resolve().parent / "results" / "plan_at_scale.json"
CLUSTER = "128x8xH100-IB"
SHAPE_70B = TransformerShape(hidden=8192, heads=64, layers=80, vocab=51200, positions=2048, batch=1, seq=2048,
                             dtype="bfloat16")
# Megatron-LM's 3D shapes for the 70B-class model: every block split 8 ways in a node, pipeline across nodes
MEGATRON = {"tp8-pp4-dp32 (Megatron-LM, 76B on 1,024 GPUs)": "pp4-1f1b-m8-tp1d256-L[0=ddp;1-80=ddp.tp1d8;81=ddp]",
            "tp8-pp8-dp16": "pp8-1f1b-m16-tp1d128-L[0=ddp;1-80=ddp.tp1d8;81=ddp]",
            "tp8-pp16-dp8": "pp16-1f1b-m32-tp1d64-L[0=ddp;1-80=ddp.tp1d8;81=ddp]"}


def gpt2_48():
    from workbench.cli.plan_commands import _model_costs

    costs, shape, *_ = _model_costs("gpt2-small", load_cluster(CLUSTER), 2, ["n_layer=48"])
    return costs, shape


def best_of(name: str, costs, shape, batch: int) -> dict:
    started = time.perf_counter()
    result = plan(Workload(costs, batch, shape=shape), CLUSTER, Budget(), SearchOptions(fine_grained=True, top=5))
    elapsed = time.perf_counter() - started
    print(f"\n{name}: {result.searched} strategies in {elapsed:.1f} s on {CLUSTER}, global batch {batch}")
    rows = []
    for p in result.plans:
        e = p.estimate
        rows.append({"name": p.name, "iteration_ms": round(e.iteration_ms, 1), "memory_gib": round(e.memory_gib, 2),
                     "compute_ms": round(e.compute_ms, 1), "bubble_ms": round(e.bubble_ms, 1),
                     "exposed_comm_ms": round(e.exposed_comm_ms, 1), "method": e.method})
        print(f"  {p.rank}. {p.name}\n     {e.iteration_ms:.1f} ms/iteration, {e.memory_gib:.1f} GiB/device: compute "
              f"{e.compute_ms:.1f}, bubble {e.bubble_ms:.1f}, exposed communication {e.exposed_comm_ms:.1f} "
              f"({e.method})")
    notes = [n for n in result.notes if n.startswith("per-layer")]
    for n in notes:
        print("  " + n)
    return {"elapsed_s": round(elapsed, 2), "searched": result.searched, "plans": rows, "notes": notes}


def megatron(costs, batch: int) -> dict:
    cluster, out = load_cluster(CLUSTER), {}
    print(f"\nMegatron-LM's 3D shapes for the 70B-class model, costed by the per-layer model:")
    for label, name in MEGATRON.items():
        e = cost_plan(costs, cluster, batch, name)
        parts = e.breakdown()
        worst = max(parts["stage_memory_gib"])
        out[label] = {"plan": name, "iteration_ms": round(e.iteration_ms, 1), "max_stage_memory_gib": round(worst, 2),
                      **{k: round(v, 1) for k, v in parts.items() if k.endswith("_ms") and k != "stage_ms"}}
        print(f"  {label}: {e.iteration_ms:.1f} ms/iteration, {worst:.1f} GiB on its fullest stage; "
              + ", ".join(f"{k} {v:.1f}" for k, v in parts.items() if k.endswith("_ms") and k != "stage_ms"))
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else RESULTS
    costs70 = transformer_costs(SHAPE_70B, DEVICES["H100"], "decoder-70b")
    print(f"70B-class decoder: {sum(l.num_params for l in costs70.layers) / 1e9:.1f} B parameters, "
          f"{costs70.layers[1].forward_ms:.2f} ms forward per block and sample on an H100")
    data = {"cluster": CLUSTER,
            "gpt2_48": best_of("GPT-2 small, 48 layers", *gpt2_48(), 1024),
            "decoder_70b": best_of("70B-class decoder (80 x 8192)", costs70, SHAPE_70B, 2048),
            "megatron_70b": megatron(costs70, 2048)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
