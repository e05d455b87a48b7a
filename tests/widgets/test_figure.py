"""figure_widget: the comm opens with the whole figure (plotly's own FigureWidget sends it in a later update).

A fake comm records what the kernel sends, the way the browser would receive
it: the comm-open state, then each state update in order.
"""

import sys
from pathlib import Path

import comm
import numpy as np
import plotly.graph_objects as go
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from job_test_helpers import write_synthetic_run  # noqa: E402

from workbench.jobs import attach  # noqa: E402
from workbench.widgets.figure import figure_widget  # noqa: E402
from workbench.widgets.job_monitor import JobMonitor  # noqa: E402


class RecordingComm:
    """Stands in for a kernel comm and keeps the open state and every update sent."""

    def __init__(self, log, **kwargs):
        self.comm_id = f"comm-{len(log)}"
        self.kernel = object()  # ipywidgets sends only over a comm with a kernel
        self.log = log
        log.append(("open", kwargs["data"]["state"]))

    def send(self, data=None, buffers=None, **_kwargs):
        self.log.append(("update", data["state"]))

    def on_msg(self, _callback):
        pass

    def close(self, *_args, **_kwargs):
        pass


@pytest.fixture
def sent(monkeypatch):
    log = []
    monkeypatch.setattr(comm, "create_comm", lambda **kwargs: RecordingComm(log, **kwargs))
    return log


def bars(y, title="balance"):
    return go.Figure(go.Bar(y=np.asarray(y, dtype=float), name="forward"), layout={"title": {"text": title}})


def test_the_comm_opens_with_the_whole_figure(sent):
    plain = go.FigureWidget(bars([1, 2, 3]))
    assert sent[0][0] == "open" and sent[0][1]["_widget_data"] == []  # plotly's own: the figure comes later
    sent.clear()
    widget = figure_widget(bars([1, 2, 3]))
    assert isinstance(widget, go.FigureWidget)
    kind, state = sent[0]
    assert kind == "open"
    assert [t["type"] for t in state["_widget_data"]] == ["bar"]
    assert state["_widget_data"][0]["name"] == "forward"
    assert state["_widget_layout"]["title"] == {"text": "balance"}
    assert not [s for k, s in sent[1:] if "_widget_data" in s or "_widget_layout" in s]
    plain.close()


def test_changes_after_opening_are_plotly_update_messages(sent):
    widget = figure_widget(bars([1, 2, 3]))
    sent.clear()
    with widget.batch_update():
        widget.data[0].y = np.array([3.0, 2.0, 1.0])
        widget.layout.title.text = "moved"
    updates = [state["_py2js_update"] for _, state in sent if state.get("_py2js_update")]
    assert len(updates) == 1, sent
    assert set(updates[0]["style_data"]) == {"y"} and updates[0]["style_traces"] == [0]
    assert updates[0]["layout_data"] == {"title.text": "moved"}
    assert widget.data[0].y.tolist() == [3.0, 2.0, 1.0]


def test_a_job_monitor_opens_its_figures_with_the_run_so_far(sent, tmp_path):
    monitor = JobMonitor(attach(write_synthetic_run(tmp_path, steps=6)), mode="widget", start=False)
    figures = [state for kind, state in sent if kind == "open" and "_widget_data" in state]
    assert len(figures) == 3  # loss, samples / s, timeline
    assert [t["name"] for t in figures[0]["_widget_data"]] == ["rank 0", "rank 1"]
    assert [t["name"] for t in figures[1]["_widget_data"]] == ["rank 0", "rank 1"]
    measured = [t for t in figures[2]["_widget_data"] if t["name"].endswith("(measured)")]
    assert {y for t in measured for y in t["y"]} >= {"rank 0", "rank 1"}
    assert monitor.update() is True and [t.name for t in monitor.loss_fig.data] == ["rank 0", "rank 1"]
