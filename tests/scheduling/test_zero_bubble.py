"""Zero-bubble schedules: the published bubbles and memory on uniform costs, the split backward's rules.

Uniform costs with F = I = W (per chunk for the V-shaped kinds, each chunk
half a stage, so every rank has the same work): the bubble per iteration
(makespan minus a rank's compute) and the steady-state bubble (the idle time
between a rank's first and last compute, what remains when iterations run
back to back and the neighbours' fill and drain cover each rank's own) equal
the formulas of the papers; the peak in-flight activations too.
"""

from __future__ import annotations

import random

import pytest

from workbench.core.ir import Op, Schedule
from workbench.core.plan import ParallelPlan
from workbench.scheduling.memory import in_flight_microbatches, memory_breakdown
from workbench.scheduling.registry import schedule_for
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts
from workbench.scheduling.validate import ScheduleError, validate
from workbench.scheduling.passes import lower
from workbench.scheduling.zero_bubble import zb_auto, zb_h1, zb_h2

SIZES = [(p, m) for p in (2, 3, 4, 6) for m in (2 * p, 3 * p + 1)]


def run(kind: str, p: int, m: int, f: float = 1.0, i: float = 1.0, w: float = 1.0):
    """(bubble per iteration, steady bubble of the worst rank, peak activations in full stages, result)."""
    plan = ParallelPlan.parse(f"pp{p}-{kind}-m{m}")
    c = plan.chunks
    costs = StageCosts.uniform(plan.num_virtual_stages, forward_ms=f / c, input_grad_ms=i / c, weight_grad_ms=w / c,
                               activation_bytes=2 // c * 1)
    result = simulate(schedule_for(plan), costs)
    work = m * (f + i + w)
    peak = max(row["activations"] for row in result.memory) / 2
    return result.metrics["makespan_ms"] - work, max(result.metrics["steady_bubble_ms"]), peak, result


@pytest.mark.parametrize(("p", "m"), SIZES)
def test_uniform_bubbles_and_memory_equal_the_formulas(p, m):
    bubble, steady, peak, _ = run("1f1b", p, m)
    assert bubble == pytest.approx((p - 1) * 3) and steady == pytest.approx((p - 1) * 3)  # (p-1)(F+I+W)
    assert peak == p
    bubble, steady, peak, _ = run("zbh1", p, m)
    assert bubble == pytest.approx(p - 1) and steady == pytest.approx(p - 1)  # (p-1)(F+I-W), at 1F1B's memory
    assert peak == p
    _, steady, peak, _ = run("zbh2", p, m)
    assert steady == pytest.approx(0.0) and peak == 2 * p - 1  # no bubble inside, 2p - 1 micro-batches
    _, steady, peak, _ = run("zbv", p, m)
    assert steady == pytest.approx(0.0) and peak == p  # two chunks in a V: no bubble inside, 1F1B's memory
    bubble, steady, peak, _ = run("dualpipev", p, m)
    # the authors' table (DualPipe's repository): activations PP + 1 chunks (PP = 2p stages), bubble
    # (PP/2 - 1)(F&B + B - 3W); run in sequence, a forward-backward pair costs F + B: (p - 1)(1/2 + 1 + 1 - 3/2)
    assert peak * 2 == 2 * p + 1
    assert bubble <= (p - 1) * (0.5 + 1.0 + 1.0 - 1.5) + 1e-9


@pytest.mark.parametrize("p", [2, 3, 4])
def test_zero_bubble_h2_follows_its_formula_on_unequal_costs(p):
    """ZB-H2's steady bubble is (p - 1) max(0, F + I - 2W), ZB-H1's bubble (p - 1)(F + I - W) while W <= F + I."""
    for f, i, w in ((2.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 3.0, 0.5), (3.0, 1.0, 1.0), (1.0, 1.0, 2.0)):
        _, steady, _, _ = run("zbh2", p, 4 * p, f, i, w)
        assert steady == pytest.approx((p - 1) * max(0.0, f + i - 2 * w)), (f, i, w)
        bubble, _, _, _ = run("zbh1", p, 4 * p, f, i, w)
        if w <= f:
            assert bubble == pytest.approx((p - 1) * (f + i - w)), (f, i, w)


def test_the_automatic_schedule_is_never_slower_than_zb_h1_and_keeps_its_memory_limit():
    rng = random.Random(7)
    for _ in range(12):
        p = rng.randint(2, 4)
        m = rng.randint(p, 3 * p)
        f = [rng.uniform(0.5, 2.0) for _ in range(p)]
        i = [rng.uniform(0.5, 2.0) for _ in range(p)]
        w = [rng.uniform(0.2, 2.0) for _ in range(p)]
        costs = StageCosts(forward_ms=tuple(f), backward_ms=tuple(a + b for a, b in zip(i, w)), send_bytes=(0,) * p,
                           param_bytes=(0,) * p, grad_bytes=(0,) * p, optimizer_bytes=(0,) * p,
                           activation_bytes=(10 ** 6,) * p, input_grad_ms=tuple(i), weight_grad_ms=tuple(w))
        auto = zb_auto(p, m, costs)
        validate(lower(auto))
        h1 = simulate(zb_h1(p, m), costs).metrics["iteration_ms"]
        assert simulate(auto, costs).metrics["iteration_ms"] <= h1 + 1e-9
        assert max(in_flight_microbatches(auto)) <= min(p, m)  # 0 MB: 1F1B's memory
        roomy = zb_auto(p, m, costs, memory_limit_mb=(2 * p - 1) * 1.0)
        assert max(in_flight_microbatches(roomy)) <= 2 * p - 1
        assert simulate(roomy, costs).metrics["iteration_ms"] <= simulate(zb_h2(p, m), costs).metrics[
            "iteration_ms"] + 1e-9


def test_by_default_the_automatic_schedule_never_loses_to_zb_h1_even_where_later_stages_hold_more():
    """A last stage whose micro-batch keeps more (an LM head's logits) makes ZB-H1 peak above 1F1B there."""
    rng = random.Random(11)
    for _ in range(10):
        p = rng.randint(2, 4)
        m = rng.randint(p, 3 * p)
        act = tuple(rng.randint(1, 6) * 10 ** 6 for _ in range(p))
        f = tuple(rng.uniform(0.5, 2.0) for _ in range(p))
        i = tuple(rng.uniform(0.5, 2.0) for _ in range(p))
        w = tuple(rng.uniform(0.2, 2.0) for _ in range(p))
        costs = StageCosts(forward_ms=f, backward_ms=tuple(a + b for a, b in zip(i, w)), send_bytes=(0,) * p,
                           param_bytes=(0,) * p, grad_bytes=(0,) * p, optimizer_bytes=(0,) * p,
                           activation_bytes=act, input_grad_ms=i, weight_grad_ms=w)
        auto = simulate(zb_auto(p, m, costs), costs)
        assert auto.metrics["iteration_ms"] <= simulate(zb_h1(p, m), costs).metrics["iteration_ms"] + 1e-9
        h1_peak = max(row["activations"] for row in simulate(zb_h1(p, m), costs).memory)
        one_f_one_b_peak = max(min(p - s, m) * act[s] for s in range(p))
        assert max(row["activations"] for row in auto.memory) <= max(h1_peak, one_f_one_b_peak)


def test_the_automatic_schedule_places_the_last_stages_weight_gradients_where_zb_h1_defers_them():
    """A forward-heavy first stage (a fixed front end: no input gradient, a small weight gradient) ahead of a last
    stage whose W costs more than its I (bench/bench_zb_auto.py's profile, in round figures): the last stage idles
    between micro-batches, so ZB-H1's one-micro-batch deferral of its W only leaves two W's for the drain and
    runs behind 1F1B; the automatic schedule runs each W in the idle time and beats both."""
    costs = StageCosts(forward_ms=(173.0, 56.0), backward_ms=(23.0, 135.0), send_bytes=(0, 0), param_bytes=(0, 0),
                       grad_bytes=(0, 0), optimizer_bytes=(0, 0), activation_bytes=(10 ** 6, 10 ** 6),
                       input_grad_ms=(0.0, 55.0), weight_grad_ms=(23.0, 80.0))
    from workbench.scheduling import generators

    ms = {name: simulate(schedule, costs).metrics["iteration_ms"]
          for name, schedule in (("1f1b", generators.one_f_one_b(2, 4)), ("zbh1", zb_h1(2, 4)),
                                 ("auto", zb_auto(2, 4, costs)))}
    assert ms["zbh1"] > ms["1f1b"]
    assert ms["auto"] < ms["1f1b"]
    assert ms["zbh1"] / ms["auto"] > 1.05


def test_the_automatic_schedule_times_its_messages_on_the_cluster_it_runs_on():
    """Slow links between the stages: on the cluster zb-auto is timed on, it is never slower than ZB-H1 there, and
    the order it chooses can differ from the one for free messages."""
    from workbench.core.costs import ClusterSpec, DeviceSpec, LinkSpec

    rng = random.Random(5)
    slow = ClusterSpec("slow-links", 1, 4, DeviceSpec("d", {"float32": 1.0}, 2 ** 34, 10.0),
                       LinkSpec("slow", latency_us=0.0, bandwidth_gbs=0.001))  # 1 MB: 1,000 ms
    for _ in range(8):
        p = rng.randint(2, 4)
        m = rng.randint(p, 2 * p)
        f = tuple(rng.uniform(200, 2000) for _ in range(p))
        i = tuple(rng.uniform(200, 2000) for _ in range(p))
        w = tuple(rng.uniform(100, 2000) for _ in range(p))
        costs = StageCosts(forward_ms=f, backward_ms=tuple(a + b for a, b in zip(i, w)), send_bytes=(10 ** 6,) * p,
                           param_bytes=(0,) * p, grad_bytes=(0,) * p, optimizer_bytes=(0,) * p,
                           activation_bytes=(10 ** 6,) * p, input_grad_ms=i, weight_grad_ms=w)
        auto = zb_auto(p, m, costs, cluster=slow)
        validate(lower(auto))
        on_slow = simulate(auto, costs, slow).metrics["iteration_ms"]
        assert on_slow <= simulate(zb_h1(p, m), costs, slow).metrics["iteration_ms"] + 1e-6
        assert on_slow <= simulate(zb_auto(p, m, costs), costs, slow).metrics["iteration_ms"] + 1e-6


def test_a_memory_limit_no_schedule_meets_is_refused_naming_the_field():
    costs = StageCosts.uniform(2, activation_bytes=4 * 10 ** 6)
    with pytest.raises(ValueError, match="'pipeline.memory_limit_mb' = 1 is invalid: one micro-batch"):
        zb_auto(2, 4, costs, memory_limit_mb=1)


def test_bad_zero_bubble_plans_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="'pipeline.chunks' = 3 is invalid: a V-shaped schedule"):
        ParallelPlan.from_dict({"mesh": {"dp": 1, "pp": 2}, "microbatches": 4,
                                "pipeline": {"kind": "zbv", "chunks": 3}})
    with pytest.raises(ValueError, match="'microbatches' = 3 is invalid: DualPipeV fills both arms"):
        ParallelPlan.parse("pp2-dualpipev-m3")
    with pytest.raises(ValueError, match="'pipeline.memory_limit_mb' = -1 is invalid"):
        ParallelPlan.from_dict({"mesh": {"dp": 1, "pp": 2}, "microbatches": 4,
                                "pipeline": {"kind": "zb-auto", "memory_limit_mb": -1}})


