"""ParallelPlan: typed, validated at construction, and one value through name, dict and TOML."""

import json
import tomllib

import pytest

from workbench.core.config import RunConfig, runs_layer_by_layer
from workbench.core.plan import (AsyncPipeline, GPipe, GroPipe, Interleaved, LayerPlan, NoPipeline, OneFOneB,
                                 ParallelPlan, TorchPipelining)
from workbench.core.topology import Topology
from workbench.planning.strategy.space import enumerate_strategies
from workbench.scheduling import generators, zero_bubble
from workbench.scheduling.registry import schedule_for, stage_memory
from workbench.scheduling.memory import in_flight_by_stage

NAMES = ["dp8", "dp4-m2", "pp4-1f1b-m8", "pp4-gpipe-m8", "pp4-interleaved-v2-m8", "gropipe-2x4-1f1b-m8-d1",
         "gropipe-4x2-gpipe-m4-d0-rc", "async-2x4-m8", "async-1x4-m4-2bw-if3", "async-1x2-m4-nostash-cap64",
         "async-1x3-m4-vsync-if3.2.1", "torchpp2-1f1b-m4", "tp2d-2x2-dp2", "tp1d-4-dp2", "dp2-fsdp", "dp2-zero2-rc",
         "pp2-1f1b-m4-L[0-3=ddp.rc;4-9=fsdp]", "pp2-1f1b-m4@0-2|3-4", "pp2-gpipe-m4-rc@ampa",
         "pp2-1f1b-m4-tp1d2-fsdp", "pp2-1f1b-m4-tp1d2-L[0-1=fsdp.tp1d2;2-3=ddp]"]


def _through_toml(plan: ParallelPlan) -> ParallelPlan:
    batch = plan.dp * plan.microbatches * plan.q
    config = RunConfig(model="mlp", plan=plan, training={"global_batch": batch}) \
        if plan.is_uniform and plan.layer.dp == "replicate" \
        and (plan.tp == 1 or isinstance(plan.pipeline, NoPipeline)) and not (plan.tp > 1 and plan.recompute) else None
    if config is not None:
        assert RunConfig.from_dict(tomllib.loads(config.to_toml())) == config
    from workbench.core.config import to_toml
    return ParallelPlan.from_dict(tomllib.loads(to_toml({"plan": plan.to_dict()}))["plan"])


@pytest.mark.parametrize("name", NAMES)
def test_names_dicts_and_toml_round_trip(name):
    plan = ParallelPlan.parse(name)
    assert plan.name == name
    assert ParallelPlan.parse(plan.name) == plan
    assert ParallelPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert _through_toml(plan) == plan


@pytest.mark.parametrize("world, kw", [
    (8, dict(num_layers=24, global_batch=64, num_heads=12, hidden=768, recompute_options=(False, True))),
    (4, dict(num_layers=10, global_batch=32, recompute_options=(False, True))),
    (6, dict(num_layers=12, global_batch=48, num_heads=6, hidden=96)),
])
def test_every_plan_the_planner_can_emit_round_trips(world, kw):
    plans = enumerate_strategies(world, **kw)
    assert len(plans) > 20
    for plan in plans:
        assert ParallelPlan.parse(plan.name) == plan
        assert ParallelPlan.from_dict(plan.to_dict()) == plan
        assert _through_toml(plan) == plan
        with_cut = plan.replace(partition="ampa")
        assert ParallelPlan.parse(with_cut.name) == with_cut


