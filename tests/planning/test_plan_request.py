"""The planner's question as typed values: Workload, Budget and SearchOptions check their fields when made,
keep sequences as tuples, and plan() takes nothing else."""

from dataclasses import FrozenInstanceError, replace

import pytest

from workbench.core.costs import ModelCosts
from workbench.core.plan import ParallelPlan
from workbench.planning import (Budget, RuntimeCalibration, SearchOptions, TransformerShape, Workload, get_cluster,
                                plan)
from workbench.planning.strategy.space import STRATEGY_KINDS

COSTS = ModelCosts.uniform(8, forward_ms=1.0, backward_ms=2.0, param_bytes=4_000_000, activation_bytes=1_000_000,
                           batch_size=8)
GPT = TransformerShape(hidden=256, heads=8, layers=8, vocab=1000, positions=256, batch=8, seq=64)


@pytest.mark.parametrize("make, message", [
    (lambda: Workload(COSTS, 0), r"Workload\.global_batch must be an int >= 1, got 0"),
    (lambda: Workload(COSTS, 8.0), r"Workload\.global_batch must be an int >= 1, got 8\.0"),
    (lambda: Workload(COSTS, True), r"Workload\.global_batch must be an int >= 1, got True"),
    (lambda: Workload("vgg16", 8), r"Workload\.costs must be a ModelCosts or a ModelCosts JSON file, got 'vgg16'"),
    (lambda: Workload(COSTS, 8, shape={"hidden": 256}), r"Workload\.shape must be a TransformerShape or None"),
    (lambda: Workload(COSTS, 8, optimizer="adamw"), r"Workload\.optimizer must be one of \['adam', 'sgd', "),
    (lambda: Budget(memory_cap_gib=0), r"Budget\.memory_cap_gib must be a number > 0 \(GiB per device\), got 0"),
    (lambda: Budget(memory_cap_gib="16"), r"Budget\.memory_cap_gib must be a number > 0"),
    (lambda: Budget(world_size=0), r"Budget\.world_size must be an int >= 1 or None, got 0"),
    (lambda: SearchOptions(kinds=("dp", "zero")), r"SearchOptions\.kinds must be some of"),
    (lambda: SearchOptions(kinds=()), r"SearchOptions\.kinds must be some of"),
    (lambda: SearchOptions(recompute=(0,)), r"SearchOptions\.recompute must be one or both of False, True"),
    (lambda: SearchOptions(microbatch_options=[4, 0]), r"SearchOptions\.microbatch_options must be ints >= 1"),
    (lambda: SearchOptions(pipeline_degrees=[]), r"SearchOptions\.pipeline_degrees must be ints >= 1, got \[\]"),
    (lambda: SearchOptions(strategies=[8]), r"SearchOptions\.strategies must be plan names or ParallelPlans"),
    (lambda: SearchOptions(strategies=["dp4", "nonsense"]), r"nonsense"),
    (lambda: SearchOptions(fine_grained=1), r"SearchOptions\.fine_grained must be true or false, got 1"),
    (lambda: SearchOptions(simulate_top=-1), r"SearchOptions\.simulate_top must be an int >= 0, got -1"),
    (lambda: SearchOptions(top=0), r"SearchOptions\.top must be an int >= 1 or None, got 0"),
    (lambda: SearchOptions(background_load=-0.5), r"SearchOptions\.background_load must be a number >= 0"),
    (lambda: SearchOptions(calibration=[1.5]), r"SearchOptions\.calibration must be RuntimeCalibrations or run "),
])
def test_a_wrong_field_is_refused_in_one_line_naming_it(make, message):
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


def test_values_are_frozen_normalised_and_comparable(tmp_path):
    options = SearchOptions(kinds=["dp", "pipeline"], recompute=[False], microbatch_options=[4, 8],
                            pipeline_degrees=2, strategies=["dp4", ParallelPlan.parse("pp4-1f1b-m4")],
                            calibration="runs/a")
    assert options.kinds == ("dp", "pipeline") and options.recompute == (False,)
    assert options.microbatch_options == (4, 8) and options.pipeline_degrees == (2,)
    assert options.strategies == (ParallelPlan.parse("dp4"), ParallelPlan.parse("pp4-1f1b-m4"))
    assert options.calibration == ("runs/a",)
    assert options == SearchOptions(kinds=("dp", "pipeline"), recompute=(False,), microbatch_options=(4, 8),
                                    pipeline_degrees=(2,), strategies=("dp4", "pp4-1f1b-m4"), calibration=["runs/a"])
    assert replace(options, top=3).strategies == options.strategies  # made again from its own fields: unchanged
    with pytest.raises(FrozenInstanceError):
        options.top = 3
    assert SearchOptions(calibration=[]).calibration == ()  # no runs, unlike None: the profile's passes
    assert SearchOptions().kinds == STRATEGY_KINDS and SearchOptions().recompute == (False, True)
    path = COSTS.save(tmp_path / "costs.json")
    assert Workload(path, 16).costs == COSTS and Workload(str(path), 16) == Workload(COSTS, 16)


