"""The per-layer search's zero-bubble schedules: ZB-H1 and ZB-H2 beside 1F1B, their fill and drain, the
micro-batches they hold and the split backward they pay."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from workbench.core.costs import ModelCosts
from workbench.core.plan import ParallelPlan
from workbench.planning.costs.clusters import get_cluster
from workbench.planning.strategy.hybrid import SCHEDULES, cost_plan, fill_drain_ms, search_hybrid
from workbench.scheduling.registry import stage_memory

MIB = 2**20
CLUSTER = get_cluster("8xA100-NVLink")
# four devices, one per stage of a 4-stage pipeline, 8 micro-batches of 4 samples (the profile's batch is 8):
# each of the 8 layers takes half its profile time a micro-batch, two layers a stage
SHAPE = dict(world_size=4, pp_options=(4,), microbatch_options=(8,))


def layers(input_grad_ms: float | None = 1.0, weight_grad_ms: float | None = 1.0, param_bytes: int = 0) -> ModelCosts:
    """8 identical layers, F = 1 and B = 2 ms at the profile's batch, with the given I and W; every layer keeps
    1 MiB of activations a profile batch, and so does its input (recomputing saves nothing)."""
    costs = ModelCosts.uniform(8, forward_ms=1.0, backward_ms=2.0, input_grad_ms=input_grad_ms,
                               weight_grad_ms=weight_grad_ms, activation_bytes=MIB, param_bytes=param_bytes,
                               batch_size=8)
    return replace(costs, input_bytes=MIB)


def per_layer(result, kind: str):
    """The fastest per-layer plan that runs ``kind`` (None when there is none)."""
    return next((p for p in result.plans if p.source is None and p.plan.pipeline.kind == kind), None)


def test_fill_and_drain_at_f_equal_i_equal_w_are_the_textbook_numbers():
    """F = I = W = 1 ms a micro-batch on every stage: 1F1B's fill and drain is (pp - 1)(F + I + W) = 9 ms,
    ZB-H1's and ZB-H2's (pp - 1) F = 3 ms; each stage computes m (F + I + W) = 24 ms."""
    result = search_hybrid(layers(), CLUSTER, 32, **SHAPE)
    one, h1, h2 = (per_layer(result, k) for k in ("1f1b", "zbh1", "zbh2"))
    assert one.bubble_ms == pytest.approx(9.0, rel=1e-12)
    assert h1.bubble_ms == pytest.approx(3.0, rel=1e-12)
    assert h2.bubble_ms == pytest.approx(3.0, rel=1e-12)
    for found in (one, h1, h2):
        assert [s.time_ms for s in found.stages] == pytest.approx([24.0] * 4, rel=1e-12)
        assert found.iteration_ms == pytest.approx(24.0 + found.bubble_ms + found.p2p_ms, rel=1e-12)
        assert [(s.first, s.last) for s in found.stages] == [(0, 1), (2, 3), (4, 5), (6, 7)]
        again = cost_plan(layers(), CLUSTER, 32, found.plan.name)  # cost_plan costs zero-bubble plans alike
        assert again.iteration_ms == pytest.approx(found.iteration_ms, rel=1e-12)
        assert again.bubble_ms == pytest.approx(found.bubble_ms, rel=1e-12)
    assert "zbh1" in h1.plan.name and "zbh2" in h2.plan.name and "1f1b" in one.plan.name
    assert fill_drain_ms("1f1b", 4, 8, 1.0, 1.0, 1.0) == 9.0
    assert fill_drain_ms("zbh1", 4, 8, 1.0, 1.0, 1.0) == fill_drain_ms("zbh2", 4, 8, 1.0, 1.0, 1.0) == 3.0


def test_zb_h1_beats_1f1b_at_the_same_memory():
    result = search_hybrid(layers(), CLUSTER, 32, **SHAPE)
    best, one = result.best["per-layer"], per_layer(result, "1f1b")
    assert best.plan.pipeline.kind == "zbh1" and "-zbh1-" in best.name  # ZB-H2 ties it with more memory
    assert best.iteration_ms == pytest.approx(one.iteration_ms - 6.0, rel=1e-12)
    assert best.memory_bytes == one.memory_bytes  # the fullest stage holds pp micro-batches under both
    assert [s.in_flight for s in best.stages] == [4, 4, 4, 4]  # ZB-H1's later stages hold its deferred W's
    assert [s.in_flight for s in one.stages] == [4, 3, 2, 1]


def test_zb_h2_wins_where_it_fits_and_zb_h1_where_it_does_not():
    """I = 1.25, W = 0.75 ms a micro-batch: ZB-H1 drains (pp - 1)(F + I - W) = 4.5 ms, ZB-H2 only fills, 3 ms,
    but holds 2 pp - 1 = 7 micro-batches on every stage: 7 MiB against ZB-H1's 4 MiB."""
    costs = layers(input_grad_ms=1.25, weight_grad_ms=0.75)
    roomy = search_hybrid(costs, CLUSTER, 32, **SHAPE)
    h2 = roomy.best["per-layer"]
    assert h2.plan.pipeline.kind == "zbh2"
    assert h2.bubble_ms == pytest.approx(3.0, rel=1e-12)
    assert per_layer(roomy, "zbh1").bubble_ms == pytest.approx(4.5, rel=1e-12)
    assert [s.in_flight for s in h2.stages] == [7] * 4 and h2.memory_bytes == 7 * MIB
    tight = search_hybrid(costs, CLUSTER, 32, budget_bytes=5 * MIB, **SHAPE)
    best = tight.best["per-layer"]
    assert best.plan.pipeline.kind == "zbh1" and best.memory_bytes == 4 * MIB <= 5 * MIB
    assert per_layer(tight, "zbh2") is None  # its extra activations count against the budget
    assert best.iteration_ms > h2.iteration_ms


