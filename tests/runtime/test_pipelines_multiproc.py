"""Scheduled pipelines, the torch.distributed.pipelining baseline and DDP under real torchrun (gloo) equal the single-process reference.

One run per strategy and size (launched as one sweep per process count): after 5 steps every parameter equals the
dense reference trained on the same global batches and micro-batches, the
per-step losses match, and the measured events are the executed schedule's
actions in each rank's order.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from runtime_launch import Sweep, dumped_params, step_losses
from workbench.core.ir import Op
from workbench.core.plan import ParallelPlan
from workbench.runtime.events import check_events_follow_schedule, load_measured_timeline, read_events
from workbench.runtime.reference import reference_train
from workbench.runtime.strategies.pipeline import lowered_schedule
from workbench.scheduling.stagecosts import StageCosts

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def assert_matches_reference(run_dir, config, ranks):
    reference = reference_train(config)
    torch.testing.assert_close(step_losses(run_dir), reference.losses, rtol=1e-6, atol=1e-6)
    params = dumped_params(run_dir, ranks)
    assert sorted(params) == sorted(reference.params)
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")


def assert_events_follow_schedule(run_dir, config):
    """Iteration ``step * grad_accum + r`` ran the step's schedule (built from the stage costs the start event
    records, for kinds built from them); rounds before the last skip AR and STEP."""
    timeline = load_measured_timeline(run_dir)
    assert timeline.ranks == list(range(config.world_size))
    start = next(e for e in read_events(run_dir, 0) if e["kind"] == "start")
    costs = StageCosts(**start["stage_costs"]) if "stage_costs" in start else None
    for step in range(config.training.steps):
        schedule = lowered_schedule(config, step, costs)
        for r in range(config.training.grad_accum):
            executed = schedule
            if r < config.training.grad_accum - 1:
                executed = replace(schedule, ranks=tuple(
                    tuple(a for a in schedule.actions(rank) if a.op not in (Op.ALL_REDUCE, Op.STEP))
                    for rank in range(schedule.num_ranks)))
            check_events_follow_schedule(timeline, executed, iteration=step * config.training.grad_accum + r)


PIPELINES = [
    ("pp2-gpipe-m2", {"training": {"grad_accum": 2}}),
    ("torchpp2-1f1b-m4", {"training": {"optimizer": {"name": "adam", "lr": 0.01}}}),
    ("pp4-gpipe-m4", {"training": {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}}),
    ("pp4-1f1b-m4", {}),
    ("pp2-interleaved-v2-m4", {}),
    ("pp4-interleaved-v2-m4", {"model": {"name": "mlp", "overrides": {"depth": 7}}}),
]
RUNS = {plan: (ParallelPlan.parse(plan).pp, {"plan": plan, **extra}) for plan, extra in PIPELINES}
RUNS["gropipe-2x2-gpipe-m4-d0"] = (4, {"plan": "gropipe-2x2-gpipe-m4-d0",
                                       "training": {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}})
RUNS["dp2-m2"] = (2, {"plan": "dp2-m2", "training": {"grad_accum": 2}})
# fused weight-gradient accumulation: accumulation rounds, recomputation, GroPipe's flat buffers, GPT-2's Conv1D
FUSED = {
    "pp2-1f1b-m4-fused": (2, {"plan": "pp2-1f1b-m4", "training": {"grad_accum": 2, "fused_weight_grads": True}}),
    "pp2-gpipe-m2-rc-fused": (2, {"plan": "pp2-gpipe-m2-rc", "training": {"fused_weight_grads": True}}),
    "gropipe-2x2-1f1b-m2-d0-fused": (4, {"plan": "gropipe-2x2-1f1b-m2-d0", "training": {
        "fused_weight_grads": True, "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}}),
    "pp2-1f1b-m2-gpt2-fused": (2, {"plan": "pp2-1f1b-m2", "training": {"global_batch": 8, "fused_weight_grads": True},
                                   "model": {"name": "gpt2-tiny", "overrides": {
                                       "n_layer": 2, "seq_len": 16, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                                       "attn_pdrop": 0.0}},
                                   "data": {"kind": "bytes-lm", "seq_len": 16}}),
}
RUNS.update(FUSED)
RUNS["dp2-m2-rc"] = (2, {"plan": "dp2-m2-rc", "training": {"grad_accum": 2}})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return Sweep(tmp_path_factory.mktemp("pipelines"), RUNS)


@pytest.mark.parametrize("plan", [plan for plan, _ in PIPELINES])
def test_pipeline_equals_reference(sweep, plan):
    stages = ParallelPlan.parse(plan).pp
    config, run_dir = sweep.run(plan), sweep.dir(plan)
    assert config.world_size == stages
    assert_matches_reference(run_dir, config, list(range(stages)))
    if config.plan.family != "torch":  # torch's schedule records no per-action events
        assert_events_follow_schedule(run_dir, config)


def test_gropipe_delay0_equals_reference(sweep):
    config, run_dir = sweep.run("gropipe-2x2-gpipe-m4-d0"), sweep.dir("gropipe-2x2-gpipe-m4-d0")
    assert_matches_reference(run_dir, config, [0, 1])
    torch.testing.assert_close(dumped_params(run_dir, [2, 3]), dumped_params(run_dir, [0, 1]), rtol=0, atol=0)
    assert_events_follow_schedule(run_dir, config)


@pytest.mark.parametrize("recompute", [False, True])
def test_ddp_equals_reference(sweep, recompute):
    key = "dp2-m2-rc" if recompute else "dp2-m2"
    config, run_dir = sweep.run(key), sweep.dir(key)
    assert config.plan.recompute is recompute
    reference = reference_train(config)
    torch.testing.assert_close(step_losses(run_dir), reference.losses, rtol=1e-6, atol=1e-6)
    params = dumped_params(run_dir, [0])
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")


@pytest.mark.parametrize("key", list(FUSED))
def test_fused_weight_grads_equal_reference(sweep, key):
    """Weight gradients accumulated inside the linear layers' products train the reference's parameters."""
    config, run_dir = sweep.run(key), sweep.dir(key)
    assert config.training.fused_weight_grads
    start = next(e for e in read_events(run_dir, 0) if e["kind"] == "start")
    assert start["fused_layers"] >= 1
    assert_matches_reference(run_dir, config, list(range(config.plan.pp)))
    assert_events_follow_schedule(run_dir, config)
