"""PlanExplorer driven from Python: the planner's ranking, its breakdown and a click-through (no kernel)."""

import random

import plotly.graph_objects as go
import pytest
from plotly.callbacks import Points

from workbench.core.costs import LayerCost, ModelCosts
from workbench.planning import SearchOptions, Workload, plan
from workbench.widgets.plan_explorer import PlanExplorer


@pytest.fixture(scope="module")
def costs():
    rng = random.Random(1)
    return ModelCosts("synthetic", 32, "synthetic", tuple(
        LayerCost(f"layer{i}", rng.uniform(0.5, 2.0), rng.uniform(1.0, 4.0), param_bytes=rng.randint(1, 8) * 2**20,
                  activation_bytes=2**20, saved_bytes=2**20) for i in range(16)))


@pytest.fixture(scope="module")
def result(costs):
    return plan(Workload(costs, 32), "4xV100-NVLink", options=SearchOptions(top=6, recompute=(False,)))


def test_shows_the_ranking_with_a_breakdown_that_adds_up(costs, result):
    explorer = PlanExplorer(costs, "4xV100-NVLink", 32, result=result)
    names = [p.name for p in result.plans]
    assert list(explorer.strategy.options) == names and explorer.strategy.value == result.best.name
    assert explorer.table.value.count("<tr>") == len(names) + 1
    compute, bubble, comm, memory = explorer.breakdown_fig.data
    assert list(compute.y) == names
    for i, p in enumerate(result.plans):
        assert compute.x[i] + bubble.x[i] + comm.x[i] == pytest.approx(p.estimate.iteration_ms)
        assert memory.x[i] == pytest.approx(p.estimate.memory_gib)
    assert list(compute.marker.line.width) == [3] + [0] * (len(names) - 1)
    assert f"#1 {result.best.name}" in explorer.detail.value
    if result.infeasible:
        assert f"{len(result.infeasible)} strategies cannot run" in explorer.infeasible.value
        assert result.infeasible[0]["name"] in explorer.infeasible.value
    else:
        assert explorer.infeasible.value == "every strategy searched fits"
    listed = PlanExplorer._infeasible_html([{"name": f"s{i}", "reason": "too big"} for i in range(14)])
    assert "14 strategies cannot run" in listed and listed.count("too big") == 12 and "and 2 more" in listed


def test_clicking_a_bar_selects_its_plan_and_draws_its_timeline(costs, result):
    explorer = PlanExplorer(costs, "4xV100-NVLink", 32, result=result)
    simulated = [i for i, p in enumerate(result.plans) if p.timeline() is not None and i > 0]
    index = simulated[0]
    chosen = result.plans[index]
    trace = explorer.breakdown_fig.data[1]
    explorer._on_bar_click(trace, Points(point_inds=[index], xs=[trace.x[index]], ys=[trace.y[index]],
                                         trace_name=trace.name, trace_index=1))
    assert explorer.strategy.value == chosen.name and explorer.selected is chosen
    assert list(explorer.breakdown_fig.data[0].marker.line.width)[index] == 3
    assert sum(explorer.breakdown_fig.data[0].marker.line.width) == 3
    assert f"#{chosen.rank} {chosen.name}" in explorer.detail.value and "launch config" in explorer.detail.value
    assert chosen.name in explorer.timeline_fig.layout.title.text
    drawn = sum(len(t.x) for t in explorer.timeline_fig.data if not t.name.startswith("idle"))
    assert drawn == sum(1 for e in chosen.timeline() if e.end > e.start)
    with pytest.raises(ValueError, match="no ranked plan named 'dp99'"):
        explorer.select("dp99")


def test_replanning_follows_the_controls(costs):
    explorer = PlanExplorer(costs, "4xV100-NVLink", 32, top=4, options=SearchOptions(recompute=(False,)))
    assert explorer.result.cluster.name == "4xV100-NVLink" and len(explorer.strategy.options) == 4
    explorer.cluster.value = "8xV100-PCIe"
    explorer.top.value = 3
    explorer.plan_button.click()
    assert explorer.result.cluster.name == "8xV100-PCIe" and len(explorer.strategy.options) == 3
    assert all(p.plan.world_size == 8 for p in explorer.result.plans)
    explorer.memory_cap.value = 0.001
    explorer.plan_button.click()
    assert "no strategy" in explorer.error.value and explorer.result.cluster.name == "8xV100-PCIe"


def test_static_figures_and_bad_input(costs, result, tmp_path):
    explorer = PlanExplorer(costs, "4xV100-NVLink", 32, result=result)
    figures = explorer.figures()
    assert all(isinstance(f, go.Figure) and not isinstance(f, go.FigureWidget) for f in figures)
    assert list(figures[0].data[0].y) == [p.name for p in result.plans]
    path = costs.save(tmp_path / "costs.json")
    assert PlanExplorer(path, "4xV100-NVLink", 32, result=result).costs == costs
    with pytest.raises(ValueError, match="cluster must be one of .*; got 'moon'"):
        PlanExplorer(costs, "moon", 32)
    with pytest.raises(ValueError, match="global_batch must be an int >= 1, got 0"):
        PlanExplorer(costs, "4xV100-NVLink", 0)
    with pytest.raises(ValueError, match="ModelCosts JSON file, got 'nothing.json'"):
        PlanExplorer("nothing.json")


def test_the_progress_bar_follows_the_search_and_an_interrupt_keeps_the_best_so_far(costs):
    explorer = PlanExplorer(costs, "4xV100-NVLink", 32, top=4, options=SearchOptions(recompute=(False,)))
    shown: list[tuple[str, int, int]] = []
    explorer.progress.observe(lambda c: shown.append((explorer.progress.description, c["new"],
                                                      explorer.progress.max)), names="value")
    explorer.plan_button.click()
    assert explorer.progress.layout.visibility == "hidden" and explorer.error.value == ""
    last = shown[-1]
    assert last[0] == f"simulating {last[2]}/{last[2]}" and last[1] == last[2]
    assert any(d.startswith("projecting") for d, _, _ in shown)
    advance = explorer._advance

    def interrupt(phase: str, done: int, total: int) -> None:
        advance(phase, done, total)
        if phase == "simulating" and done == 1:
            raise KeyboardInterrupt

    explorer._advance = interrupt
    explorer.plan_button.click()
    assert explorer.result.interrupted and "interrupted: the best plans found so far" in explorer.error.value
    assert explorer.strategy.options  # the plans found so far are listed
