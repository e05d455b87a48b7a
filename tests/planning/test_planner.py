"""The planner: ranked strategies with their breakdown, launch configs, and clear errors for bad input."""

import itertools
import json
import random
from dataclasses import replace

import pytest

from workbench.core.config import RunConfig
from workbench.core.costs import LayerCost, ModelCosts
from workbench.core.plan import GroPipe, Interleaved, ParallelPlan
from workbench.planning import Budget, SearchOptions, TransformerShape, Workload, plan
from workbench.planning.costs.clusters import load_cluster
from workbench.planning.layerwise.finegrained import choose_per_layer

COSTS = ModelCosts.uniform(16, forward_ms=1.0, backward_ms=2.0, param_bytes=20_000_000, activation_bytes=2_000_000,
                           batch_size=8)
GPT = TransformerShape(hidden=256, heads=8, layers=8, vocab=1000, positions=256, batch=8, seq=64)


def test_table_is_ranked_with_a_consistent_breakdown():
    result = plan(Workload(COSTS, 64), "8xV100-PCIe")
    table = result.table
    assert list(table.columns[:8]) == ["rank", "name", "iteration_ms", "throughput", "memory_gib", "compute_ms",
                                       "bubble_ms", "exposed_comm_ms"]
    simulated = table[table.method == "simulated"]
    assert list(simulated.iteration_ms) == sorted(simulated.iteration_ms)
    assert result.best.name == table.name[0]
    for p in result.plans:
        e = p.estimate
        assert e.compute_ms + e.bubble_ms + e.exposed_comm_ms == pytest.approx(e.iteration_ms, rel=1e-6)
        assert e.throughput == pytest.approx(64 / (e.iteration_ms / 1e3))
        assert e.memory_bytes > 0
    assert {"dp8", "gropipe-2x4-1f1b-m8-d1"} <= set(table.name)


def test_a_pipeline_without_communication_matches_the_bubble_formula():
    # 1F1B on S stages of identical cost: (m + S - 1) x (f + b) per iteration
    light = ModelCosts.uniform(16, forward_ms=1.0, backward_ms=2.0, activation_bytes=1000, batch_size=8)
    result = plan(Workload(light, 64), "8xV100-PCIe", Budget(world_size=4),
                  SearchOptions(strategies=["pp4-1f1b-m8", "pp4-gpipe-m8"]))
    for p in result.plans:
        stage = 4 * (1.0 + 2.0) * (8 / 8)  # 4 layers per stage, micro-batch 8 = the profile's batch
        # no weights (no optimizer step); 1 kB boundary transfers cost their latency only
        assert p.estimate.iteration_ms == pytest.approx((8 + 4 - 1) * stage, rel=0.02)
        assert p.estimate.bubble_ms == pytest.approx(3 * stage, rel=0.05)


def test_delay_one_hides_the_gradient_all_reduce():
    heavy = ModelCosts.uniform(8, forward_ms=1.0, backward_ms=2.0, param_bytes=400_000_000, batch_size=8)
    result = plan(Workload(heavy, 32), "8xV100-PCIe", Budget(world_size=4),
                  SearchOptions(strategies=["gropipe-2x2-1f1b-m4-d0", "gropipe-2x2-1f1b-m4-d1"]))
    d0, d1 = result["gropipe-2x2-1f1b-m4-d0"].estimate, result["gropipe-2x2-1f1b-m4-d1"].estimate
    assert d1.exposed_comm_ms < d0.exposed_comm_ms
    assert d1.iteration_ms < d0.iteration_ms