def test_planner_plans_with_partitions_and_per_layer_recompute_round_trip():
    from dataclasses import replace

    from workbench.core.costs import LayerCost, ModelCosts
    from workbench.planning import Budget, SearchOptions, Workload, plan

    # each layer saves 5x its output for the backward pass; recomputing it keeps only the output
    layer = LayerCost("l", 1.0, 2.0, param_bytes=10_000_000, activation_bytes=40_000_000, saved_bytes=200_000_000)
    big = ModelCosts("big", 8, "synthetic", tuple(replace(layer, name=f"l{i}") for i in range(8)))
    result = plan(Workload(big, 32), "8xV100-PCIe", Budget(memory_cap_gib=1.2, world_size=4),
                  SearchOptions(kinds=("pipeline",), recompute=(False,), fine_grained=True))
    per_layer = [p for p in result.plans if not p.plan.is_uniform and "recompute_layers" in p.estimate.detail]
    assert per_layer, "the fine-grained search found no per-layer recompute plan"
    for p in result.plans:
        emitted = p.plan.replace(partition=str(p.estimate.partition)) if p.plan.pp > 1 else p.plan
        assert ParallelPlan.parse(emitted.name) == emitted
        assert _through_toml(emitted) == emitted
    chosen = per_layer[0].plan
    assert [l.recompute for l in chosen.layers] == [i in per_layer[0].estimate.detail["recompute_layers"]
                                                    for i in range(8)]
    assert runs_layer_by_layer(per_layer[0].to_config().plan)  # the layer-by-layer runtime takes it


def test_schedule_is_the_generators_own_value():
    assert schedule_for(ParallelPlan.parse("pp3-1f1b-m4")) == generators.one_f_one_b(3, 4)
    assert schedule_for(ParallelPlan.parse("pp3-gpipe-m4")) == generators.gpipe(3, 4)
    assert schedule_for(ParallelPlan.parse("pp2-interleaved-v2-m4")) == generators.interleaved(2, 4, 2)
    assert schedule_for(ParallelPlan.parse("gropipe-2x2-gpipe-m4-d1"), first_iteration=2, num_iterations=2) == \
        generators.gropipe(2, 2, 4, inner="gpipe", delay=1, first_iteration=2, num_iterations=2)
    assert schedule_for(ParallelPlan.parse("async-2x3-m4-2bw"), num_iterations=3) == \
        generators.async_1f1b(3, 4, 3, mode="2bw", num_groups=2)
    assert schedule_for(ParallelPlan.parse("dp4"), num_buckets=3) == generators.data_parallel(4, 3)
    assert schedule_for(ParallelPlan.parse("tp2d-2x2-dp1"), num_layers=2) == generators.tensor2d_step(2, 2)
    assert schedule_for(ParallelPlan.parse("pp4-zbh1-m8")) == zero_bubble.zb_h1(4, 8)
    assert schedule_for(ParallelPlan.parse("torchpp2-zbv-m4")) == zero_bubble.zb_v(2, 4)


def test_stage_memory_comes_from_the_schedule_walk():
    for name in ("pp4-1f1b-m8", "pp4-gpipe-m8", "gropipe-2x3-1f1b-m6-d0", "pp3-zbh2-m6", "pp2-zbv-m4"):
        plan = ParallelPlan.parse(name)
        walked = in_flight_by_stage(schedule_for(plan))
        assert stage_memory(plan).in_flight == tuple(walked[s] for s in range(plan.num_virtual_stages))
    assert stage_memory(ParallelPlan.parse("pp4-1f1b-m8")).in_flight == (4, 3, 2, 1)
    assert stage_memory(ParallelPlan.parse("pp4-gpipe-m8")).in_flight == (8, 8, 8, 8)
    # GroPipe's groups keep what their inner schedule keeps; torch's schedules what the kind of that name keeps
    assert stage_memory(ParallelPlan.parse("gropipe-2x3-zbh1-m6-d1")) == stage_memory(ParallelPlan.parse("pp3-zbh1-m6"))
    assert stage_memory(ParallelPlan.parse("torchpp2-1f1b-m4")) == stage_memory(ParallelPlan.parse("pp2-1f1b-m4"))


def test_stage_memory_walks_one_replica_and_keeps_what_every_replica_keeps():
    from workbench.scheduling.registry import _steady_iterations, _walk_memory

    for name in ("gropipe-3x2-1f1b-m4-d1", "gropipe-2x3-gpipe-m2-d0", "gropipe-4x2-zbh1-m4-d1", "async-3x3-m2",
                 "async-2x4-m4-2bw", "gropipe-2x2-zbh2-m4-d1"):
        plan = ParallelPlan.parse(name)
        full = schedule_for(plan, num_iterations=_steady_iterations(plan.pipeline, plan.pp, plan.microbatches))
        assert stage_memory(plan) == _walk_memory(full, plan.num_virtual_stages), name


