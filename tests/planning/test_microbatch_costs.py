"""Plans charged at the micro-batch their ranks run (a profile's batch fit), and fewer ranks where ranks share cores."""

from dataclasses import replace

import pytest

from workbench.core.batch_fit import fit_profiles
from workbench.core.costs import ClusterSpec, DeviceSpec, LinkSpec, ModelCosts
from workbench.core.plan import ParallelPlan
from workbench.planning import Budget, SearchOptions, Workload, plan
from workbench.planning.costs.compute_scaling import profiled_compute_models
from workbench.planning.costs.estimate import cost_context, estimate
from workbench.planning.strategy.world_sizes import microbatch_range, smaller_world_sizes

# A device with its own compute per rank, free links and no overlap slowdown: a plan's time is its compute.
FAST = ClusterSpec("fast", 1, 4, DeviceSpec("d", {"float32": 100.0}, 64 * 2**30, 1e4), LinkSpec("l", 0.0, 1e4))


def _profile(batch: int, times: list[tuple[float, float]]) -> ModelCosts:
    base = ModelCosts.uniform(len(times), batch_size=batch, activation_bytes=64 * batch, model="toy")
    return replace(base, layers=tuple(replace(l, forward_ms=f, backward_ms=b) for l, (f, b) in zip(base.layers, times)))


def _fitted() -> ModelCosts:
    """Four layers, weight-bound: 2 + 0.05 ms a sample forward, twice that backward (profiles at 1 and 32)."""
    return fit_profiles([_profile(1, [(2.05, 4.1)] * 4), _profile(32, [(3.6, 7.2)] * 4)])


@pytest.mark.parametrize("m", [2, 8])
def test_two_plans_differing_only_in_micro_batches_are_charged_the_fit_at_each(m):
    costs = _fitted()
    ctx = cost_context(costs, FAST, 32, world_size=2)
    strategy = ParallelPlan.parse(f"pp2-gpipe-m{m}")
    mb = 32 // m
    per_layer = costs.batch_fit.layer_ms(0, mb)
    assert per_layer == pytest.approx((2 + 0.05 * mb, 4 + 0.1 * mb))  # the fit: a + b * samples
    charged = ctx.model_costs(False, strategy, mb)
    assert [t for l in charged.layers for t in (l.forward_ms, l.backward_ms)] == pytest.approx(list(per_layer) * 4)
    e = estimate(ctx, strategy)
    # the busiest stage holds two layers and runs m micro-batches, each at the fitted time of its size
    assert e.compute_ms == pytest.approx(m * 2 * sum(per_layer), rel=1e-6)
    linear = m * 2 * (3.6 + 7.2) * mb / 32  # what scaling the 32-sample profile linearly charged
    assert e.compute_ms > linear


def test_without_a_fit_plans_are_charged_linearly_as_before():
    costs = _profile(32, [(3.6, 7.2)] * 4)
    e = estimate(cost_context(costs, FAST, 32, world_size=2), ParallelPlan.parse("pp2-gpipe-m8"))
    assert e.compute_ms == pytest.approx(8 * 2 * (3.6 + 7.2) / 8)


def test_micro_batch_passes_are_set_against_the_fit():
    costs = _fitted()
    # passes over 8 samples: one micro-batch of 8 ran at 1.1x the 8-sample profile, eight of 1 sample at 10x
    at8, at1 = (sum(sum(t) for t in costs.batch_fit.times_ms(b)) for b in (8, 1))
    meta = {"microbatch_factors": {"sizes": [1, 8], "hot": [10.0, 1.1], "cold": [10.0, 1.1], "batch": 8,
                                   "profiled_ms": at8}}
    model = profiled_compute_models(replace(costs, meta=meta), 4, 2)["scheduled"]
    # at 8 the fit is the profile: 1.1 stays; at 1 the fit already charges at1 a micro-batch (linear scaling
    # charged at8 / 8): what is left of the 10x is the factor
    assert model.factor(8) == pytest.approx(1.1) and model.factor(1) == pytest.approx(10.0 * at8 / 8 / at1)
    assert 1.1 < model.factor(1) < 10.0


def test_microbatch_range_spans_one_sample_to_the_whole_batch():
    assert microbatch_range(64, 4) == (1, 64)
    assert microbatch_range(256, 4) == (1, 256)
    assert microbatch_range(256, 1) == (4, 256)  # at most 64 micro-batches
    assert smaller_world_sizes(4) == [1, 2] and smaller_world_sizes(6) == [1, 2, 4] and smaller_world_sizes(1) == []


def _chatty() -> ModelCosts:
    """Weight-bound layers (the fit nearly flat in the batch) with 20 MB of weights each: splitting the batch
    saves next to no compute, and more replicas add a gradient all-reduce."""
    fitted = _fitted()
    return replace(fitted, layers=tuple(replace(l, param_bytes=20_000_000, grad_bytes=20_000_000)
                                        for l in fitted.layers))


def test_shared_cores_plan_fewer_ranks_and_say_when_they_train_faster():
    result = plan(Workload(_chatty(), 16), "local", Budget(world_size=4), SearchOptions(kinds=("dp",)))
    assert result.best.name == "dp1"
    assert {p.plan.world_size for p in result.plans} == {1, 2, 4}
    note = next(n for n in result.notes if n.startswith("fewer ranks train faster"))
    assert result.best.name in note and "--world-size 4 is an upper bound" in note
    record = result.to_dict()["fewer_ranks"]
    assert record["fewer_ranks_faster"] and record["best_world_size"] == 1 and record["considered"] == [1, 2]
    assert record["best_at_world_size"] == min((p for p in result.plans if p.plan.world_size == 4),
                                               key=lambda p: p.estimate.iteration_ms).name


def test_exact_world_size_and_own_devices_plan_only_the_world_asked_for():
    exact = plan(Workload(_chatty(), 16), "local", Budget(world_size=4), SearchOptions(kinds=("dp",),
                                                                                       fewer_ranks=False))
    assert {p.plan.world_size for p in exact.plans} == {4} and exact.fewer_ranks is None
    gpus = plan(Workload(_chatty(), 16), "8xV100-PCIe", Budget(world_size=4), SearchOptions(kinds=("dp",)))
    assert {p.plan.world_size for p in gpus.plans} == {4} and "fewer_ranks" not in gpus.to_dict()
    given = plan(Workload(_chatty(), 16), "local", Budget(world_size=4), SearchOptions(strategies=["dp4"]))
    assert [p.name for p in given.plans] == ["dp4"] and given.fewer_ranks is None


def test_a_run_calibrates_against_the_fit_at_its_micro_batch():
    from workbench.core.partition import Partition
    from workbench.core.timeline import Event, Timeline
    from workbench.planning.costs.run_calibration import calibrate_from_timeline

    costs = _fitted()
    partition = Partition.from_cuts([], costs.num_layers)
    forward, backward = (sum(t) for t in costs.batch_fit.times_ms(4))  # one micro-batch of 4 samples
    events, t = [], 0.0
    for it in range(3):  # a one-stage run at micro-batches of 4 that computed 1.5x the fit there
        for mb in range(2):
            events += [Event(0, 0, "F", t, t + 1.5 * forward, mb, iteration=it, source="measured"),
                       Event(0, 0, "B", t + 1.5 * forward, t + 1.5 * (forward + backward), mb, iteration=it,
                             source="measured")]
            t += 1.5 * (forward + backward)
    cal = calibrate_from_timeline(costs, Timeline(tuple(events)), partition, 4, cluster=FAST, warmup=1)
    assert cal.compute_scale == pytest.approx(1.5)  # against the 32-sample profile scaled linearly: 7.3