def test_plans_turn_into_launch_configs():
    result = plan(Workload(COSTS, 64, shape=GPT), "8xV100-PCIe",
                  options=SearchOptions(strategies=["dp8", "gropipe-2x4-1f1b-m8-d1", "tp2d-2x2-dp2",
                                                    "pp8-interleaved-v2-m8"]))
    configs = {p.name: p.to_config(training={"steps": 3}) for p in result.plans}
    assert configs["dp8"].plan == ParallelPlan.parse("dp8") and configs["dp8"].world_size == 8
    g = configs["gropipe-2x4-1f1b-m8-d1"].plan
    assert (g.dp, g.pp, g.microbatches, g.pipeline) == (2, 4, 8, GroPipe(inner="1f1b", delay=1))
    assert g.partition == str(result["gropipe-2x4-1f1b-m8-d1"].estimate.partition)
    assert configs["gropipe-2x4-1f1b-m8-d1"].training.steps == 3
    assert g.replace(partition="uniform") == result["gropipe-2x4-1f1b-m8-d1"].plan
    t = configs["tp2d-2x2-dp2"].plan
    assert (t.tp_kind, t.tp, t.q, t.dp) == ("2d", 4, 2, 2)
    assert configs["pp8-interleaved-v2-m8"].plan.pipeline == Interleaved(chunks=2)
    assert all(isinstance(c, RunConfig) for c in configs.values())


def test_tensor_parallel_needs_a_shape_and_saves_memory():
    result = plan(Workload(COSTS, 64, shape=GPT), "8xV100-PCIe",
                  options=SearchOptions(strategies=["dp8", "tp2d-2x2-dp2", "tp1d-4-dp2"]))
    assert result["tp2d-2x2-dp2"].timeline() is not None
    assert result["tp2d-2x2-dp2"].estimate.detail["collective_calls"] > result["tp1d-4-dp2"].estimate.detail[
        "collective_calls"]
    with pytest.raises(ValueError, match="fits; tp2d-2x2-dp2: uniform tensor parallelism needs a GPT-2 model"):
        plan(Workload(COSTS, 64), "8xV100-PCIe", options=SearchOptions(strategies=["tp2d-2x2-dp2"]))


def test_a_budget_nothing_fits_names_the_closest():
    with pytest.raises(ValueError, match=r"fits; closest is \S+, which needs [\d.]+ GiB per device, [\d.]+ GiB over"):
        plan(Workload(COSTS, 64), "8xV100-PCIe", Budget(memory_cap_gib=0.01))


def test_selective_recomputation_fits_where_keeping_everything_does_not():
    # each layer saves 5x its output for the backward pass; recomputing it keeps only the output
    layer = LayerCost("l", 1.0, 2.0, param_bytes=10_000_000, activation_bytes=40_000_000, saved_bytes=200_000_000)
    big = ModelCosts("big", 8, "synthetic", tuple(replace(layer, name=f"l{i}") for i in range(8)))
    kinds = ("pipeline",)
    plain = plan(Workload(big, 32), "8xV100-PCIe", Budget(memory_cap_gib=1.2, world_size=4),
                 SearchOptions(kinds=kinds, recompute=(False,)))
    fine = plan(Workload(big, 32), "8xV100-PCIe", Budget(memory_cap_gib=1.2, world_size=4),
                SearchOptions(kinds=kinds, recompute=(False,), fine_grained=True))
    extra = [p for p in fine.plans if "recompute_layers" in p.estimate.detail]
    assert extra and not any("recompute_layers" in p.estimate.detail for p in plain.plans)
    for p in extra:
        assert p.estimate.memory_bytes <= 1.2 * 2**30
        assert 0 < len(p.estimate.detail["recompute_layers"]) <= big.num_layers
    # only pipelines the layer-by-layer runtime runs with per-layer options get them: never GroPipe or async
    everything = plan(Workload(big, 32), "8xV100-PCIe", Budget(memory_cap_gib=1.2, world_size=4),
                      SearchOptions(recompute=(False,), fine_grained=True))
    per_layer = [p.plan for p in everything.plans if p.plan.layers and len(set(p.plan.layers)) > 1]
    assert per_layer and all(s.pipeline.per_layer and s.pipeline.family not in ("gropipe", "async") and
                             s.pipeline.kind != "zb-auto" for s in per_layer), [s.name for s in per_layer]


