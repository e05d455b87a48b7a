"""ScheduleExplorer driven from Python: formula beside simulation, stepping, comparing (no kernel)."""

import plotly.graph_objects as go
import pytest

from workbench.widgets.schedule_explorer import (
    EXPLORER_SCHEDULES,
    ScheduleExplorer,
    bubble_formula,
    build_schedule,
    uniform_stage_costs,
)


@pytest.mark.parametrize("kind", EXPLORER_SCHEDULES)
@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 8), (3, 9)])
def test_formula_equals_the_simulated_bubble_on_identical_stages(kind, stages, microbatches):
    if kind == "interleaved" and microbatches % stages:
        microbatches = stages * 2
    if kind == "dualpipev":
        microbatches = max(microbatches, 2 * stages)
    explorer = ScheduleExplorer(kind, stages=stages, microbatches=microbatches, backward_ratio=1.5)
    if explorer.formula_value() is None:  # no closed form at this ratio (zb-auto, the V shapes): said so
        assert "no closed form" in explorer.formula.value
        explorer.backward_ratio.value = 2.0  # F = I = W
        if explorer.formula_value() is None:
            return
    formula, _ = explorer.formula_value()
    assert explorer.simulated_bubble_fraction(explorer.result) == pytest.approx(formula, abs=1e-9)
    assert f"{100 * formula:.1f}%" in explorer.formula.value
    assert f"{100 * formula:.1f}%" in explorer.simulated_bubble.value


def test_changing_controls_updates_the_model_and_the_figure():
    explorer = ScheduleExplorer("gpipe", stages=4, microbatches=4)
    assert explorer.simulated_bubble_fraction(explorer.result) == pytest.approx(3 / 7)
    widths = sorted(explorer.figure_widget.data[1].x)  # backward bars
    explorer.backward_ratio.value = 3.0
    assert sorted(explorer.figure_widget.data[1].x) != pytest.approx(widths)
    assert max(explorer.figure_widget.data[1].x) == pytest.approx(3.0)
    explorer.microbatches.value = 12
    assert explorer.simulated_bubble_fraction(explorer.result) == pytest.approx(3 / 15)
    assert "3/(12+3)" in explorer.formula.value
    assert explorer.chunks.disabled and explorer.groups.disabled and explorer.iterations.disabled
    explorer.schedule.value = "interleaved"
    assert explorer.result.schedule.name == "interleaved" and not explorer.chunks.disabled
    assert explorer.simulated_bubble_fraction(explorer.result) == pytest.approx(3 / (2 * 12 + 3))


def test_communication_adds_bubble_beyond_the_formula():
    explorer = ScheduleExplorer("1f1b", stages=4, microbatches=8)
    free = explorer.simulated_bubble_fraction(explorer.result)
    explorer.comm_ratio.value = 0.5
    assert explorer.simulated_bubble_fraction(explorer.result) > free + 0.05
    assert "assumes free communication" in explorer.formula.value
    lanes = {y for trace in explorer.figure_widget.data for y in trace.y}
    assert "rank 0 comm" in lanes


def test_stepping_through_time_slots():
    explorer = ScheduleExplorer("1f1b", stages=4, microbatches=8, backward_ratio=2.0)
    assert explorer.slot.value == 0 and explorer.slot_actions() == {0: "0F0", 1: "idle", 2: "idle", 3: "idle"}
    explorer.step(3)
    assert explorer.slot_actions() == {0: "0F3", 1: "1F2", 2: "2F1", 3: "3F0"}
    assert "4 of 4 ranks busy" in explorer.slot_grid.value
    assert explorer.figure_widget.layout.shapes[0].x0 == pytest.approx(explorer.slots[3])
    explorer.step(-10)
    assert explorer.slot.value == 0
    explorer.step(10_000)
    assert explorer.slot.value == len(explorer.slots) - 1 == explorer.slot.max
    assert explorer.slot_actions()[0] == "0B7"
    with pytest.raises(ValueError, match="slot must be from 0 to"):
        explorer.slot_actions(len(explorer.slots))


def test_two_schedules_side_by_side():
    explorer = ScheduleExplorer("gpipe", stages=4, microbatches=8, compare="interleaved")
    figure = explorer.figure()
    assert [a.text for a in figure.layout.annotations][:2] == ["gpipe", "interleaved"]
    assert "gpipe formula" in explorer.formula.value and "interleaved formula" in explorer.formula.value
    assert explorer.other.metrics["iteration_ms"] < explorer.result.metrics["iteration_ms"]
    assert {t.xaxis for t in explorer.figure_widget.data} == {"x", "x2"}
    explorer.compare.value = "none"
    assert explorer.other is None and {t.xaxis for t in explorer.figure_widget.data} == {None}
    assert isinstance(explorer.figure(), go.Figure)


def test_helpers_and_bad_input():
    schedule = build_schedule("gropipe", 2, 4, groups=3, delay=1)
    costs, cluster = uniform_stage_costs(schedule, backward_ratio=2.0, comm_ratio=0.25)
    assert schedule.num_ranks == 6 and cluster.world_size == 6
    assert cluster.intra_node.transfer_ms(costs.send_bytes[0]) == pytest.approx(0.25)
    assert bubble_formula("interleaved", 4, 8, chunks=2)[0] == pytest.approx(3 / 19)
    with pytest.raises(ValueError, match="schedule must be one of gpipe, 1f1b, interleaved, zbh1, .*; got 'x'"):
        ScheduleExplorer("x")
    with pytest.raises(ValueError, match="stages must be an int from 1 to 16, got 0"):
        ScheduleExplorer(stages=0)
    with pytest.raises(ValueError, match="comm_ratio must be a number from 0 to 2.0, got -1"):
        ScheduleExplorer(comm_ratio=-1)
    explorer = ScheduleExplorer("interleaved", stages=4, microbatches=8)
    explorer.microbatches.value = 6
    assert "interleaved 1F1B needs a multiple of pp (4)" in explorer.error.value


def test_without_a_widget_frontend_it_shows_the_summary_and_a_static_figure(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    monkeypatch.setenv("WORKBENCH_STATIC", "1")
    monkeypatch.setenv("WORKBENCH_PLOTLY_RENDERER", "plotly_mimetype")
    explorer = ScheduleExplorer("gpipe", stages=2, microbatches=2)
    InteractiveShell.instance()  # an IPython shell with no kernel: display works, no widget frontend
    try:
        with capture_output() as captured:
            explorer._ipython_display_()
    finally:
        InteractiveShell.clear_instance()
    bundles = [output.data for output in captured.outputs]
    assert "33.3%" in bundles[0]["text/html"] and "formula" in bundles[0]["text/html"]
    figure = bundles[1]["application/vnd.plotly.v1+json"]
    assert {trace["name"] for trace in figure["data"]} >= {"forward (simulated)", "backward (simulated)"}