def test_a_split_backward_that_costs_much_more_than_the_fused_one_leaves_1f1b_the_fastest():
    """I = W = B: the zero-bubble schedules pay 4 ms of backward a layer where 1F1B pays 2; their smaller fill and
    drain does not make up for it."""
    costs = layers(input_grad_ms=2.0, weight_grad_ms=2.0)
    result = search_hybrid(costs, CLUSTER, 32, **SHAPE)
    best = result.best["per-layer"]
    assert best.plan.pipeline.kind == "1f1b"
    assert best.iteration_ms == pytest.approx(24.0 + 9.0 + best.p2p_ms, rel=1e-12)
    for kind, bubble in (("zbh1", 6.0), ("zbh2", 3.0)):  # F = 1, I = W = 2: ZB-H1 drains (pp - 1) I
        charged = cost_plan(costs, CLUSTER, 32, best.plan.name.replace("1f1b", kind))
        assert [s.time_ms for s in charged.stages] == pytest.approx([40.0] * 4)  # m (F + I + W), I + W = 4
        assert charged.bubble_ms == pytest.approx(bubble)
        assert charged.iteration_ms > best.iteration_ms
    cheap = search_hybrid(layers(), CLUSTER, 32, **SHAPE).best["per-layer"]  # the same model with I + W = B
    assert cheap.plan.pipeline.kind == "zbh1"


def test_without_a_measured_split_the_backward_is_shared_out_as_the_profile_says():
    """Unmeasured: a layer with parameters splits B in half (ZB-H1 as at F = I = W), one without is all input
    gradient (no W to defer: both zero-bubble drains are 1F1B's, which wins the tie by name); the stages cost
    what 1F1B's do either way."""
    with_params = search_hybrid(layers(None, None, param_bytes=MIB), CLUSTER, 32, **SHAPE)
    assert with_params.best["per-layer"].plan.pipeline.kind == "zbh1"
    assert per_layer(with_params, "zbh1").bubble_ms == pytest.approx(3.0, rel=1e-12)
    without = search_hybrid(layers(None, None), CLUSTER, 32, **SHAPE)
    assert without.best["per-layer"].plan.pipeline.kind == "1f1b"
    for kind in ("zbh1", "zbh2"):
        zb = cost_plan(layers(None, None), CLUSTER, 32, without.best["per-layer"].plan.name.replace("1f1b", kind))
        assert zb.bubble_ms == pytest.approx(without.best["per-layer"].bubble_ms, rel=1e-12)
        assert [s.time_ms for s in zb.stages] == [s.time_ms for s in without.best["per-layer"].stages]


def test_zb_h2_with_too_few_micro_batches_to_run_ahead_is_zb_h1():
    """m < 2 pp - 1: ZB-H2 holds what ZB-H1 holds and drains alike, so the search leaves it out beside ZB-H1."""
    costs = layers(input_grad_ms=1.25, weight_grad_ms=0.75)
    h1 = cost_plan(costs, CLUSTER, 32, "pp4-zbh1-m4")
    h2 = cost_plan(costs, CLUSTER, 32, "pp4-zbh2-m4")
    assert h2.bubble_ms == h1.bubble_ms and h2.memory_bytes == h1.memory_bytes
    result = search_hybrid(costs, CLUSTER, 32, world_size=4, pp_options=(4,), microbatch_options=(4,))
    assert per_layer(result, "zbh2") is None and per_layer(result, "zbh1") is not None
    alone = search_hybrid(costs, CLUSTER, 32, world_size=4, pp_options=(4,), microbatch_options=(4,),
                          schedules=("zbh2",))
    assert alone.best["per-layer"].plan.pipeline.kind == "zbh2"


