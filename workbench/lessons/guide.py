"""Which strategy should I use? Four rules of thumb, each put to the planner's per-layer search.

Problem. Rules of thumb ("data parallelism while the model fits", "shard before you
split layers", "tensor parallelism inside a node, pipelines across nodes", "recompute
before adding stages") are what a practitioner starts from, but each holds only
under conditions, and a lesson that states them as laws teaches something false.

Approach. For each rule, ask the per-layer search (:func:`search_hybrid`, the
planner's own cost model) the question the rule answers, on transformer shapes
costed analytically for the cluster's GPU (:func:`transformer_costs`, so no profile
is needed and the numbers are the same on every machine), and report what it
chose. A rule's ``holds`` is computed from that choice, and its sentence is built
from the numbers, including where the rule breaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.hardware import DEVICES
from ..planning.costs.analytic import transformer_costs
from ..planning.costs.clusters import load_cluster
from ..planning.costs.tensor_costs import TransformerShape
from ..planning.strategy.hybrid import cost_plan, search_hybrid

__all__ = ["Rule", "GUIDE_SHAPES", "check_rules", "guide_table"]

GIB = 2 ** 30
# the transformers the guide plans: GPT-2 small, a 7B-class and a 33B-class decoder (bf16, vocabulary 50,257)
GUIDE_SHAPES = {
    "GPT-2 small": TransformerShape(hidden=768, heads=12, layers=12, vocab=50257, positions=1024, batch=1, seq=1024,
                                    dtype="bfloat16"),
    "7B-class": TransformerShape(hidden=4096, heads=32, layers=32, vocab=50257, positions=2048, batch=1, seq=2048,
                                 dtype="bfloat16"),
    "33B-class": TransformerShape(hidden=8192, heads=64, layers=40, vocab=50257, positions=2048, batch=1, seq=2048,
                                  dtype="bfloat16"),
}
ONE_NODE, TWO_NODES = "8xA100-NVLink", "2x8xH100-IB"


@dataclass(frozen=True)
class Rule:
    """One rule of thumb, whether the planner's choice agrees with it, and the numbers that say so."""

    situation: str
    advice: str
    holds: bool
    evidence: str


def _costs(shape_name: str, cluster):
    return transformer_costs(GUIDE_SHAPES[shape_name], DEVICES[cluster.device.name], shape_name)


def _max_tp(estimate) -> int:
    return max(layer.tp_degree for layer in estimate.plan.layers)


def _shards(estimate) -> int:
    return sum(layer.dp != "replicate" for layer in estimate.plan.layers)


def _recomputes(estimate) -> int:
    return sum(layer.recompute for layer in estimate.plan.layers)


def _describe(estimate) -> str:
    """A plan's shape in words: its stages, tensor-parallel degree, data parallelism, sharding and recomputation."""
    plan, tp = estimate.plan, _max_tp(estimate)
    per_stage = plan.world_size // plan.pp
    parts = [f"{plan.pp} pipeline stages of {per_stage} devices" if plan.pp > 1 else f"{per_stage} devices"]
    parts.append(f"tensor parallelism {tp}" if tp > 1 else "no tensor parallelism")
    if per_stage // tp > 1:
        parts.append(f"data parallelism {per_stage // tp}")
    if _shards(estimate):
        parts.append(f"{_shards(estimate)} layers sharded")
    if _recomputes(estimate):
        parts.append(f"{_recomputes(estimate)} recomputed")
    return ", ".join(parts)


def _data_parallel(batch: int = 256) -> Rule:
    node, nodes = load_cluster(ONE_NODE), load_cluster(TWO_NODES)
    found = search_hybrid(_costs("GPT-2 small", node), node, batch)
    best, mixed = found.best["per-layer"], found.best.get("3d")
    pure = best.plan.pp == 1 and _max_tp(best) == 1
    across = search_hybrid(_costs("GPT-2 small", nodes), nodes, batch).best["per-layer"]
    evidence = (f"GPT-2 small on {ONE_NODE}, batch {batch}: the search's best plan `{best.name}` "
                f"({best.iteration_ms:.1f} ms) is {'pure data parallelism' if pure else 'not pure data parallelism'}"
                + (f"; the best with pipelines and tensor parallelism takes {mixed.iteration_ms:.1f} ms" if mixed else "")
                + f". The rule bends when the per-device batch is small and the all-reduce crosses nodes: on "
                f"{TWO_NODES} at the same batch the best has {_describe(across)} ({across.iteration_ms:.1f} ms).")
    return Rule("the model, its gradients and Adam's state fit one device", "data parallelism", pure, evidence)


