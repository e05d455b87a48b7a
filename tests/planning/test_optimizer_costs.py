"""The optimizer a workload trains with decides its state and its step, whichever optimizer the profile was taken for;
pipelines pay for accumulating gradients over micro-batches, and GroPipe's step for the passes over its flat
gradient buffer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from workbench.core.costs import LayerCost, ModelCosts
from workbench.planning import Budget, SearchOptions, Workload, load_cluster, plan
from workbench.scheduling.stagecosts import for_optimizer, optimizer_bytes

PARAMS = 4_000_000


def _profile(states_per_param: int, profiled_for: str | None) -> ModelCosts:
    layer = LayerCost("l", 1.0, 2.0, param_bytes=PARAMS, activation_bytes=1_000_000, grad_bytes=PARAMS,
                      optimizer_bytes=states_per_param * PARAMS)
    meta = {} if profiled_for is None else {"optimizer": profiled_for}
    return ModelCosts("m", 8, "synthetic", tuple(replace(layer, name=f"l{i}") for i in range(4)), meta=meta)


def _states(costs: ModelCosts, optimizer: str) -> list[int]:
    return [optimizer_bytes(l, optimizer) for l in costs.layers]


def test_a_profile_taken_for_adam_is_costed_for_the_workloads_optimizer():
    adam = _profile(2, "adam")
    assert Workload(adam, 32).costs is adam  # the same optimizer: the profile's own figures
    assert _states(Workload(adam, 32, optimizer="sgd").costs, "sgd") == [0] * 4
    assert _states(Workload(adam, 32, optimizer="sgd-momentum").costs, "sgd-momentum") == [PARAMS] * 4
    # the profiler's "sgd" keeps a momentum buffer: the planner's "sgd-momentum", so its figures stay
    momentum = _profile(1, "sgd")
    assert for_optimizer(momentum, "sgd-momentum") is momentum
    assert _states(for_optimizer(momentum, "adam"), "adam") == [2 * PARAMS] * 4
    # a profile that does not say what it was taken for keeps its figures
    unknown = _profile(2, None)
    assert for_optimizer(unknown, "sgd") is unknown


def test_plain_sgd_needs_less_memory_and_a_shorter_step_than_adam():
    costs = _profile(2, "adam")
    found = {opt: plan(Workload(costs, 32, optimizer=opt), "8xV100-PCIe", Budget(world_size=2),
                       SearchOptions(strategies=["dp2"]))["dp2"].estimate for opt in ("adam", "sgd")}
    states = 4 * 2 * PARAMS  # Adam's two moments of the four layers, on each replica
    assert found["adam"].memory_bytes - found["sgd"].memory_bytes == states
    assert found["sgd"].iteration_ms < found["adam"].iteration_ms


def test_gropipe_steps_pay_the_division_and_zeroing_of_their_flat_gradient_buffer():
    costs = _profile(2, "adam")
    names = ["gropipe-2x2-1f1b-m4-d0", "gropipe-1x2-1f1b-m4-d0"]

    def step_ms(name: str) -> float:
        world = 4 if name == names[0] else 2
        found = plan(Workload(costs, 32), "8xV100-PCIe", Budget(world_size=world), SearchOptions(strategies=[name]))
        assert str(found[name].estimate.partition) == "0-1|2-3"
        return [e.end - e.start for e in found[name].timeline().events if e.op == "STEP" and e.rank == 0][0]

    bandwidth = load_cluster("8xV100-PCIe").device.memory_bandwidth_gbs * 1e9
    stage_grads = 2 * PARAMS
    optimizer = (2 * 2 * PARAMS + stage_grads + 2 * 2 * 2 * PARAMS) / bandwidth * 1e3  # parameters, grads, moments
    # two groups: divide (a read and a write of the buffer) and zero (a write); one group: only zero
    assert step_ms(names[0]) == pytest.approx(optimizer + 3 * stage_grads / bandwidth * 1e3)
    assert step_ms(names[1]) == pytest.approx(optimizer + stage_grads / bandwidth * 1e3)


def test_accumulating_gradients_over_microbatches_is_charged_to_the_backward():
    """The profile times a backward into fresh gradients; a pipeline adds each micro-batch's after the first to
    the ones there (a read of both and a write: three passes), GroPipe every one (its buffer starts zeroed)."""
    costs = _profile(2, "adam")
    bandwidth = load_cluster("8xV100-PCIe").device.memory_bandwidth_gbs * 1e9
    accumulate_ms = 3 * 2 * PARAMS / bandwidth * 1e3  # one stage's gradients, read twice and written once

    def backward_ms(name: str, batch: int) -> float:
        world = 4 if name.startswith("gropipe-2x") else 2
        found = plan(Workload(costs, batch), "8xV100-PCIe", Budget(world_size=world), SearchOptions(strategies=[name]))
        assert str(found[name].estimate.partition) == "0-1|2-3"
        return [e.end - e.start for e in found[name].timeline().events if e.op == "B" and e.rank == 0][0]

    # micro-batches of 8 samples throughout
    fresh = backward_ms("pp2-1f1b-m1", 8)  # one micro-batch: its gradients are the first
    assert backward_ms("pp2-1f1b-m4", 32) == pytest.approx(fresh + 3 / 4 * accumulate_ms)
    assert backward_ms("gropipe-1x2-1f1b-m4-d0", 32) == pytest.approx(fresh + accumulate_ms)
    assert backward_ms("gropipe-1x2-1f1b-m1-d0", 8) == pytest.approx(fresh + accumulate_ms)
