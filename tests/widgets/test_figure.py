"""figure_widget: ready for messages at once, opens with the whole figure, and republishes it after changes.

``sent`` (tests/widgets/conftest.py) records what the kernel sends, the way
the browser receives it: the comm-open state, then each state update in order.
"""

import sys
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from job_test_helpers import write_synthetic_run  # noqa: E402

from workbench.jobs import attach  # noqa: E402
from workbench.widgets.figure import WIDGET_LOADER_JS, figure_widget  # noqa: E402
from workbench.widgets.job_monitor import JobMonitor  # noqa: E402


def bars(y, title="balance"):
    return go.Figure(go.Bar(y=np.asarray(y, dtype=float), name="forward"), layout={"title": {"text": title}})


def test_the_comm_opens_with_the_whole_figure(sent):
    plain = go.FigureWidget(bars([1, 2, 3]))
    assert sent[0][1] == "open" and sent[0][2]["_widget_data"] == []  # plotly's own: the figure comes later
    sent.clear()
    widget = figure_widget(bars([1, 2, 3]))
    assert isinstance(widget, go.FigureWidget)
    _, kind, state = sent[0]
    assert kind == "open"
    assert [t["type"] for t in state["_widget_data"]] == ["bar"]
    assert state["_widget_data"][0]["name"] == "forward"
    assert state["_widget_layout"]["title"] == {"text": "balance"}
    assert not [s for _, k, s in sent[1:] if "_widget_data" in s or "_widget_layout" in s]
    plain.close()


def test_changes_after_opening_are_plotly_update_messages(sent):
    widget = figure_widget(bars([1, 2, 3]))
    sent.clear()
    with widget.batch_update():
        widget.data[0].y = np.array([3.0, 2.0, 1.0])
        widget.layout.title.text = "moved"
    updates = [state["_py2js_update"] for _, _, state in sent if state.get("_py2js_update")]
    assert len(updates) == 1, sent
    assert set(updates[0]["style_data"]) == {"y"} and updates[0]["style_traces"] == [0]
    assert updates[0]["layout_data"] == {"title.text": "moved"}
    assert widget.data[0].y.tolist() == [3.0, 2.0, 1.0]


def test_a_job_monitor_opens_its_figures_with_the_run_so_far(sent, tmp_path):
    monitor = JobMonitor(attach(write_synthetic_run(tmp_path, steps=6)), mode="widget", start=False)
    figures = [state for _, kind, state in sent if kind == "open" and "_widget_data" in state]
    assert len(figures) == 3  # loss, samples / s, timeline
    assert [t["name"] for t in figures[0]["_widget_data"]] == ["rank 0", "rank 1"]
    assert [t["name"] for t in figures[1]["_widget_data"]] == ["rank 0", "rank 1"]
    measured = [t for t in figures[2]["_widget_data"] if t["name"].endswith("(measured)")]
    assert {y for t in measured for y in t["y"]} >= {"rank 0", "rank 1"}
    assert monitor.update() is True and [t.name for t in monitor.loss_fig.data] == ["rank 0", "rank 1"]


def test_the_model_is_ready_at_once_and_plotly_code_loads_once_per_page(sent):
    """anywidget holds a model's messages until its module has loaded, and drops them all after 2 s: the module
    is a small loader, and plotly's 5 MB code travels as data, imported once per page by code id."""
    first, second = figure_widget(bars([1])), figure_widget(bars([2]))
    opened = [state for _, kind, state in sent if kind == "open"]
    plotly_code = str(go.FigureWidget._esm)
    assert [state["_esm"] for state in opened] == [WIDGET_LOADER_JS] * 2 and len(WIDGET_LOADER_JS) < 2000
    assert [state["_widget_code"] for state in opened] == [plotly_code] * 2
    assert opened[0]["_widget_code_id"] == opened[1]["_widget_code_id"] != ""
    # the loader does not wait for plotly's code in initialize (anywidget's deadline), only in render
    initialize = WIDGET_LOADER_JS[WIDGET_LOADER_JS.index("initialize("):WIDGET_LOADER_JS.index("async render(")]
    assert "await" not in initialize and "plotlyModule(model)" in initialize
    assert "modules.has(id)" in WIDGET_LOADER_JS  # one import per page and code id
    first.close()
    second.close()


def test_every_change_republishes_the_figure_for_views_drawn_later(sent):
    widget = figure_widget(bars([1, 2, 3]))
    sent.clear()
    with widget.batch_update():
        widget.data[0].y = np.array([3.0, 2.0, 1.0])
        widget.layout.title.text = "moved"
    widget.add_bar(y=[5.0], name="extra")
    states = [state for _, _, state in sent if "_widget_data" in state]
    assert len(states) == 2  # one per change, with the layout in the same message when it changed
    assert states[0]["_widget_layout"]["title"] == {"text": "moved"} and "_widget_layout" not in states[1]
    assert [t["name"] for t in states[-1]["_widget_data"]] == ["forward", "extra"]
    # a view drawn between the two gets the change either way: the state goes before a setting (which may be
    # applied twice) and after a new trace (which may not)
    keys = ("_widget_data", "_py2js_update", "_py2js_addTraces")
    order = [next(key for key in keys if state.get(key)) for _, _, state in sent if any(state.get(k) for k in keys)]
    assert order == ["_widget_data", "_py2js_update", "_py2js_addTraces", "_widget_data"]
