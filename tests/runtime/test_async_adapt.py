"""An async pipeline that re-decides its depths at run time (``adapt_every``), under real torchrun (gloo).

Launched with one micro-batch in flight per stage (no pipelining), the first decision from the stage times the
run measured deepens it; the change is an ``adapt`` run event, a mark on the measured timeline, and in the memory
report. Training stays exact across it: the final weights equal a one-process reference that runs every
micro-batch on the weight version the run's own events say it used, and every backward read its forward's
version.
"""

from __future__ import annotations

import json

import pytest
import torch

from runtime_launch import dumped_params, run_ok, stashing_reference
from workbench.core.rundir import read_events
from workbench.jobs.status import JobStatus
from workbench.jobs.monitor_model import RunState
from workbench.runtime.events import load_measured_timeline
from workbench.scheduling.adaptive import adapt_inflight
from workbench.scheduling.stagecosts import StageCosts
from workbench.viz.timeline import timeline_figure

ADAPT = {"plan": "async-1x2-m4-if1-adapt2", "training": {"steps": 9, "global_batch": 16}}


def test_adapt_deepens_a_shallow_pipeline_and_keeps_a_fitting_one():
    costs = StageCosts.uniform(2, forward_ms=5.0, backward_ms=10.0, param_bytes=2**20, activation_bytes=2**20)
    deeper = adapt_inflight(costs, 4, inflight=(1, 1), mode="stash")
    assert deeper.changes((1, 1), "stash") and sum(deeper.inflight) > 2 and deeper.mode == "stash"
    again = adapt_inflight(costs, 4, inflight=deeper.inflight, mode="stash")
    assert not again.changes(deeper.inflight, "stash"), again.reason


def test_adapt_switches_to_two_weight_versions_when_stashing_does_not_fit():
    """Four stages with heavy weights: stashing a version per iteration in flight overflows the cap on the first
    stage even at its shallowest useful depth, PipeDream-2BW's two versions fit."""
    costs = StageCosts.uniform(4, forward_ms=5.0, backward_ms=10.0, param_bytes=64 * 2**20, activation_bytes=2**20)
    from workbench.scheduling.adaptive import evaluate_inflight
    stash = max(evaluate_inflight(costs, 4, (4, 3, 2, 1), mode="stash")["peak_bytes"])
    twobw = min(max(evaluate_inflight(costs, 4, (k,) * 4, mode="2bw")["peak_bytes"]) for k in (1, 2))
    cap = (stash + twobw) // 2
    assert twobw < cap < stash
    switched = adapt_inflight(costs, 4, inflight=(4, 3, 2, 1), mode="stash", memory_cap_bytes=cap)
    if switched.mode == "stash":  # a shallower stash depth may fit too; then it must fit and be what was chosen
        assert max(evaluate_inflight(costs, 4, switched.inflight, mode="stash")["peak_bytes"]) <= cap
    else:
        assert switched.mode == "2bw" and "over the" in switched.reason
    with pytest.raises(ValueError, match="modes must be"):
        adapt_inflight(costs, 4, inflight=(1,) * 4, mode="sync")


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_run_that_adapts_records_the_change_and_trains_exactly(tmp_path):
    config = run_ok(tmp_path, 2, **ADAPT)
    adapts = [r for r in read_events(tmp_path) if r["kind"] == "adapt"]
    # a decision at the end of every stream but the last: the first changes the depths, so the next comes
    # adapt_every steps later; the interval doubles after a decision that changes nothing
    expected, step, interval = [], 2, 2
    while step < ADAPT["training"]["steps"] and len(expected) < len(adapts):
        expected.append(step)
        interval = 2 if adapts[len(expected) - 1]["changed"] else 2 * interval
        step += interval
    assert [r["step"] for r in adapts] == expected and step >= ADAPT["training"]["steps"], [r["step"] for r in adapts]
    first = adapts[0]
    assert first["inflight_from"] == [1, 1] and first["changed"] and sum(first["inflight_to"]) > 2, first
    assert all(ms > 0 for ms in first["measured"]["forward_ms"] + first["measured"]["backward_ms"])
    report = json.loads((tmp_path / "memory" / "rank0.json").read_text())
    assert report["adaptations"][0]["inflight_to"] == first["inflight_to"]

    timeline = load_measured_timeline(tmp_path)
    marks = timeline.meta["marks"]
    assert marks and marks[0]["step"] == 2 and "in flight 1/1 ->" in marks[0]["label"]
    steps_before = [e.end for e in timeline.events if e.op == "STEP" and e.iteration == 1]
    assert max(steps_before) <= marks[0]["time"] + 1.0, "the mark sits where the first stream drained"
    assert any(shape.type == "line" for shape in timeline_figure(timeline).layout.shapes)

    # the monitor's state and `workbench status` show the decisions; the live timeline of the iteration the
    # change took effect in carries its mark
    state = RunState()
    state.apply(read_events(tmp_path))
    assert [a["step"] for a in state.adaptations] == expected
    live = state.timeline(2)
    assert live.meta["marks"][0]["label"] == marks[0]["label"]
    status = JobStatus.from_dict(JobStatus("SUCCEEDED", adaptations=tuple(state.adaptations)).to_dict())
    assert len(status.adaptations) == len(expected)
    assert f"  {marks[0]['label']}" in status.text().splitlines()

    versions, backward = {}, {}
    for e in timeline.events:
        if e.op == "F":
            versions[(e.stage, e.iteration, e.microbatch)] = e.version
        elif e.op == "B":
            backward[(e.stage, e.iteration, e.microbatch)] = e.version
    assert versions == backward, "every backward reads its forward's version"
    assert len(versions) == 2 * 4 * ADAPT["training"]["steps"]
    reference = stashing_reference(config, versions)
    params = dumped_params(tmp_path, [0, 1])
    for name, value in reference.items():
        torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-6, msg=name)
