"""A new pipeline kind is a spec, a generator and one registry line: this test adds one and uses it everywhere.

The kind below, ``lifo`` (GPipe's forwards, then the backwards newest
micro-batch first), is declared in this file and nowhere else. Registered,
its plans parse and print, its [plan] tables round-trip, its schedule
validates, simulates and is drawn, the planner's template search ranks it,
and it trains on 2 gloo ranks (which import this module as the run's
plugin) to the single-process reference.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from workbench.core.ir import Action, Op, Schedule, ScheduleMeta
from workbench.core.pipelines import PIPELINE_KINDS, OnePipeline
from workbench.scheduling.registry import register


@dataclass(frozen=True)
class LastInFirstOut(OnePipeline):
    """Every forward, then the backwards from the newest micro-batch to the oldest."""

    kind: ClassVar[str] = "lifo"
    token: ClassVar[str] = "lifo"
    searched: ClassVar[bool] = False  # registered while the whole suite runs: the planner's golden cases stay as they are


def lifo(spec, request) -> Schedule:
    p, m = request.stages, request.microbatches
    ranks = [[Action(s, Op.FORWARD, k) for k in range(m)] + [Action(s, Op.BACKWARD, k) for k in reversed(range(m))]
             for s in range(p)]
    return Schedule(tuple(map(tuple, ranks)), name="lifo", num_stages=p, num_microbatches=m,
                    meta=ScheduleMeta(stage_to_rank=(tuple(range(p)),)))


register(LastInFirstOut, lifo)


def test_the_new_kind_parses_validates_simulates_and_is_drawn():
    from workbench.core.plan import ParallelPlan
    from workbench.scheduling.passes import lower
    from workbench.scheduling.registry import schedule_for, stage_memory
    from workbench.scheduling.simulate import simulate
    from workbench.scheduling.stagecosts import StageCosts
    from workbench.scheduling.validate import validate
    from workbench.viz.timeline import timeline_figure

    assert PIPELINE_KINDS["lifo"] is LastInFirstOut
    plan = ParallelPlan.parse("pp3-lifo-m4")
    assert plan.pipeline == LastInFirstOut() and plan.name == "pp3-lifo-m4" and plan.family == "pipeline"
    assert ParallelPlan.from_dict(plan.to_dict()) == plan
    assert ParallelPlan.from_dict({"mesh": {"dp": 1, "pp": 3}, "microbatches": 4, "pipeline": {"kind": "lifo"}}) == plan
    schedule = schedule_for(plan)
    validate(lower(schedule))
    result = simulate(schedule, StageCosts.uniform(3, activation_bytes=10))
    gpipe = simulate(schedule_for(ParallelPlan.parse("pp3-gpipe-m4")), StageCosts.uniform(3, activation_bytes=10))
    assert result.metrics["iteration_ms"] == pytest.approx(gpipe.metrics["iteration_ms"])  # the same bubble
    assert stage_memory(plan).in_flight == (4, 4, 4)
    figure = timeline_figure(result.timeline, title=plan.name)
    assert sum(len(trace.x) for trace in figure.data if trace.x is not None) > 0


def test_the_planner_ranks_the_new_kind():
    from workbench.core.costs import ModelCosts
    from workbench.planning import Budget, SearchOptions, Workload, plan

    costs = ModelCosts.uniform(8, forward_ms=1.0, backward_ms=2.0, activation_bytes=1000, batch_size=8)
    names = ["pp4-lifo-m4", "pp4-gpipe-m4", "pp4-1f1b-m4"]
    result = plan(Workload(costs, 16), "4xV100-NVLink", Budget(world_size=4), SearchOptions(strategies=names))
    ranked = {p.name: p.estimate for p in result.plans}
    assert {"pp4-lifo-m4", "pp4-gpipe-m4"} <= set(ranked), [i["name"] for i in result.infeasible]
    # the same forwards as GPipe, so the same time and the same activations in flight
    assert ranked["pp4-lifo-m4"].iteration_ms == pytest.approx(ranked["pp4-gpipe-m4"].iteration_ms, rel=1e-6)
    assert ranked["pp4-lifo-m4"].memory_bytes == ranked["pp4-gpipe-m4"].memory_bytes


@pytest.mark.multiproc
@pytest.mark.slow
def test_the_new_kind_trains_on_two_ranks_to_the_reference(tmp_path, monkeypatch):
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from runtime_launch import dumped_params, run_ok, step_losses
    from workbench.runtime.reference import reference_train

    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    config = run_ok(tmp_path, 2, plan="pp2-lifo-m4", plugins=["test_registry"],
                    optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9})
    reference = reference_train(config)
    torch.testing.assert_close(step_losses(tmp_path), reference.losses, rtol=0, atol=1e-5)
    params = dumped_params(tmp_path, [0, 1])
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=name)
