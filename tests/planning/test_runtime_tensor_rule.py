"""The planner ranks no tensor-parallel plan the runtime refuses (the rule of ``workbench.core.tensor_support``).

The uniform ``tp1d-*`` / ``tp2d-*`` plans shard a GPT-2 whole: a model without a GPT-2 shape gets none, with one
note saying so, and one asked for by name is infeasible with the reason. Per-layer plans split no layer further
than ``Workload.tp_limits`` (what the layer-by-layer runtime splits each layer by).
"""

from __future__ import annotations

import pytest

from workbench.core.costs import LayerCost, ModelCosts
from workbench.core.plan import ParallelPlan
from workbench.planning import Budget, SearchOptions, TransformerShape, Workload, plan
from workbench.planning.strategy.space import runtime_refusal

MIB = 2**20
SKIPPED = "tensor-parallel plans (tp1d-*, tp2d-*) skipped: {} has no GPT-2 shape the runtime can split"
GPT = TransformerShape(hidden=256, heads=8, layers=4, vocab=1000, positions=256, batch=8, seq=64)


def vgg_tiny() -> ModelCosts:
    """vgg-tiny's layers at a tiny size: two convolutions, three fully connected layers."""
    layers = [LayerCost(f"conv{i}", 0.5, 1.0, param_bytes=MIB, activation_bytes=4 * MIB, saved_bytes=8 * MIB)
              for i in (1, 2)]
    layers += [LayerCost(f"fc{i}", 1.0, 2.0, param_bytes=16 * MIB, activation_bytes=MIB // 4, saved_bytes=MIB)
               for i in (1, 2, 3)]
    return ModelCosts("vgg-tiny", 8, "synthetic", tuple(layers), input_bytes=MIB)


def toy_transformer() -> ModelCosts:
    """toy-transformer's layer names (blocks the per-layer search takes for transformer blocks by their names, which
    the runtime does not split) with sizes whose best per-layer plan splits the blocks."""
    layers = [LayerCost("embeddings", 0.2, 0.4, param_bytes=50 * MIB, activation_bytes=16 * MIB,
                        saved_bytes=16 * MIB)]
    layers += [LayerCost(f"block_{i}", 4.0, 8.0, param_bytes=200 * MIB, activation_bytes=16 * MIB,
                         saved_bytes=100 * MIB) for i in range(4)]
    layers.append(LayerCost("head", 0.2, 0.4, param_bytes=50 * MIB, activation_bytes=16 * MIB, saved_bytes=16 * MIB))
    return ModelCosts("toy-transformer", 8, "synthetic", tuple(layers), input_bytes=MIB)


def _split_layers(result) -> list[tuple[str, str, int]]:
    """Every split layer of the ranked plans and of every plan the per-layer search costed."""
    costed = list(result.per_layer.plans) if result.per_layer is not None else []
    return [(p.name, layer["name"], layer["tp"]) for p in [*result.plans, *costed] for layer in p.layers()
            if layer["tp"] > 1]


def test_a_model_without_a_gpt2_shape_gets_no_tensor_parallel_plan_and_one_note():
    result = plan(Workload(vgg_tiny(), 32), "8xV100-PCIe", Budget(world_size=4), SearchOptions(simulate_top=2))
    assert result.plans and all(p.plan.tp == 1 for p in result.plans)
    assert _split_layers(result) == []
    assert [n for n in result.notes if "skipped" in n] == [
        SKIPPED.format("vgg-tiny") + " (uniform tensor parallelism needs a GPT-2 model such as 'gpt2-tiny'; "
                                     "per-layer plans still split single layers the runtime has rules for)"]


def test_an_explicit_tensor_parallel_plan_of_such_a_model_is_infeasible_with_the_reason():
    result = plan(Workload(vgg_tiny(), 32), "8xV100-PCIe", Budget(world_size=4),
                  SearchOptions(strategies=["tp1d-2-dp2", "tp2d-2x2-dp1", "dp4"]))
    assert [p.name for p in result.plans] == ["dp4"]
    refused = {i["name"]: i["reason"] for i in result.infeasible}
    for name in ("tp1d-2-dp2", "tp2d-2x2-dp1"):
        assert refused[name] == ("uniform tensor parallelism needs a GPT-2 model such as 'gpt2-tiny'; vgg-tiny has "
                                 "no GPT-2 shape the runtime can split")
    assert sum(SKIPPED.format("vgg-tiny") in n for n in result.notes) == 1
    assert {"name": "tp1d-2-dp2", "feasible": False} in [{k: r[k] for k in ("name", "feasible")}
                                                         for r in result.rows()]
    with pytest.raises(ValueError, match=r"fits; tp1d-2-dp2: uniform tensor parallelism needs a GPT-2 model .* "
                                         r"vgg-tiny has no GPT-2 shape"):
        plan(Workload(vgg_tiny(), 32), "8xV100-PCIe", Budget(world_size=4),
             SearchOptions(strategies=["tp1d-2-dp2"]))


def test_gpt2_keeps_its_tensor_parallel_plans():
    costs = ModelCosts.uniform(4, forward_ms=1.0, backward_ms=2.0, param_bytes=20_000_000,
                               activation_bytes=2_000_000, batch_size=8)
    result = plan(Workload(costs, 32, shape=GPT), "8xV100-PCIe", Budget(world_size=4),
                  SearchOptions(simulate_top=2, recompute=(False,)))
    families = {p.plan.family for p in result.plans}
    assert {"tp1d", "tp2d"} <= families
    assert not any("skipped" in n for n in result.notes)
    given = plan(Workload(costs, 32, shape=GPT), "8xV100-PCIe", Budget(world_size=4),
                 SearchOptions(strategies=["tp1d-2-dp2", "tp2d-2x2-dp1"]))
    assert {p.name for p in given.plans} == {"tp1d-2-dp2", "tp2d-2x2-dp1"} and given.infeasible == []


def test_per_layer_plans_split_no_layer_the_runtime_does_not():
    costs, options = toy_transformer(), SearchOptions(fine_grained=True, simulate_top=1, kinds=("dp",))
    guessed = plan(Workload(costs, 8), "8xA100-NVLink", Budget(world_size=4), options)
    assert any(name.startswith("block_") for _, name, _ in _split_layers(guessed)), \
        "judged by their names, the blocks are split: the case the runtime's limits are for"
    limited = plan(Workload(costs, 8, tp_limits=(1,) * 6), "8xA100-NVLink", Budget(world_size=4), options)
    assert limited.plans and _split_layers(limited) == []
    halved = plan(Workload(costs, 8, tp_limits=(1, 2, 2, 2, 2, 1)), "8xA100-NVLink", Budget(world_size=4), options)
    assert halved.plans and {tp for _, _, tp in _split_layers(halved)} <= {2}


def test_the_runtime_rule_for_one_plan():
    def refusal(name, shaped=False, tp_limits=None):
        return runtime_refusal(ParallelPlan.parse(name), model="m", shaped=shaped, tp_limits=tp_limits)

    assert refusal("dp4") == refusal("tp1d-2-dp2", shaped=True) == ""
    assert "needs a GPT-2 model" in refusal("tp2d-2x2-dp1")
    # every layer the mesh's own consecutive 1D split: the uniform strategy runs it, which shards a GPT-2 whole
    assert "needs a GPT-2 model" in refusal("tp1d-2-dp2-L[all=ddp.tp1d2]")
    assert refusal("tp1d-2-dp2-L[0=ddp.tp1d2;1-3=ddp]") == ""  # layer by layer: no GPT-2 needed
    assert refusal("tp1d-2-dp2-L[0=ddp.tp1d2;1-3=ddp]", tp_limits=(1, 4, 4, 4)) == \
        "layer 0 is split 2 ways; the runtime does not split it"
    assert refusal("tp1d-4-dp1-L[0=ddp;1-3=ddp.tp1d4]", tp_limits=(8, 2, 2, 2)) == \
        "layer 1 is split 4 ways; the runtime splits it at most 2 ways"


@pytest.mark.parametrize("limits", [(1, 2), (1, 3, 1, 1, 1), (0, 1, 1, 1, 1)])
def test_tp_limits_are_checked(limits):
    with pytest.raises(ValueError, match="Workload.tp_limits must be"):
        Workload(vgg_tiny(), 32, tp_limits=limits)


def test_workbench_plan_gives_bert_no_uniform_tensor_parallel_plan(capsys):
    """BERT has a transformer shape, but the uniform tensor-parallel runtime shards GPT-2 only."""
    import json

    from workbench.cli import main

    args = ["plan", "bert-tiny", "--cluster", "8xV100-PCIe", "--batch", "16", "--world-size", "4", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    data = data.get("data", data)
    assert data["strategies"] and not any(s["name"].startswith("tp") for s in data["strategies"])
    assert sum(SKIPPED.format("bert-tiny") in n for n in data["notes"]) == 1
    assert main(args + ["--strategies", "tp1d-2-dp2,dp4"]) == 0
    data = json.loads(capsys.readouterr().out)
    data = data.get("data", data)
    assert [s["name"] for s in data["strategies"]] == ["dp4"]
    assert [i["name"] for i in data["infeasible"]] == ["tp1d-2-dp2"]
    assert "needs a GPT-2 model" in data["infeasible"][0]["reason"]


def test_emit_config_refuses_what_the_preflight_would():
    from workbench.cli.plan_commands import _check_shards
    from workbench.core.config import RunConfig

    _check_shards(RunConfig(model="gpt2-tiny", plan="tp1d-2-dp1", training={"global_batch": 8}))
    _check_shards(RunConfig(model="bert-tiny", plan="tp1d-2-dp1-L[0=ddp;1-2=ddp.tp1d2;3=ddp]",
                            training={"global_batch": 8}))
    with pytest.raises(ValueError, match="uniform tensor parallelism needs a GPT-2 model"):
        _check_shards(RunConfig(model="bert-tiny", plan="tp1d-2-dp1", training={"global_batch": 8}))