def test_the_validator_holds_every_w_between_its_i_and_the_step():
    ok = Schedule.from_text(["0F0 0I0 0W0 0STEP"])
    validate(ok)
    for text, problem in ((["0F0 0W0 0I0"], "weight gradient 0W0 before"), (["0F0 0I0 0STEP 0W0"], "before the weight"),
                          (["0F0 0I0"], "never runs the weight gradient"), (["0F0 0I0 0B0 0W0"], "full backward 0B0 after its input gradient"),
                          (["0F0 0B0 0I0 0W0"], "already ran its backward")):
        with pytest.raises(ScheduleError, match=problem):
            validate(Schedule.from_text(text))


def test_activations_stay_until_the_weight_gradient():
    costs = StageCosts.uniform(1, activation_bytes=100)
    split = Schedule.from_text(["0F0 0F1 0I0 0I1 0W0 0W1"])
    whole = Schedule.from_text(["0F0 0F1 0B0 0B1"])
    assert memory_breakdown(split, costs)[0]["activations"] == 200
    assert in_flight_microbatches(split) == [2] and in_flight_microbatches(whole) == [2]
    late = Schedule.from_text(["0F0 0I0 0F1 0I1 0W0 0W1"])
    assert in_flight_microbatches(late) == [2]  # W frees, I does not
    early = Schedule.from_text(["0F0 0I0 0W0 0F1 0I1 0W1"])
    assert in_flight_microbatches(early) == [1]


