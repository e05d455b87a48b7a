"""The outer per-layer search: pipeline degree, micro-batches and partition around the per-layer programme."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace

import pytest

from workbench.core.costs import LayerCost, ModelCosts
from workbench.core.plan import ParallelPlan
from workbench.planning.costs.clusters import get_cluster
from workbench.planning.strategy.hybrid import TEMPLATES, _split, search_hybrid
from workbench.planning.strategy.hybrid_partitions import _split_by_stage
from workbench.planning.layerwise.layer_strategies import CONV, LINEAR, OTHER, TRANSFORMER

MIB, GIB = 2**20, 2**30


def mixed_model(blocks: int = 6) -> ModelCosts:
    """A parameter-heavy embedding and head around activation-heavy blocks: the case per-layer mixing is for."""
    layers = [LayerCost("embeddings", 0.5, 1.0, param_bytes=1200 * MIB, activation_bytes=8 * MIB, saved_bytes=8 * MIB)]
    layers += [LayerCost(f"block_{i}", 4.0, 8.0, param_bytes=60 * MIB, activation_bytes=16 * MIB,
                         saved_bytes=300 * MIB) for i in range(blocks)]
    layers.append(LayerCost("head", 1.0, 2.0, param_bytes=1200 * MIB, activation_bytes=64 * MIB, saved_bytes=64 * MIB))
    return ModelCosts("mixed", 1, "synthetic", tuple(layers), input_bytes=MIB)


def random_model(rng: random.Random, num_layers: int) -> ModelCosts:
    layers = tuple(LayerCost(f"block_{i}", rng.uniform(0.5, 4), rng.uniform(1, 8),
                             param_bytes=int(rng.uniform(10, 800) * MIB), activation_bytes=int(rng.uniform(2, 40) * MIB),
                             saved_bytes=int(rng.uniform(10, 400) * MIB)) for i in range(num_layers))
    return ModelCosts("random", 1, "synthetic", layers, input_bytes=MIB)


def test_split_minimises_the_largest_run_like_brute_force():
    rng = random.Random(3)
    for _ in range(30):
        weights = [rng.uniform(0.1, 5) for _ in range(rng.randint(3, 8))]
        parts = rng.randint(1, min(4, len(weights)))
        bounds = _split(weights, parts)
        got = max(sum(weights[a:b + 1]) for a, b in bounds)
        best = min(max(sum(weights[a:b]) for a, b in zip((0, *cuts), (*cuts, len(weights))))
                   for cuts in itertools.combinations(range(1, len(weights)), parts - 1))
        assert got == pytest.approx(best)
        assert bounds[0][0] == 0 and bounds[-1][1] == len(weights) - 1
        assert all(b[1] + 1 == c[0] for b, c in zip(bounds, bounds[1:]))



def test_split_of_sums_is_the_scanned_split_ties_included():
    """The linear-time split of prefix sums picks what the scan of every start picks, ties included (whole
    numbers and zeros make many)."""
    rng = random.Random(8)
    for _ in range(3000):
        n = rng.randint(1, 30)
        weights = rng.choice([lambda: [float(rng.randint(0, 3)) for _ in range(n)],
                              lambda: [rng.choice([0.0, 0.1, 0.2, 0.3]) for _ in range(n)],
                              lambda: [rng.uniform(0, 5) for _ in range(n)]])()
        prefix = list(itertools.accumulate(weights, initial=0.0))
        parts = rng.randint(1, n)
        assert _split(weights, parts) == _split_by_stage(lambda _k, a, b: prefix[b + 1] - prefix[a], n, parts)

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cluster", ["8xA100-NVLink", "2x8xH100-IB"])
def test_per_layer_plan_is_never_slower_than_a_template(seed, cluster):
    rng = random.Random(seed)
    costs = random_model(rng, rng.randint(6, 12))
    spec = get_cluster(cluster)
    for budget in (spec.device.memory_bytes, rng.uniform(1.5, 6) * GIB):
        result = search_hybrid(costs, spec, 64, budget_bytes=budget)
        if "per-layer" not in result.best:
            assert not set(result.best), "a template fits where the per-layer search found nothing"
            continue
        mine = result.best["per-layer"]
        assert mine.memory_bytes <= budget
        for name, theirs in result.best.items():
            assert mine.iteration_ms <= theirs.iteration_ms + 1e-9, name
            assert theirs.memory_bytes <= budget


@pytest.mark.parametrize("seed", range(3))
def test_bounded_stage_searches_find_what_the_plain_frontier_finds(seed, monkeypatch):
    """The bound on each stage's frontier (the fastest assignment's time when it fits, else a bucket answer's)
    only prunes: random models, clusters and memory caps give the same plans with and without it."""
    from workbench.planning.layerwise import stage_search

    def searched(costs, spec, budget):
        result = search_hybrid(costs, spec, 64, budget_bytes=budget)
        return ([(p.name, p.iteration_ms, p.memory_bytes, p.strategies) for p in result.plans],
                {k: p.name for k, p in result.best.items()}, result.misses, result.searched)

    rng = random.Random(100 + seed)
    costs = random_model(rng, rng.randint(4, 9))
    for cluster in ("8xA100-NVLink", "2x8xH100-IB"):
        spec = get_cluster(cluster)
        for budget in (spec.device.memory_bytes, rng.uniform(1.5, 6) * GIB, rng.uniform(0.3, 1.5) * GIB):
            bounded = searched(costs, spec, budget)
            monkeypatch.setattr(stage_search, "BOUNDED", False)
            plain = searched(costs, spec, budget)
            monkeypatch.setattr(stage_search, "BOUNDED", True)
            assert bounded == plain, (cluster, budget)

def test_tight_memory_makes_the_mix_win_and_it_mixes():
    spec = get_cluster("2x8xH100-IB")
    result = search_hybrid(mixed_model(), spec, 64, budget_bytes=2 * GIB)
    mine = result.best["per-layer"]
    assert len({(l["dp_kind"], l["tp"], l["recompute"]) for l in mine.layers()}) > 1, mine.name
    assert result.gain("uniform") > 0.05, (mine.name, result.best["uniform"].name)
    loose = search_hybrid(mixed_model(), spec, 64)  # the device's 80 GB: one strategy is enough
    assert loose.gain("uniform") == pytest.approx(0, abs=0.01)


def test_plans_are_parallel_plans_that_round_trip_and_cover_every_layer():
    costs = mixed_model()
    result = search_hybrid(costs, get_cluster("2x8xH100-IB"), 64, budget_bytes=4 * GIB)
    assert result.plans
    for found in result.plans[:20]:
        plan = found.plan
        assert ParallelPlan.parse(plan.name) == plan
        assert ParallelPlan.from_dict(plan.to_dict()) == plan
        assert plan.world_size == 16
        layers = found.layers()
        assert [l["name"] for l in layers] == [l.name for l in costs.layers]
        assert all({"name", "tp", "dp_kind", "recompute"} <= set(l) for l in layers)
        assert [l.tp_degree for l in plan.layers_for(costs.num_layers)] == [l["tp"] for l in layers]
        b = found.breakdown()
        slowest = max(b["stage_ms"])
        assert found.iteration_ms == pytest.approx(slowest + b["bubble_ms"] + b["p2p_ms"])
        assert max(b["stage_memory_gib"]) * GIB == pytest.approx(found.memory_bytes)
        json.dumps(found.to_dict())


def test_convolutions_get_no_tensor_parallelism_and_do_not_crash():
    layers = tuple(LayerCost(f"conv{i}", 2.0, 4.0, param_bytes=5 * MIB, activation_bytes=100 * MIB,
                             saved_bytes=100 * MIB) for i in range(4))
    layers += (LayerCost("fc6", 1.0, 2.0, param_bytes=400 * MIB, activation_bytes=MIB, saved_bytes=MIB),)
    costs = ModelCosts("vgg-like", 1, "synthetic", layers, input_bytes=MIB)
    result = search_hybrid(costs, get_cluster("8xA100-NVLink"), 64, budget_bytes=2 * GIB,
                           kinds=[CONV] * 4 + [LINEAR])
    for found in result.plans:
        assert all(l["tp"] == 1 for l in found.layers()[:4])


def test_a_budget_nothing_fits_names_the_closest_plan_and_the_shortfall():
    result = search_hybrid(mixed_model(), get_cluster("8xA100-NVLink"), 64, budget_bytes=64 * MIB)
    assert "per-layer" not in result.best and not result.best
    text = result.closest_miss("per-layer")
    assert "GiB over the 0.062 GiB budget" in text and "pipeline degree" in text
    need = result.misses["per-layer"][0]
    assert need > 64 * MIB


@pytest.mark.parametrize("kwargs, match", [
    ({"global_batch": 0}, "global_batch"),
    ({"world_size": 6}, "power of two"),
    ({"templates": ("best",)}, "templates"),
    ({"budget_bytes": -1}, "budget_bytes"),
    ({"dp_kinds": ("ddp",)}, "dp_kinds"),
    ({"pp_options": (3,)}, "pipeline degree"),
    ({"global_batch": 3}, "whole samples"),
])
def test_bad_input_names_what_is_wrong(kwargs, match):
    args = {"global_batch": 64, **kwargs}
    batch = args.pop("global_batch")
    with pytest.raises(ValueError, match=match):
        search_hybrid(mixed_model(), get_cluster("8xA100-NVLink"), batch, **args)


def test_templates_follow_their_definitions():
    result = search_hybrid(mixed_model(), get_cluster("8xA100-NVLink"), 64)
    assert set(result.best) == set(TEMPLATES)
    dp, fsdp, three_d = result.best["dp"], result.best["fsdp"], result.best["3d"]
    assert dp.plan.pp == 1 and {l["dp_kind"] for l in dp.layers()} == {"replicate"}
    assert {l["tp"] for l in dp.layers()} == {1}
    assert fsdp.plan.pp == 1 and {l["dp_kind"] for l in fsdp.layers()} == {"fsdp"}
    assert {l["dp_kind"] for l in three_d.layers()} == {"replicate"}
    assert three_d.plan.pp > 1 or three_d.plan.tp > 1
    assert result.best["uniform"].iteration_ms <= min(dp.iteration_ms, fsdp.iteration_ms, three_d.iteration_ms)


def test_planner_fine_grained_json_keeps_its_shape_and_lists_layers(tmp_path):
    from workbench.planning import Budget, SearchOptions, Workload, plan

    costs = mixed_model()
    result = plan(Workload(costs, 64), "8xA100-NVLink", Budget(memory_cap_gib=3), SearchOptions(fine_grained=True))
    data = json.loads(json.dumps(result.to_dict(), default=str))
    assert {"strategies", "elapsed_s"} <= set(data)
    assert all({"name", "throughput", "layers"} <= set(s) for s in data["strategies"])
    per_layer = [s for s in data["strategies"] if s["method"] == "per-layer DP"]
    assert per_layer and per_layer[0]["name"] == data["per_layer"]["best"]["per-layer"]["name"]
    assert len(per_layer[0]["layers"]) == costs.num_layers
    assert {"uniform", "dp", "fsdp", "3d"} & set(data["per_layer"]["gain"])
    uniform = [s for s in data["strategies"] if len({(l["dp_kind"], l["tp"], l["recompute"]) for l in s["layers"]}) == 1]
    assert uniform, "the best uniform plan stays in the list"
    assert data["per_layer"]["best"]["uniform"]["name"] in [s["name"] for s in data["strategies"]]
    assert any("per-layer model" in note for note in data["notes"])
    compared = [note for note in data["notes"] if note.startswith("per-layer model:")]
    assert compared and not any("best best" in note for note in compared)
    assert any("uniform plan (one strategy for every layer" in note for note in compared)  # says what uniform means


def test_cli_fine_grained_json_and_search_line(tmp_path, capsys):
    from workbench.cli import main

    path = mixed_model().save(tmp_path / "costs.json")
    assert main(["plan", str(path), "--cluster", "8xA100-NVLink", "--batch", "64", "--memory-cap", "3",
                 "--fine-grained", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"strategies", "elapsed_s", "per_layer"} <= set(data)
    for row in data["strategies"]:
        assert {"name", "throughput", "layers"} <= set(row)
        assert all({"name", "tp", "dp_kind", "recompute"} <= set(l) for l in row["layers"])
    assert any(row["method"] == "per-layer DP" for row in data["strategies"])
    assert main(["plan", str(path), "--cluster", "8xA100-NVLink", "--batch", "64", "--memory-cap", "3",
                 "--fine-grained"]) == 0
    text = capsys.readouterr().out
    assert "per-layer search: 22 decision trees on 8 devices; 11 strategies per layer" in text
    assert "stage searches in" in text


def test_cost_plan_reproduces_what_the_search_found_for_its_plans():
    from workbench.planning.strategy.hybrid import cost_plan

    costs, spec = mixed_model(), get_cluster("2x8xH100-IB")
    result = search_hybrid(costs, spec, 64, budget_bytes=2 * GIB)
    for found in result.plans[:15]:
        again = cost_plan(costs, spec, 64, found.plan.name)
        assert again.iteration_ms == pytest.approx(found.iteration_ms, rel=1e-9), found.name
        assert again.memory_bytes == found.memory_bytes
    with pytest.raises(ValueError, match="costs plans without a pipeline"):
        cost_plan(costs, spec, 64, "async-2x4-m8")
    with pytest.raises(ValueError, match="whole samples"):
        cost_plan(costs, spec, 63, "dp16")


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_searched_per_layer_plan_runs_exactly_as_planned(tmp_path):
    """The planner's per-layer plan becomes a run config, and 4 real ranks realise every layer's options."""
    import torch

    from workbench.jobs import LaunchSpec, launch
    from workbench.models.zoo import build_model
    from workbench.planning import Budget, SearchOptions, Workload, plan
    from workbench.profiling import profile
    from workbench.runtime.events import read_events

    overrides = {"n_layer": 4, "vocab_size": 4096, "n_embd": 128, "n_head": 4}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        costs = profile(build_model("gpt2-tiny", **overrides), batch=8, repeats=1, progress=False)
    finally:
        torch.set_num_threads(threads)
    result = plan(Workload(costs, 16), "local", Budget(memory_cap_gib=0.01, world_size=4),
                  SearchOptions(fine_grained=True))
    mixed = [p for p in result.per_layer.plans if not p.plan.is_uniform]
    assert mixed, "the per-layer search found no mixed plan under the cap"
    chosen = mixed[0]
    from workbench.planning.strategy.hybrid import as_estimate
    from workbench.planning.strategy.search import RankedPlan

    run_config = RankedPlan(chosen.plan, as_estimate(chosen), costs.model, 16).to_config(
        model={"overrides": overrides}, training={"steps": 2}, data={"kind": "bytes-lm", "seq_len": 32})
    job = launch(LaunchSpec(config=run_config.to_dict(), name="per-layer", run_root=str(tmp_path)))
    assert job.wait(timeout=200).state == "SUCCEEDED"
    planned = chosen.plan.layers_for(costs.num_layers)
    covered = set()
    for rank in range(4):
        start = next(e for e in read_events(job.run_dir, rank) if e["kind"] == "start")
        realised = {layer["index"]: (layer["dp"], layer["tp_degree"], layer["recompute"]) for layer in start["layers"]}
        for index, (dp, tp, recompute) in realised.items():
            assert (dp, tp, recompute) == (planned[index].dp, planned[index].tp_degree, planned[index].recompute)
        covered |= set(realised)
    assert covered == set(range(costs.num_layers))


@pytest.mark.parametrize("cluster", ["8xA100-NVLink", "2x8xH100-IB"])
def test_every_searched_plan_is_one_the_runtime_accepts(cluster):
    from workbench.core.config import RunConfig

    result = search_hybrid(mixed_model(), get_cluster(cluster), 64, budget_bytes=3 * GIB)
    assert result.plans
    for found in result.plans:
        RunConfig.from_dict({"model": "mlp", "training": {"global_batch": 64}, "plan": found.plan.to_dict()})