def test_choose_per_layer_matches_brute_force():
    rng = random.Random(3)
    for _ in range(30):
        layers = [[(rng.uniform(0, 5), rng.randint(0, 40)) for _ in range(rng.randint(1, 3))]
                  for _ in range(rng.randint(1, 6))]
        budget = rng.randint(20, 120)
        fits = [sum(layers[i][o][0] for i, o in enumerate(c)) for c in itertools.product(*map(range, map(len, layers)))
                if sum(layers[i][o][1] for i, o in enumerate(c)) <= budget]
        found = choose_per_layer(layers, budget, resolution=budget)  # integer memory: exact
        if not fits:
            assert found is None
            continue
        assert found is not None and found[0] == pytest.approx(min(fits))
        assert sum(layers[i][o][1] for i, o in enumerate(found[1])) <= budget
    assert choose_per_layer([[(1.0, 10)]], 5) is None


@pytest.mark.parametrize("change, message", [
    ({"intra_node": {"name": "x", "latency_us": 1.0, "bandwidth_gbs": 1e9}}, "intra_node.bandwidth_gbs = 1e\\+09 is "
                                                                            "beyond any real machine"),
    ({"intra_node": {"name": "x", "latency_us": 1.0, "bandwidth_gbs": -5}}, "bandwidth_gbs must be > 0"),
    ({"devices_per_node": 0}, "devices_per_node must be > 0"),
    ({"num_nodes": 2}, "has 2 nodes but no inter_node link"),
])
def test_impossible_cluster_files_are_refused(tmp_path, change, message):
    spec = load_cluster("8xV100-PCIe")
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({**spec.to_dict(), **change}))
    with pytest.raises(ValueError, match=message):
        plan(Workload(COSTS, 64), path)


def test_cluster_files_with_a_collective_link(tmp_path):
    spec = load_cluster("8xV100-PCIe")
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"cluster": spec.to_dict(),
                                "collective_link": {"name": "slow", "latency_us": 50.0, "bandwidth_gbs": 0.5}}))
    slow = plan(Workload(COSTS, 64), path, options=SearchOptions(strategies=["dp8"])).best.estimate
    fast = plan(Workload(COSTS, 64), "8xV100-PCIe", options=SearchOptions(strategies=["dp8"])).best.estimate
    assert slow.exposed_comm_ms > fast.exposed_comm_ms


def test_bad_arguments_fail_before_any_work():
    with pytest.raises(ValueError, match="global_batch must be an int >= 1"):
        plan(Workload(COSTS, 0), "8xV100-PCIe")
    with pytest.raises(ValueError, match="world_size=16 is more devices than cluster '8xV100-PCIe' has"):
        plan(Workload(COSTS, 64), "8xV100-PCIe", Budget(world_size=16))
    with pytest.raises(ValueError, match="neither a preset"):
        plan(Workload(COSTS, 64), "9xTPU")
    with pytest.raises(ValueError, match="memory_cap_gib must be a number > 0"):
        plan(Workload(COSTS, 64), "8xV100-PCIe", Budget(memory_cap_gib=-1))
    with pytest.raises(ValueError, match="no valid strategy for world size 7"):
        plan(Workload(ModelCosts.uniform(4), 8), "8xV100-PCIe", Budget(world_size=7))
    with pytest.raises(ValueError, match="uses 4 devices, not the world size 8"):
        plan(Workload(COSTS, 64), "8xV100-PCIe", options=SearchOptions(strategies=["dp4"]))
    with pytest.raises(ValueError, match="profile a zoo model first"):
        plan(Workload("vgg16", 64), "8xV100-PCIe")


@pytest.mark.slow
def test_strategy_names_in_plans_parse_back():
    result = plan(Workload(COSTS, 64), "2x8xH100-IB", options=SearchOptions(top=20))
    assert len(result.plans) == 20 and [p.rank for p in result.plans] == list(range(1, 21))
    for p in result.plans:
        assert ParallelPlan.parse(p.name) == p.plan
    assert json.loads(json.dumps(result.to_dict(), default=str))["best"] == result.best.name