def test_closed_forms_and_groups_keep_what_the_schedule_walk_keeps():
    from workbench.scheduling.registry import _steady_iterations, _walk_memory

    for stages in range(1, 7):
        for m in range(1, 11):
            names = [f"pp{stages}-{kind}-m{m}" for kind in ("1f1b", "gpipe", "zbh1", "zbh2")] if stages > 1 else []
            names += [f"gropipe-2x{stages}-{inner}-m{m}-d{d}" for inner in ("1f1b", "gpipe", "zbh1", "zbh2")
                      for d in (0, 1) if stages > 1 or inner in ("1f1b", "gpipe")]
            for name in names:
                plan = ParallelPlan.parse(name)
                walked = schedule_for(plan, num_iterations=_steady_iterations(plan.pipeline, plan.pp, m))
                assert stage_memory(plan) == _walk_memory(walked, plan.num_virtual_stages), name


def test_the_pipeline_is_a_tagged_union_with_its_own_fields():
    plan = ParallelPlan.from_dict({"mesh": {"dp": 2, "pp": 2}, "microbatches": 4,
                                   "pipeline": {"kind": "gropipe", "inner": "gpipe", "delay": 1}})
    assert plan.pipeline == GroPipe(inner="gpipe", delay=1) and plan.name == "gropipe-2x2-gpipe-m4-d1"
    with pytest.raises(ValueError, match=r"'pipeline.delay' = 1 is invalid: pipeline kind '1f1b' has no such field"):
        ParallelPlan.from_dict({"mesh": {"pp": 2}, "pipeline": {"kind": "1f1b", "delay": 1}})
    with pytest.raises(ValueError, match=r"'pipeline.kind' = 'zero-bubble' is invalid"):
        ParallelPlan.from_dict({"mesh": {"pp": 2}, "pipeline": {"kind": "zero-bubble"}})
    assert {type(p) for p in (GPipe(), OneFOneB(), Interleaved(), AsyncPipeline(), TorchPipelining(),
                              NoPipeline())} == {GPipe, OneFOneB, Interleaved, AsyncPipeline, TorchPipelining,
                                                 NoPipeline}


@pytest.mark.parametrize("build, field", [
    (lambda: ParallelPlan(Topology(dp=2, pp=2), OneFOneB(), 4), "mesh.dp"),
    (lambda: ParallelPlan(Topology(dp=1, pp=2), NoPipeline()), "mesh.pp"),
    (lambda: ParallelPlan(Topology(dp=1, pp=1), AsyncPipeline(), 4), "mesh.pp"),
    (lambda: ParallelPlan(Topology(dp=1, pp=4), Interleaved(chunks=2), 6), "microbatches"),
    (lambda: ParallelPlan(Topology(dp=1, pp=4), AsyncPipeline(mode="2bw"), 2), "microbatches"),
    (lambda: ParallelPlan(Topology(dp=1, pp=2), OneFOneB(), 4, "0-1|2-3|4-5"), "partition"),
    (lambda: ParallelPlan(Topology(dp=1, pp=2), OneFOneB(), 0), "microbatches"),
    (lambda: ParallelPlan(Topology(dp=2, tp_row=2, tp_col=3)), "mesh"),
    (lambda: ParallelPlan(Topology(dp=2, zz=2)), "mesh"),
    (lambda: ParallelPlan(Topology(dp=2), layers=(LayerPlan(tp="1d", tp_degree=2),)), "layers[0].tp"),
    (lambda: ParallelPlan(Topology(dp=1, tp=4), layers=(LayerPlan(tp="1d", tp_degree=3),)), "layers[0].tp_degree"),
    (lambda: LayerPlan(dp="zero3"), "layers.dp"),
    (lambda: LayerPlan(tp="2d", tp_degree=2), "layers.tp_degree"),
    (lambda: AsyncPipeline(mode="2bw", stash=False), "pipeline.stash"),
    (lambda: AsyncPipeline(inflight=0), "pipeline.inflight"),
    (lambda: Interleaved(chunks=1), "pipeline.chunks"),
    (lambda: GroPipe(inner="interleaved"), "pipeline.inner"),
])
def test_every_error_names_its_field(build, field):
    with pytest.raises(ValueError, match=rf"plan field '{field.replace('[', '.').replace(']', '.')}'"):
        build()