def _sharding(batch: int = 256) -> Rule:
    cluster = load_cluster(TWO_NODES)
    found = search_hybrid(_costs("7B-class", cluster), cluster, batch, pp_options=(1,), max_tp=1)
    best, need = found.best.get("per-layer"), found.misses.get("dp", (0.0, ""))[0]
    holds = best is not None and "dp" in found.misses and _shards(best) > 0
    evidence = (f"7B-class on {TWO_NODES}, batch {batch}, data parallelism only: replicated, each device would need "
                f"{need / GIB:.0f} GiB of its {cluster.device.memory_bytes / GIB:.0f} GiB"
                + (f"; the search shards {_shards(best)} of {len(best.plan.layers)} layers ({_describe(best)}; "
                   f"{best.iteration_ms:.0f} ms, {best.memory_bytes / GIB:.0f} GiB)" if best else "; nothing fits") + ".")
    return Rule("the parameters' state does not fit one device", "ZeRO-2, then FSDP", holds, evidence)


def _tensor_in_node(batch: int = 256) -> Rule:
    cluster = load_cluster(TWO_NODES)
    costs = _costs("7B-class", cluster)
    best = search_hybrid(costs, cluster, batch, max_tp=2 * cluster.devices_per_node).best["per-layer"]
    last = len(costs.layers) - 1
    blocks = f"0=ddp;1-{last - 1}=ddp.tp1d{{t}}{{s}};{last}=ddp"
    inside = cost_plan(costs, cluster, batch, f"tp1d-8-dp2-L[{blocks.format(t=8, s='')}]")
    strided = cost_plan(costs, cluster, batch, f"tp1d-8-dp2-L[{blocks.format(t=8, s='.strided')}]")
    whole = cost_plan(costs, cluster, batch, f"tp1d-16-dp1-L[{blocks.format(t=16, s='')}]")
    per_node = cluster.devices_per_node
    holds = _max_tp(best) <= per_node and inside.iteration_ms < min(strided.iteration_ms, whole.iteration_ms)
    evidence = (f"7B-class on {TWO_NODES}, batch {batch}: 8-way tensor parallelism inside each node takes "
                f"{inside.iteration_ms:.0f} ms a step; the same groups strided across the nodes "
                f"{strided.iteration_ms:.0f} ms, and 16-way across both nodes {whole.iteration_ms:.0f} ms. Allowed "
                f"groups of up to {2 * per_node}, the search's best has {_describe(best)} ({best.iteration_ms:.0f} ms).")
    return Rule("several nodes: where tensor parallelism and pipelines go",
                "tensor parallelism inside a node, pipelines across nodes", holds, evidence)


def _recompute_first(batch: int = 256) -> Rule:
    cluster = load_cluster(TWO_NODES)
    costs = _costs("33B-class", cluster)
    without = search_hybrid(costs, cluster, batch, recompute=(False,)).best["per-layer"]
    with_rc = search_hybrid(costs, cluster, batch).best["per-layer"]
    holds = with_rc.plan.pp < without.plan.pp and with_rc.iteration_ms < without.iteration_ms and _recomputes(with_rc)
    evidence = (f"33B-class on {TWO_NODES}, batch {batch}, {cluster.device.memory_bytes / GIB:.0f} GiB a device: without "
                f"recomputation the best plan needs {without.plan.pp} stages ({without.iteration_ms:,.0f} ms); with it "
                f"the search recomputes {_recomputes(with_rc)} of {len(with_rc.plan.layers)} layers and keeps "
                f"{with_rc.plan.pp} stages ({with_rc.iteration_ms:,.0f} ms, "
                f"{without.iteration_ms / with_rc.iteration_ms:.2f} x as fast).")
    return Rule("activations overflow", "recompute some layers before adding stages", bool(holds), evidence)


def check_rules() -> list[Rule]:
    """The four rules, each with the planner's answer (a few seconds: five per-layer searches)."""
    return [_data_parallel(), _sharding(), _tensor_in_node(), _recompute_first()]


def guide_table(rules: list[Rule]) -> str:
    """The guide as a Markdown table: situation, advice, whether the planner agrees, and its numbers."""
    lines = ["| your situation | start with | the planner agrees? | its numbers |", "|---|---|---|---|"]
    lines += [f"| {r.situation} | {r.advice} | {'yes' if r.holds else '**no**'} | {r.evidence} |" for r in rules]
    return "\n".join(lines)