def test_cli_ranks_strategies_as_json(tmp_path, capsys):
    from workbench.cli import main

    path = COSTS.save(tmp_path / "costs.json")
    assert main(["plan", str(path), "--cluster", "8xV100-PCIe", "--batch", "64", "--top", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["rank"] for s in data["strategies"]] == [1, 2, 3] and data["best"] == data["strategies"][0]["name"]
    for s in data["strategies"]:
        assert ParallelPlan.parse(s["name"]).world_size == 8
        assert s["compute_ms"] + s["bubble_ms"] + s["exposed_comm_ms"] == pytest.approx(s["iteration_ms"])
    assert main(["plan", str(path), "--cluster", "8xV100-PCIe", "--batch", "64", "--memory-cap", "0.001"]) == 2
    assert "closest is" in capsys.readouterr().err
    assert main(["plan", str(path), "--cluster", "8xV100-PCIe", "--batch", "0"]) == 2
    assert "--batch must be an int >= 1" in capsys.readouterr().err
    assert main(["plan", "no-such-model", "--cluster", "8xV100-PCIe", "--batch", "8"]) == 2
    assert "neither a ModelCosts JSON file nor a zoo model" in capsys.readouterr().err


def test_time_sharing_on_a_shared_cpu_node():
    from workbench.planning.costs.clusters import time_sharing_slowdown

    assert time_sharing_slowdown(4, 2) == pytest.approx(2.0)  # idle machine: 4 processes on 2 cores
    assert time_sharing_slowdown(2, 2) == pytest.approx(1.0)
    assert time_sharing_slowdown(4, 2, background_load=14) == pytest.approx(18 / 15)  # a crowded machine
    idle = plan(Workload(COSTS, 16), "local-cpu", Budget(world_size=4), SearchOptions(strategies=["dp4"])).best.estimate
    crowded = plan(Workload(COSTS, 16), "local-cpu", Budget(world_size=4),
                   SearchOptions(strategies=["dp4"], background_load=14)).best.estimate
    assert crowded.compute_ms < idle.compute_ms
    with pytest.raises(ValueError, match="background_load must be a number >= 0"):
        plan(Workload(COSTS, 16), "local-cpu", Budget(world_size=4), SearchOptions(background_load=-1))


def test_local_cluster_reads_its_calibration(tmp_path, monkeypatch):
    from workbench.core.costs import LinkSpec
    from workbench.planning.costs import clusters

    monkeypatch.setattr(clusters, "LOCAL_CALIBRATION", tmp_path / "local.json")
    default = clusters.load_cluster("local")
    assert default.shared_compute and default.overlap_slowdown == clusters.LOCAL_OVERLAP_SLOWDOWN
    clusters.save_local_calibration(LinkSpec("measured-p2p", 50.0, 3.0), LinkSpec("measured-ar", 80.0, 0.9), 1.2)
    cluster = clusters.load_cluster("local")
    assert cluster.intra_node.bandwidth_gbs == 3.0 and cluster.collective_link.bandwidth_gbs == 0.9
    assert cluster.overlap_slowdown == 1.2
    (tmp_path / "local.json").write_text("{")
    with pytest.raises(ValueError, match="local cluster calibration .* is unreadable"):
        clusters.load_cluster("local")


def test_local_pipelines_share_the_cores_by_what_runs_at_once():
    """On the shared 2 cores data parallelism (all ranks busy) is stretched more than a pipeline (bubble)."""
    costs = ModelCosts.uniform(16, forward_ms=1.0, backward_ms=2.0, param_bytes=0, activation_bytes=1000, batch_size=8)
    dp = plan(Workload(costs, 16), "local-cpu", Budget(world_size=4), SearchOptions(strategies=["dp4"])).best.estimate
    pp = plan(Workload(costs, 16), "local-cpu", Budget(world_size=4),
              SearchOptions(strategies=["pp4-1f1b-m4"])).best.estimate
    dp_slow, pp_slow = dp.sim.metrics["sharing_slowdown"], pp.sim.metrics["sharing_slowdown"]
    assert all(s == pytest.approx(2.0, rel=0.02) for s in dp_slow), dp_slow
    assert all(1.0 < s < 1.9 for s in pp_slow), pp_slow


@pytest.mark.parametrize("name, steps_per_call", [("tp2d-2x2-dp1", 1), ("tp1d-4-dp1", 6)])
def test_tensor_parallel_pays_for_every_step_of_every_collective_call(name, steps_per_call):
    # 2D: broadcasts / reduces within a row or column of q = 2 ranks (q - 1 = 1 step); 1D: ring all-reduces among
    # P = 4 ranks (2 (P - 1) = 6 steps)
    from workbench.planning.costs.clusters import shared_cores

    cluster = load_cluster("local-cpu")
    assert cluster.collective_call_ms > 0
    free = replace(cluster, collective_call_ms=0.0)
    crowded = 2 * shared_cores(cluster)  # other work enough that every step waits its whole measured cost
    charged = plan(Workload(COSTS, 16, shape=GPT), cluster, Budget(world_size=4),
                   SearchOptions(strategies=[name], background_load=crowded)).best.estimate
    uncharged = plan(Workload(COSTS, 16, shape=GPT), free, Budget(world_size=4),
                     SearchOptions(strategies=[name], background_load=crowded)).best.estimate
    calls = charged.detail["collective_calls"]
    assert calls > (100 if name.startswith("tp2d") else 10)
    assert charged.iteration_ms - uncharged.iteration_ms == pytest.approx(
        calls * steps_per_call * cluster.collective_call_ms, rel=1e-6)
    with pytest.raises(ValueError, match="collective_call_ms must be in"):
        replace(cluster, collective_call_ms=-1.0)


def test_collective_steps_wait_only_when_the_cores_are_oversubscribed(monkeypatch):
    from importlib import import_module

    from workbench.planning.costs import clusters

    estimate = import_module("workbench.planning.costs.estimate")  # the module: the package exports a function by its name

    assert [clusters.collective_wait_fraction(r, 2, b) for r, b in [(2, 0), (3, 0), (4, 0), (2, 1), (8, 0)]] == [
        0.0, 0.5, 1.0, 0.5, 1.0]
    monkeypatch.setattr(estimate, "shared_cores", lambda cluster: 2 if cluster.shared_compute else None)
    cluster = load_cluster("local-cpu")
    free = replace(cluster, collective_call_ms=0.0)

    def step(c, world, background):
        return plan(Workload(COSTS, 16, shape=GPT), c, Budget(world_size=world),
                    SearchOptions(strategies=[f"tp1d-{world}-dp1"], background_load=background)).best.estimate

    # 2 ranks on 2 idle cores: no step waits; with 2 other runnable processes every step waits the whole cost
    assert step(cluster, 2, 0.0).iteration_ms == pytest.approx(step(free, 2, 0.0).iteration_ms)
    crowded, crowded_free = step(cluster, 2, 2.0), step(free, 2, 2.0)
    assert crowded.iteration_ms - crowded_free.iteration_ms == pytest.approx(
        crowded.detail["collective_calls"] * 2 * cluster.collective_call_ms, rel=1e-6)  # 2 (P - 1) = 2 steps a call
    # 4 ranks on 3 cores: one process queued for a core, a third of it
    monkeypatch.setattr(estimate, "shared_cores", lambda cluster: 3 if cluster.shared_compute else None)
    four, four_free = step(cluster, 4, 0.0), step(free, 4, 0.0)
    assert four.iteration_ms - four_free.iteration_ms == pytest.approx(
        four.detail["collective_calls"] * 6 * cluster.collective_call_ms / 3, rel=1e-6)


def test_gpu_presets_slow_compute_that_overlaps_collectives():
    """Datasheet GPU presets charge the overlap slowdown; data parallelism's overlapped all-reduce costs more for it."""
    from workbench.planning.costs import clusters

    v100 = clusters.get_cluster("8xV100-PCIe")
    assert v100.device.name == "V100-PCIe" and v100.device.tflops() < clusters.get_cluster("4xV100-NVLink").device.tflops()
    for name in ("8xV100-PCIe", "4xV100-NVLink", "8xA100-NVLink", "2x8xH100-IB"):
        assert clusters.get_cluster(name).overlap_slowdown == clusters.DATASHEET_OVERLAP_SLOWDOWN > 1
    costs = ModelCosts.uniform(16, forward_ms=2.0, backward_ms=4.0, param_bytes=10_000_000, activation_bytes=2_000_000,
                               batch_size=8)
    slowed = plan(Workload(costs, 64), v100, options=SearchOptions(strategies=["dp8"]))["dp8"].estimate
    plain = plan(Workload(costs, 64), replace(v100, overlap_slowdown=1.0),
                 options=SearchOptions(strategies=["dp8"]))["dp8"].estimate
    # each layer's 10 MB of gradients takes ~1.8 ms on the ring, within the next layer's 4 ms backward: the
    # backward that runs beside an all-reduce is slowed, so the step is, though little communication is exposed
    assert plain.exposed_comm_ms < 6.0 and slowed.exposed_comm_ms < 6.0  # the last 25 MB bucket
    assert slowed.compute_ms > plain.compute_ms * 1.03 and slowed.iteration_ms > plain.iteration_ms * 1.03
    assert slowed.compute_ms + slowed.exposed_comm_ms == pytest.approx(slowed.iteration_ms, rel=1e-6)


def test_cli_builds_a_zoo_model_with_model_args(tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    layers = {}
    for n_layer in (2, 3):
        assert main(["plan", "gpt2-tiny", "--cluster", "local-cpu", "--batch", "8", "--world-size", "2",
                     "--strategies", "dp2,tp1d-2-dp1", "--model-arg", f"n_layer={n_layer}", "--model-arg",
                     "n_embd=32", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert {s["name"] for s in out["strategies"]} == {"dp2", "tp1d-2-dp1"}
        layers[n_layer] = len(list(tmp_path.glob("gpt2-tiny-*.json")))
    assert layers == {2: 1, 3: 2}  # two different models were profiled (each at micro-batches of 1, 4 and 8)
    for args, message in [(["--model-arg", "n_layers=3"], "unknown config keys ['n_layers'] for model 'gpt2-tiny'"),
                          (["--model-arg", "n_layer"], "--model-arg takes KEY=VALUE")]:
        assert main(["plan", "gpt2-tiny", "--cluster", "local-cpu", "--batch", "8", *args]) == 2
        assert message in capsys.readouterr().err
    path = COSTS.save(tmp_path / "costs.json")
    assert main(["plan", str(path), "--cluster", "local-cpu", "--batch", "8", "--model-arg", "n_layer=3"]) == 2
    assert "--model-arg applies to a zoo model" in capsys.readouterr().err



@pytest.mark.parametrize(("name", "words"), [("pp8-gpipe-m1", "(gpipe, 1 micro-batch)"),
                                             ("pp8-1f1b-m8", "(1f1b, 8 micro-batches)")])
def test_a_memory_refusal_names_the_schedule_kind_and_counts_micro_batches_in_english(name, words):
    from workbench.planning.partitioning.ampa import ampa
    from workbench.scheduling.registry import stage_memory

    p = ParallelPlan.parse(name)
    with pytest.raises(ValueError, match="fits the memory cap") as refused:
        ampa(COSTS, p.pp, num_microbatches=p.microbatches, schedule=stage_memory(p), memory_cap_bytes=1000)
    assert words in str(refused.value)