def test_the_budget_counts_the_devices_of_the_cluster():
    cluster = get_cluster("8xV100-PCIe")
    assert Budget().devices(cluster) == 8 and Budget(world_size=4).devices(cluster) == 4
    with pytest.raises(ValueError, match="world_size=16 is more devices than cluster '8xV100-PCIe' has"):
        Budget(world_size=16).devices(cluster)
    assert Budget(memory_cap_gib=1.5).memory_cap_bytes == int(1.5 * 2**30) and Budget().memory_cap_bytes is None


def test_plan_takes_only_the_typed_values():
    with pytest.raises(ValueError, match="plan\\(\\) workload must be a Workload, got ModelCosts"):
        plan(COSTS, "8xV100-PCIe", 16)
    with pytest.raises(ValueError, match="plan\\(\\) budget must be a Budget, got dict"):
        plan(Workload(COSTS, 16), "8xV100-PCIe", {"world_size": 4})
    with pytest.raises(ValueError, match="plan\\(\\) options must be a SearchOptions, got NoneType"):
        plan(Workload(COSTS, 16), "8xV100-PCIe", Budget(), None)


def test_equal_questions_give_equal_answers():
    """Names or ParallelPlans, lists or tuples, a preset's name or its ClusterSpec: one question, one answer."""
    names = ["dp4", "pp4-1f1b-m4", "gropipe-2x2-1f1b-m4-d1", "tp1d-4-dp1"]
    a = plan(Workload(COSTS, 16, shape=GPT), "8xV100-PCIe", Budget(world_size=4), SearchOptions(strategies=names))
    b = plan(Workload(COSTS, 16, shape=GPT), get_cluster("8xV100-PCIe"), Budget(world_size=4),
             SearchOptions(strategies=tuple(ParallelPlan.parse(n) for n in names)))
    assert [(p.name, p.estimate.iteration_ms, p.estimate.memory_bytes) for p in a.plans] == \
        [(p.name, p.estimate.iteration_ms, p.estimate.memory_bytes) for p in b.plans]
    assert a.notes == b.notes and a.infeasible == b.infeasible and len(a.plans) == len(names)


def test_the_options_shape_the_search():
    workload, budget = Workload(COSTS, 16), Budget(world_size=4)
    everything = plan(workload, "8xV100-PCIe", budget, SearchOptions(recompute=(False,)))
    pipelines = plan(workload, "8xV100-PCIe", budget, SearchOptions(kinds=("pipeline", "gropipe"), recompute=(False,),
                                                                    pipeline_degrees=(2,), top=3, simulate_top=1))
    assert {p.plan.family for p in everything.plans} > {"pipeline", "gropipe"}
    assert len(pipelines.plans) == 3
    assert all(p.plan.family in ("pipeline", "gropipe") and p.plan.pp == 2 for p in pipelines.plans)
    assert sum(p.estimate.method == "simulated" for p in pipelines.plans) <= 1
    assert any("only pipeline degree 2 considered" in n for n in pipelines.notes)
    cal = RuntimeCalibration(2.0, 10, 20.0, 10.0)
    calibrated = plan(workload, "8xV100-PCIe", budget, SearchOptions(strategies=["dp4"], calibration=cal))
    scaled = plan(Workload(cal.apply(COSTS), 16), "8xV100-PCIe", budget, SearchOptions(strategies=["dp4"]))
    assert calibrated.best.estimate.iteration_ms == pytest.approx(scaled.best.estimate.iteration_ms)


def test_the_package_and_the_workbench_export_them():
    import workbench

    assert (workbench.Workload, workbench.Budget, workbench.SearchOptions) == (Workload, Budget, SearchOptions)