def test_every_zero_bubble_schedule_is_valid_lowered_and_in_groups():
    for name in ("pp3-zbh1-m5", "pp3-zbh2-m5", "pp3-zbv-m4", "pp2-dualpipev-m5", "pp3-zbauto-m6",
                 "gropipe-2x3-zbh1-m4-d1", "gropipe-2x2-zbh2-m3-d0", "torchpp2-interleaved-zb-m4"):
        plan = ParallelPlan.parse(name)
        schedule = schedule_for(plan, num_iterations=2 if plan.delayed_update else 1)
        validate(lower(schedule))
        ops = {a.op for r in range(schedule.num_ranks) for a in schedule.actions(r)}
        assert {Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT} <= ops, name


def test_a_launch_whose_memory_limit_no_schedule_meets_is_refused_before_any_process_starts(tmp_path):
    from workbench.jobs import LaunchSpec, launch

    with pytest.raises(ValueError, match="'pipeline.memory_limit_mb' = 0.001 is invalid: one micro-batch"):
        launch(LaunchSpec(config={"model": "mlp", "plan": "pp2-zbauto-m4-mem0.001",
                                  "training": {"global_batch": 16, "steps": 2}},
                          name="refused", run_root=str(tmp_path)))
    assert not any(tmp_path.iterdir())  # no run directory left behind


