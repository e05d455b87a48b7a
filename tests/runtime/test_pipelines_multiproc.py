"""Scheduled pipelines, the torch.distributed.pipelining baseline and DDP under real torchrun (gloo) equal the single-process reference.

One launch per strategy and size: after 5 steps every parameter equals the
dense reference trained on the same global batches and micro-batches, the
per-step losses match, and the measured events are the executed schedule's
actions in each rank's order.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from runtime_launch import dumped_params, run_ok, step_losses
from workbench.core.ir import Op
from workbench.runtime.events import check_events_follow_schedule, load_measured_timeline
from workbench.runtime.reference import reference_train
from workbench.runtime.strategies.pipeline import lowered_schedule

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def assert_matches_reference(run_dir, config, ranks):
    reference = reference_train(config)
    torch.testing.assert_close(step_losses(run_dir), reference.losses, rtol=1e-6, atol=1e-6)
    params = dumped_params(run_dir, ranks)
    assert sorted(params) == sorted(reference.params)
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")


def assert_events_follow_schedule(run_dir, config):
    """Iteration ``step * grad_accum + r`` ran the step's schedule; rounds before the last skip AR and STEP."""
    timeline = load_measured_timeline(run_dir)
    assert timeline.ranks == list(range(config.world_size))
    for step in range(config.steps):
        schedule = lowered_schedule(config, step)
        for r in range(config.grad_accum):
            executed = schedule
            if r < config.grad_accum - 1:
                executed = replace(schedule, ranks=tuple(
                    tuple(a for a in schedule.actions(rank) if a.op not in (Op.ALL_REDUCE, Op.STEP))
                    for rank in range(schedule.num_ranks)))
            check_events_follow_schedule(timeline, executed, iteration=step * config.grad_accum + r)


@pytest.mark.parametrize(("strategy", "stages", "extra"), [
    ("gpipe", 2, {"grad_accum": 2, "microbatches": 2}),
    ("torch-pipelining", 2, {"optimizer": {"name": "adam", "lr": 0.01}}),
    ("gpipe", 4, {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}),
    ("1f1b", 4, {}),
    ("interleaved", 2, {"chunks": 2}),
    ("interleaved", 4, {"chunks": 2, "model_overrides": {"depth": 7}, "microbatches": 4}),
])
def test_pipeline_equals_reference(tmp_path, strategy, stages, extra):
    config = run_ok(tmp_path, stages, strategy=strategy, stages=stages, **extra)
    assert_matches_reference(tmp_path, config, list(range(stages)))
    if strategy != "torch-pipelining":  # torch's schedule records no per-action events
        assert_events_follow_schedule(tmp_path, config)


def test_gropipe_delay0_equals_reference(tmp_path):
    config = run_ok(tmp_path, 4, strategy="gropipe", groups=2, stages=2, delay=0, inner="gpipe",
                    optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9})
    assert_matches_reference(tmp_path, config, [0, 1])
    torch.testing.assert_close(dumped_params(tmp_path, [2, 3]), dumped_params(tmp_path, [0, 1]), rtol=0, atol=0)
    assert_events_follow_schedule(tmp_path, config)


@pytest.mark.parametrize("recompute", [False, True])
def test_ddp_equals_reference(tmp_path, recompute):
    config = run_ok(tmp_path, 2, strategy="ddp", groups=2, grad_accum=2, microbatches=2, recompute=recompute)
    reference = reference_train(config)
    torch.testing.assert_close(step_losses(tmp_path), reference.losses, rtol=1e-6, atol=1e-6)
    params = dumped_params(tmp_path, [0])
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")
