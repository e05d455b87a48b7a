from dataclasses import replace

import pytest

from workbench.core.config import RunConfig
from workbench.scheduling import generators, simulate
from workbench.scheduling.from_config import predict_from_measured, schedule_for_config, stage_costs_from_timeline
from workbench.scheduling.stagecosts import StageCosts


def config(plan="pp2-1f1b-m4", steps=1):
    return RunConfig.from_dict({"name": "t", "model": "mlp", "plan": plan,
                                "training": {"global_batch": 8, "steps": steps}})


def test_config_maps_to_the_generator_schedules():
    assert schedule_for_config(config()) == generators.one_f_one_b(2, 4)
    assert schedule_for_config(config("pp2-gpipe-m4")) == generators.gpipe(2, 4)
    g = config("gropipe-2x2-1f1b-m4-d1")
    assert schedule_for_config(g, iteration=3) == generators.gropipe(2, 2, 4, delay=1, first_iteration=3)
    with pytest.raises(ValueError, match="not a pipeline the workbench schedules"):
        schedule_for_config(config("dp2"))


def test_prediction_from_a_measured_timeline_recovers_its_stage_times():
    costs = StageCosts(forward_ms=(2.0, 3.0), backward_ms=(4.0, 5.0), step_ms=(0.5, 0.5), send_bytes=(0, 0),
                       param_bytes=(0, 0), grad_bytes=(0, 0), optimizer_bytes=(0, 0), activation_bytes=(0, 0))
    truth = simulate(generators.one_f_one_b(2, 4), costs)
    measured = type(truth.timeline)(tuple(replace(e, source="measured") for e in truth.timeline), {})
    fitted = stage_costs_from_timeline(measured, 2)
    assert fitted.forward_ms == (2.0, 3.0) and fitted.backward_ms == (4.0, 5.0)
    predicted = predict_from_measured(config(), measured)
    assert predicted.metrics["iteration_ms"] == pytest.approx(truth.metrics["iteration_ms"])
    assert {e.source for e in predicted.timeline} == {"simulated"}


def test_missing_stage_events_are_explained():
    truth = simulate(generators.one_f_one_b(2, 2))
    only_stage0 = truth.timeline.filter(rank=0)
    with pytest.raises(ValueError, match=r"no forward/backward events for stages \[1\]"):
        stage_costs_from_timeline(only_stage0, 2)


def test_recorded_bytes_drive_the_communication_of_the_prediction():
    from workbench.core.timeline import Event, Timeline
    from workbench.planning.costs.clusters import get_cluster

    measured = []
    for rank, stage in ((0, 0), (1, 1), (2, 0), (3, 1)):
        for mb in range(4):
            measured.append(Event(rank=rank, stage=stage, op="F", start=0, end=1, microbatch=mb, source="measured"))
            measured.append(Event(rank=rank, stage=stage, op="B", start=1, end=3, microbatch=mb, source="measured"))
        measured.append(Event(rank=rank, stage=stage, op="AR", start=3, end=4, nbytes=12_000_000, source="measured"))
        if stage == 0:
            measured.append(Event(rank=rank, stage=0, op="SEND_F", start=1, end=1, microbatch=0, peer=rank + 1,
                                  nbytes=400_000, source="measured"))
    timeline = Timeline(tuple(measured))
    costs = stage_costs_from_timeline(timeline, 2)
    assert costs.grad_bytes == (12_000_000, 12_000_000) and costs.send_bytes == (400_000, 0)
    gropipe = config("gropipe-2x2-1f1b-m4-d0")
    free = predict_from_measured(gropipe, timeline)
    linked = predict_from_measured(gropipe, timeline, cluster=get_cluster("local-cpu"))  # its all-reduce link
    # a 12 MB ring all-reduce over 2 ranks at 1.2 GB/s takes ~10 ms, and delay 0 waits for it
    assert linked.metrics["iteration_ms"] > free.metrics["iteration_ms"] + 9


def test_async_config_maps_to_one_stream_and_its_prediction_has_no_flush():
    a = config("async-1x2-m4-if2", steps=3)
    assert schedule_for_config(a) == generators.async_1f1b(2, 4, 3, inflight=2)
    two_bw = config("async-1x2-m4-2bw", steps=3)
    assert schedule_for_config(two_bw) == generators.async_1f1b(2, 4, 3, mode="2bw")
    costs = StageCosts.uniform(2, forward_ms=1.0, backward_ms=2.0)
    truth = simulate(schedule_for_config(a), costs)
    measured = type(truth.timeline)(tuple(replace(e, source="measured") for e in truth.timeline), {})
    predicted = predict_from_measured(a, measured)
    assert predicted.metrics["iteration_ms"] == pytest.approx(truth.metrics["iteration_ms"])
    flushed = simulate(generators.one_f_one_b(2, 4), costs).metrics["iteration_ms"]
    assert predicted.metrics["iteration_ms"] < flushed  # the stream removes the per-iteration fill and drain


def test_an_automatic_schedule_is_predicted_in_the_order_the_run_built_from_its_own_costs():
    """zb-auto's order comes from the stage costs the run profiled at its start (recorded in its start event); the
    prediction simulates that order with the measured times, not one built for unit costs."""
    from workbench.scheduling.zero_bubble import zb_auto

    # the first stage's input gradient is nothing, but the run records its (empty) pass
    ran = StageCosts(forward_ms=(173.0, 56.0), backward_ms=(23.1, 135.0), send_bytes=(0, 0), param_bytes=(0, 0),
                     grad_bytes=(0, 0), optimizer_bytes=(0, 0), activation_bytes=(10 ** 6, 10 ** 6),
                     input_grad_ms=(0.1, 55.0), weight_grad_ms=(23.0, 80.0))
    auto = config("pp2-zbauto-m4")
    order = zb_auto(2, 4, ran)
    assert schedule_for_config(auto) != order  # unit costs give another order
    truth = simulate(order, ran)
    measured = type(truth.timeline)(tuple(replace(e, source="measured") for e in truth.timeline), {})
    predicted = predict_from_measured(auto, measured, schedule_costs=ran)
    assert predicted.metrics["iteration_ms"] == pytest.approx(truth.metrics["iteration_ms"])
    assert predict_from_measured(auto, measured).metrics["iteration_ms"] > 1.03 * truth.metrics["iteration_ms"]