def test_layer_plans_resolve_per_layer():
    uniform = ParallelPlan.parse("pp2-1f1b-m4-rc")
    assert uniform.is_uniform and uniform.recompute and uniform.layers_for(3) == (LayerPlan(recompute=True),) * 3
    mixed = ParallelPlan.parse("pp2-1f1b-m4-L[0-1=ddp.rc;2=fsdp]")
    assert not mixed.is_uniform and not mixed.recompute
    assert [l.text for l in mixed.layers_for(3)] == ["ddp.rc", "ddp.rc", "fsdp"]
    with pytest.raises(ValueError, match="the model has 5 layers"):
        mixed.layers_for(5)
    with pytest.raises(ValueError, match="consecutive from layer 0"):
        ParallelPlan.parse("pp2-1f1b-m4-L[1-2=ddp]")


def test_old_flat_config_keys_say_where_they_moved():
    for key, value in (("strategy", "gropipe"), ("groups", 2), ("stages", 2), ("delay", 1), ("recompute", True)):
        with pytest.raises(ValueError, match=rf"config field '{key}' has moved into the parallel plan"):
            RunConfig.from_dict({"model": "mlp", "plan": "dp1", key: value})


def test_the_runtime_refuses_what_it_cannot_run_before_launch():
    for name, message in (("tp2d-2x2-dp1-fsdp", "sharded data parallelism"),
                          ("gropipe-2x2-1f1b-m4-d0-L[0=ddp.rc;1-3=ddp]", "per-layer"),
                          ("gropipe-2x2-1f1b-m4-d0-tp1d2", "tensor parallelism inside a pipeline"),
                          ("tp2d-2x2-dp1-rc", "does not recompute")):
        with pytest.raises(ValueError, match=message):
            RunConfig(model="gpt2-tiny", plan=name, training={"global_batch": 8})


def test_strategy_names_live_only_in_the_plan_module():
    """No module but the kind's spec (``core/pipelines/``) and its registry line spells a pipeline kind as a
    string constant: the rest ask the plan, its spec or its schedule."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "workbench"
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ("core/plan.py", "scheduling/registry.py") or rel.startswith("core/pipelines/"):
            continue
        tree = ast.parse(path.read_text())
        exported = {id(e) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                    for e in ast.walk(node.value)}  # ``__all__`` names the generator function, not a strategy
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "gropipe" and id(node) not in exported:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []


def test_layer_consecutive_flag_round_trips_through_name_and_dict():
    strided = LayerPlan(tp="1d", tp_degree=2, consecutive=False)
    assert strided.text == "ddp.tp1d2.strided"
    assert LayerPlan.parse("ddp.tp1d2.strided") == strided
    plan = ParallelPlan.parse("dp2-tp1d2-L[0-1=ddp.tp1d2.strided;2-3=fsdp]")
    assert plan.layers[0] == strided and plan.layers[2] == LayerPlan(dp="fsdp")
    assert ParallelPlan.parse(plan.name) == plan
    assert ParallelPlan.from_dict(plan.to_dict()) == plan
    ranges = plan.to_dict()["layers"]
    assert ranges[0]["consecutive"] is False and "consecutive" not in ranges[1]
    with pytest.raises(ValueError, match="layers.consecutive"):
        LayerPlan(consecutive=False)


def test_plain_layers_on_a_tensor_parallel_mesh_round_trip_through_the_table():
    # the stage is one 2-rank tensor-parallel unit, every layer data-parallel over it
    plan = ParallelPlan.parse("pp2-1f1b-m4-tp1d2-L[all=ddp]")
    assert plan.layers == (LayerPlan(),) and plan.tp == 2
    assert ParallelPlan.from_dict(plan.to_dict()) == plan
    assert ParallelPlan.from_dict(tomllib.loads(_toml_of(plan))["plan"]) == plan


def _toml_of(plan):
    from workbench.core.config import to_toml

    return to_toml({"plan": plan.to_dict()})