@pytest.mark.parametrize("name", ["async-1x4-m4", "async-2x3-m3", "async-1x4-m4-2bw", "async-1x3-m3-vsync-if2"])
def test_the_asynchronous_stream_splits_each_backward_on_its_versions_at_the_fused_memory(name):
    """``split``: each B becomes I then W on the same micro-batch and version; in-flight memory is the fused
    stream's, and on F = I = W the input gradients that reach upstream sooner end the run no later."""
    fused, split = ParallelPlan.parse(name), ParallelPlan.parse(f"{name}-split")
    assert ParallelPlan.parse(split.name) == split and split.split_backward and not fused.split_backward
    a, b = schedule_for(fused, num_iterations=3), schedule_for(split, num_iterations=3)
    validate(lower(b))
    for r in range(a.num_ranks):
        expanded = [(x.op, x.microbatch, x.iteration, x.version) for x in a.actions(r)]
        expanded = [y for op, *key in expanded
                    for y in ([(Op.BACKWARD_INPUT, *key), (Op.BACKWARD_WEIGHT, *key)] if op is Op.BACKWARD
                              else [(op, *key)])]
        assert [(x.op, x.microbatch, x.iteration, x.version) for x in b.actions(r)] == expanded
    assert in_flight_microbatches(b) == in_flight_microbatches(a)
    costs = StageCosts.uniform(split.pp, forward_ms=1.0, input_grad_ms=1.0, weight_grad_ms=1.0)
    assert simulate(b, costs).metrics["makespan_ms"] <= simulate(a, costs).metrics["makespan_ms"] + 1e-9
