"""Timeline and balance figures are built from the data they are given (no hard-coded values)."""

import json

import plotly.graph_objects as go
import pytest

from workbench.core.costs import ModelCosts
from workbench.core.timeline import Event, Timeline
from workbench.planning.partitioning.ampa import ampa
from workbench.planning.costs.clusters import get_cluster
from workbench.scheduling import generators as g
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts
from workbench.viz.balance import balance_figure
from workbench.viz.timeline import idle_gaps, timeline_figure


def _bars(fig, category):
    return [t for t in fig.data if t.name.startswith(category)]


def test_one_f_one_b_timeline_has_every_action_and_idle():
    res = simulate(g.one_f_one_b(3, 4))
    fig = timeline_figure(res, title="1F1B")
    assert isinstance(fig, go.Figure) and fig.layout.title.text == "1F1B"
    forward = _bars(fig, "forward")[0]
    assert len(forward.x) == 12 and sorted(forward.text) == sorted([str(m) for m in range(4)] * 3)
    idle = _bars(fig, "idle")[0]
    # the bubble drawn equals the simulator's bubble fraction on every rank
    for r in range(3):
        drawn = sum(x for x, y in zip(idle.x, idle.y) if y == f"rank {r}")
        assert drawn == pytest.approx(res.metrics["bubble_fraction"][r] * res.metrics["makespan_ms"])


def test_async_labels_carry_weight_versions_and_comm_gets_its_own_lane():
    res = simulate(g.async_1f1b(3, 2, 3), StageCosts.uniform(3, send_bytes=10**7), get_cluster("8xV100-PCIe"))
    fig = timeline_figure(res.timeline)
    labels = set(_bars(fig, "forward")[0].text)
    assert {"0 v0", "0/i1 v0", "0/i2 v1"} <= labels
    comm = _bars(fig, "send/recv")[0]
    assert set(comm.y) <= {f"rank {r} comm" for r in range(3)} and len(comm.x) > 0
    assert list(fig.layout.yaxis.categoryarray)[-1] == "rank 0"  # rank 0 on top


def test_simulated_and_measured_overlay_and_side_by_side():
    sim = simulate(g.gpipe(2, 2)).timeline
    measured = Timeline(tuple(Event(rank=e.rank, stage=e.stage, op=e.op, start=e.start * 1.1, end=e.end * 1.1,
                                    microbatch=e.microbatch, source="measured") for e in sim.events))
    overlay = timeline_figure([sim, measured])
    bars = {t.name: t for t in overlay.data}
    assert bars["forward (simulated)"].width == bars["forward (measured)"].width == pytest.approx(0.4)
    assert bars["forward (simulated)"].offset > bars["forward (measured)"].offset  # same lane, simulated on top
    assert bars["forward (measured)"].opacity < 1.0
    assert list(bars["forward (measured)"].x) == pytest.approx([1.1 * x for x in bars["forward (simulated)"].x])
    side = timeline_figure([sim, measured], compare="side")
    assert {t.yaxis for t in side.data} == {"y", "y2"}
    assert [a.text for a in side.layout.annotations] == ["simulated", "measured"]


def test_idle_gaps_cover_the_makespan_complement():
    t = Timeline((Event(0, 0, "F", 1.0, 2.0), Event(0, 0, "B", 3.0, 4.0), Event(1, 1, "F", 0.0, 5.0)))
    assert idle_gaps(t, 0) == [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)]
    assert idle_gaps(t, 1) == []


def test_bad_inputs():
    with pytest.raises(ValueError, match="compare"):
        timeline_figure(simulate(g.gpipe(1, 1)).timeline, compare="stacked")
    with pytest.raises(ValueError, match="Timelines"):
        timeline_figure([{"events": []}])
    with pytest.raises(ValueError, match="per-stage times"):
        balance_figure({"memory_bytes": [1, 2]})


def test_balance_figure_marks_the_bottleneck_and_the_cap():
    costs = ModelCosts.uniform(8, param_bytes=10**8, activation_bytes=10**6)
    res = ampa(costs, 3, num_microbatches=1, memory_cap_bytes=2 * 10**9)
    fig = balance_figure(res)
    assert [t.name for t in fig.data] == ["forward", "backward", "boundary transfer", "memory"]
    texts = [a.text for a in fig.layout.annotations]
    assert any(t.startswith(f"bottleneck {res.bottleneck_ms:.3g}") for t in texts)
    assert fig.data[0].marker.line.width[res.bottleneck_stage] == 3
    assert list(fig.data[3].y) == pytest.approx([m / 2**30 for m in res.stage_memory_bytes])
    assert any(s.type == "line" for s in fig.layout.shapes) or any("cap" in t for t in texts)  # the memory cap
    plain = balance_figure({"compute_ms": [1.0, 3.0, 2.0]})
    assert any("bottleneck 3" in a.text for a in plain.layout.annotations)


def test_memory_panels_scale_to_their_bars_and_mark_the_cap():
    from workbench.viz.plan import layer_strip_figure

    data = {"compute_ms": [1.0, 2.0], "memory_bytes": [2**20, 2**21]}
    near = balance_figure({**data, "memory_cap_bytes": 3 * 2**20})  # the cap just above the bars: a line
    assert any(s.type == "line" and s.y0 == pytest.approx(3 / 1024) for s in near.layout.shapes)
    assert near.layout.yaxis2.range[1] >= 3 / 1024
    far = balance_figure({**data, "memory_cap_bytes": 80 * 2**30})  # a device's 80 GiB: written, bars stay visible
    assert not any(s.type == "line" for s in far.layout.shapes)
    assert far.layout.yaxis2.range[1] == pytest.approx(2 / 1024 * 1.3)
    assert any("cap 80 GiB (off the scale)" == a.text for a in far.layout.annotations)
    strip = layer_strip_figure([{"name": "a", "tp": 1, "dp_kind": "fsdp", "recompute": False}],
                               stage_memory_gib=[1.0], budget_gib=1.2)
    assert any(s.type == "line" for s in strip.layout.shapes) and strip.layout.yaxis2.range[1] >= 1.2


def test_chrome_trace_of_a_simulation_is_loadable(tmp_path):
    res = simulate(g.gropipe(2, 2, 2, delay=1, num_iterations=2), StageCosts.uniform(2, param_bytes=10**6),
                   get_cluster("8xV100-PCIe"))
    path = res.timeline.save_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert "0F0v0" in names and any(e["cat"] == "AR" for e in trace["traceEvents"] if e["ph"] == "X")
