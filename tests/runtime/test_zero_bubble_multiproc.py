"""Zero-bubble schedules under real torchrun (gloo) equal the single-process reference, I and W as scheduled.

torch's own zero-bubble schedules (the baselines) are checked the same way.

Every new kind, and GroPipe with a zero-bubble schedule in its groups, on 2
and 4 ranks: after the steps the losses and every parameter equal the dense
model trained in one process on the same micro-batches (1e-5), and the
events each rank recorded are its schedule's actions, input and weight
gradients apart, in order.
"""

from __future__ import annotations

import pytest

from runtime_launch import Sweep
from test_pipelines_multiproc import assert_events_follow_schedule, assert_matches_reference
from workbench.core.plan import ParallelPlan
from workbench.runtime.events import read_events

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

SGD = {"training": {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}}
DEEP = {"model": {"name": "mlp", "overrides": {"depth": 7}}}  # 8 layers: 4 ranks of a V hold 8 stages

RUNS = [
    ("pp2-zbh1-m4", {}),
    ("pp4-zbh1-m4", SGD),
    ("pp2-zbh2-m4", SGD),
    ("pp4-zbh2-m8", {}),
    ("pp2-zbv-m4", SGD),
    ("pp4-zbv-m4", {**SGD, **DEEP}),
    ("pp2-dualpipev-m4", {}),
    ("pp4-dualpipev-m8", {**DEEP, "training": {**SGD["training"], "global_batch": 32}}),
    ("pp2-zbauto-m4", SGD),
    ("pp4-zbauto-m4-mem1", {}),
    ("gropipe-1x2-zbh1-m4-d1", SGD),
    ("gropipe-2x2-zbh2-m4-d0", SGD),
]
# fused weight-gradient accumulation: I queues the linear layers' products, W runs them (MLP; GPT-2's Conv1D)
FUSED = {
    "pp2-zbv-m4-fused": (2, {"plan": "pp2-zbv-m4", "training": {**SGD["training"], "fused_weight_grads": True}}),
    "gropipe-2x2-zbh2-m4-d0-fused": (4, {"plan": "gropipe-2x2-zbh2-m4-d0", "training": {
        **SGD["training"], "fused_weight_grads": True}}),
    "gropipe-1x2-zbh1-m4-d1-fused": (2, {"plan": "gropipe-1x2-zbh1-m4-d1", "training": {
        **SGD["training"], "fused_weight_grads": True}}),
    "pp2-zbauto-m4-fused": (2, {"plan": "pp2-zbauto-m4", "training": {"fused_weight_grads": True}}),  # fused profile
    "pp2-zbh1-m2-gpt2-fused": (2, {"plan": "pp2-zbh1-m2", "training": {"global_batch": 8, "fused_weight_grads": True},
                                   "model": {"name": "gpt2-tiny", "overrides": {
                                       "n_layer": 2, "seq_len": 16, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                                       "attn_pdrop": 0.0}},
                                   "data": {"kind": "bytes-lm", "seq_len": 16}}),
}
# torch's own zero-bubble schedules, the baselines, at the same partition and micro-batches
TORCH_RUNS = ["torchpp2-zbv-m4", "torchpp2-dualpipev-m4", "torchpp2-interleaved-zb-m4"]


LAUNCHES = {plan: (ParallelPlan.parse(plan).world_size, {"plan": plan, **extra}) for plan, extra in RUNS}
LAUNCHES.update({plan: (2, {"plan": plan, **SGD}) for plan in TORCH_RUNS})
LAUNCHES.update(FUSED)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The module's runs, one sweep per process count (2 and 4 ranks)."""
    return Sweep(tmp_path_factory.mktemp("zero_bubble"), LAUNCHES)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("plan", "extra"), RUNS, ids=[r[0] for r in RUNS])
def test_zero_bubble_run_equals_the_reference(sweep, plan, extra):
    ranks = ParallelPlan.parse(plan).world_size
    config, run_dir = sweep.run(plan), sweep.dir(plan)
    assert config.plan.split_backward
    stages = config.plan.pp  # pipeline ranks of the first group (GroPipe's groups hold identical replicas)
    assert_matches_reference(run_dir, config, list(range(stages)))
    assert_events_follow_schedule(run_dir, config)
    if config.plan.pipeline.uses_costs:  # built from the stages as rank 0 profiled them, the same on every rank
        costs = [next(e for e in read_events(run_dir, r) if e["kind"] == "start")["stage_costs"] for r in range(ranks)]
        assert all(c == costs[0] for c in costs) and len(costs[0]["forward_ms"]) == config.plan.num_virtual_stages
        # measured I and W (the first stage's input needs no gradient, so its I costs nothing)
        assert costs[0]["input_grad_ms"][0] == 0 and min(costs[0]["input_grad_ms"][1:]) > 0
        assert min(costs[0]["weight_grad_ms"]) > 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("plan", TORCH_RUNS)
def test_torch_zero_bubble_baseline_equals_the_reference(sweep, plan):
    config, run_dir = sweep.run(plan), sweep.dir(plan)
    assert config.plan.num_virtual_stages == 4  # two stages per rank, as the workbench's kind of that name
    assert_matches_reference(run_dir, config, [0, 1])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", list(FUSED))
def test_fused_zero_bubble_run_equals_the_reference(sweep, key):
    """Split backwards whose weight products of the linear layers wait in a queue for W train the reference."""
    config, run_dir = sweep.run(key), sweep.dir(key)
    assert config.plan.split_backward and config.training.fused_weight_grads
    assert next(e for e in read_events(run_dir, 0) if e["kind"] == "start")["fused_layers"] >= 1
    assert_matches_reference(run_dir, config, list(range(config.plan.pp)))
    assert_events_follow_schedule(run_dir, config)