def test_only_the_schedules_asked_for_are_searched():
    result = search_hybrid(layers(), CLUSTER, 32, world_size=4, schedules=("1f1b",))
    assert {p.plan.pipeline.kind for p in result.plans} <= {"none", "1f1b"}
    both = search_hybrid(layers(), CLUSTER, 32, world_size=4, schedules=["zbh1", "1f1b", "zbh1"])
    assert {p.plan.pipeline.kind for p in both.plans} <= {"none", "1f1b", "zbh1"}
    assert SCHEDULES == ("1f1b", "zbh1", "zbh2")


@pytest.mark.parametrize("schedules", [("zbv",), ("1F1B",), ("gpipe", "1f1b"), (), "zbh1", None, (1,)])
def test_bad_schedules_name_the_field_and_the_valid_ones(schedules):
    with pytest.raises(ValueError, match=r"schedules must be .*1f1b, zbh1, zbh2"):
        search_hybrid(layers(), CLUSTER, 32, world_size=4, schedules=schedules)


def test_cost_plan_refuses_the_schedules_it_does_not_cost():
    with pytest.raises(ValueError, match="1F1B, ZB-H1 or ZB-H2"):
        cost_plan(layers(), CLUSTER, 32, "pp2-zbv-m4")


def test_fill_and_drain_stay_between_the_forwards_and_1f1b():
    rng = random.Random(5)
    for _ in range(500):
        pp, f, i, w = rng.randint(2, 16), rng.uniform(0, 3), rng.uniform(0, 3), rng.uniform(0, 3)
        m = rng.randint(2 * pp - 1, 8 * pp)
        one, h1, h2 = (fill_drain_ms(k, pp, m, f, i, w) for k in ("1f1b", "zbh1", "zbh2"))
        assert (pp - 1) * f <= h2 <= h1 <= one == pytest.approx((pp - 1) * (f + i + w))
        assert h1 >= (pp - 1) * (f + i - w) - 1e-9
        assert fill_drain_ms("zbh2", pp, 2 * pp - 2, f, i, w) == fill_drain_ms("zbh1", pp, 2 * pp - 2, f, i, w)
    assert fill_drain_ms("zbh1", 1, 4, 1.0, 1.0, 1.0) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_fill_and_drain_are_what_the_simulator_gives_the_schedules_on_equal_stages(seed):
    from workbench.scheduling.registry import schedule_for
    from workbench.scheduling.simulate import simulate
    from workbench.scheduling.stagecosts import StageCosts

    rng = random.Random(seed)
    for _ in range(8):
        pp, f, i, w = rng.randint(2, 5), *(round(rng.uniform(0.1, 3), 2) for _ in range(3))
        for kind in ("1f1b", "zbh1", "zbh2"):
            m = rng.randint(2 * pp - 1 if kind == "zbh2" else pp, 4 * pp)
            costs = StageCosts.uniform(pp, forward_ms=f, input_grad_ms=i, weight_grad_ms=w)
            plan = ParallelPlan.for_pipeline(kind, pp, m)
            simulated = simulate(schedule_for(plan, stage_costs=costs), costs, CLUSTER).metrics["iteration_ms"]
            assert simulated - m * (f + i + w) == pytest.approx(fill_drain_ms(kind, pp, m, f, i, w), abs=1e-9), \
                (kind, pp, m, f, i, w)


def test_search_notes_name_the_schedule():
    from workbench.planning import Budget, SearchOptions, Workload, plan

    costs = layers(input_grad_ms=1.25, weight_grad_ms=0.75)
    result = plan(Workload(costs, 32), CLUSTER, Budget(world_size=4),
                  SearchOptions(fine_grained=True, pipeline_degrees=(4,)))
    best = result.per_layer.best["per-layer"]
    assert best.plan.pipeline.kind in ("zbh1", "zbh2")
    share = f"{best.bubble_ms / best.iteration_ms:.1%}"
    assert any(re.fullmatch(rf"per-layer model: {re.escape(best.name)} runs the ZB-H[12] schedule \([\d.]+ ms of "
                            rf"fill and drain, {re.escape(share)} of the iteration\)", note)
               for note in result.notes), result.notes
    assert any("1F1B, ZB-H1 and ZB-H2 schedules" in note for note in result.notes)
    assert best.name in [p.name for p in result.plans]
    assert best.to_dict()["schedule"] == best.plan.pipeline.kind


def test_selective_recomputation_charges_a_split_backward_its_recomputed_forwards():
    from workbench.planning.layerwise.finegrained import _recomputed
    from workbench.scheduling.stagecosts import StageCosts

    base = StageCosts.uniform(3, forward_ms=1.0, backward_ms=2.0, input_grad_ms=1.5, weight_grad_ms=0.5)
    out = _recomputed(base, [0.25, 0.5, 1.0])
    assert out["backward_ms"] == (2.25, 2.5, 3.0)
    assert out["input_grad_ms"] == (1.5, 2.0, 2.5)  # recomputed before the input gradient
    assert out["weight_grad_ms"] == (0.75, 0.5, 0.5)  # the first stage's split backward is all weight gradient
