"""The job monitor widget driven by hand-written run directories (no frontend, no torchrun)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "viz"))
from figure_checks import lanes_top_to_bottom  # noqa: E402
from job_test_helpers import wait_for, write_synthetic_run  # noqa: E402

from workbench.core.rundir import events_path, make_event  # noqa: E402
from workbench.core.timeline import Event, Timeline  # noqa: E402
from workbench.jobs import attach  # noqa: E402
from workbench.widgets.job_monitor import JobMonitor, ui_mode  # noqa: E402


def test_update_fills_curves_table_logs_and_timeline(tmp_path):
    job = attach(write_synthetic_run(tmp_path, steps=6))
    simulated = Timeline((Event(rank=0, stage=0, op="F", start=0.0, end=1.5, microbatch=0),))
    monitor = JobMonitor(job, simulated=simulated, mode="widget", start=False, log_lines=4)
    assert monitor.update() is True  # every rank ended: the run is over
    traces = {t.name: t for t in monitor.loss_fig.data}
    assert set(traces) == {"rank 0", "rank 1"}
    assert isinstance(traces["rank 0"].y, np.ndarray) and traces["rank 0"].y.tolist() == pytest.approx(
        [1.0 / (s + 1) for s in range(6)])
    assert [t.name for t in monitor.rate_fig.data] == ["rank 0", "rank 1"]
    # the two curves side by side fit a notebook's output area, and updates keep their size
    assert monitor.loss_fig.layout.width == monitor.rate_fig.layout.width and monitor.loss_fig.layout.width * 2 <= 1000
    assert "SUCCEEDED" in monitor.header.value and monitor.table.value.count("<tr>") == 3
    assert monitor.log_box.value.splitlines() == ["[rank1]:step 2 on rank 1", "[rank1]:step 3 on rank 1",
                                                  "[rank1]:step 4 on rank 1", "[rank1]:step 5 on rank 1"]
    lanes = {name: {y for t in monitor.timeline_fig.data if t.name.endswith(f"({name})") for y in t.y}
             for name in ("simulated", "measured")}
    assert lanes == {"simulated": {"rank 0"}, "measured": {"rank 0", "rank 1", "rank 0 comm", "rank 1 comm"}}
    assert list(monitor.timeline_fig.layout.yaxis.categoryarray)[::-1] == ["rank 0", "rank 0 comm", "rank 1",
                                                                          "rank 1 comm"]  # rank 0 on top
    assert monitor.cancel_button.disabled
    assert (monitor.cancel_button.button_style, monitor.cancel_button.description) == ("", "Succeeded")  # not red


def test_background_thread_shows_a_new_step_quickly(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir = write_synthetic_run(tmp_path, steps=3, with_end=False, agent_pid=sleeper.pid, t0=time.time())
        job = attach(run_dir)
        monitor = JobMonitor(job, mode="widget", refresh_hz=4.0)
        wait_for(lambda: len(monitor.loss_fig.data) == 2, timeout=5, what="the first refresh")
        with open(events_path(run_dir, 0), "a") as f:
            f.write(json.dumps(make_event("step", 0, step=3, loss=0.125, samples_per_s=99.0)) + "\n")
        wait_for(lambda: getattr(monitor.loss_fig.data[0].y, "size", 0) == 4, timeout=5, poll=0.02,
                 what="the new point")
        assert monitor.loss_fig.data[0].y[-1] == 0.125 and monitor.running
        monitor.cancel_button.click()
        wait_for(lambda: sleeper.poll() is not None, timeout=15, what="cancel to stop the process")
        wait_for(lambda: not monitor.running, timeout=5, what="the monitor thread to end")
        assert job.status().state == "CANCELLED" and "CANCELLED" in monitor.header.value
    finally:
        sleeper.kill()
        sleeper.wait()


def test_restart_is_marked_and_points_are_thinned(tmp_path):
    run_dir = write_synthetic_run(tmp_path, steps=2, with_end=False)
    lines = [make_event("start", r, restart=1) for r in (0, 1)]
    lines += [make_event("step", r, step=s, loss=1.0, samples_per_s=1.0) for s in range(2, 50) for r in (0, 1)]
    with open(events_path(run_dir, 0), "a") as f0, open(events_path(run_dir, 1), "a") as f1:
        for e in lines:
            (f0 if e["rank"] == 0 else f1).write(json.dumps(e) + "\n")
    monitor = JobMonitor(attach(run_dir), mode="widget", start=False, max_points=10)
    monitor.update()
    assert "restarts: 1" in monitor.header.value
    assert [s.x0 for s in monitor.loss_fig.layout.shapes] == [2]
    assert monitor.loss_fig.data[0].x.size <= 11 and monitor.loss_fig.data[0].x[-1] == 49


def test_static_mode_builds_no_widgets_and_gives_a_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STATIC", "1")
    assert ui_mode() == "static"
    job = attach(write_synthetic_run(tmp_path, steps=4))
    monitor = job.monitor()
    assert monitor.mode == "static" and monitor.widget is None and not monitor.running
    figure = monitor.summary_figure()
    assert isinstance(figure, go.Figure) and not isinstance(figure, go.FigureWidget)
    scatter = [t for t in figure.data if t.type == "scatter"]
    assert len(scatter) == 4 and list(scatter[0].y) == pytest.approx([1.0, 0.5, 1 / 3, 0.25])
    assert any(t.type == "bar" for t in figure.data)


def test_bad_options_are_refused(tmp_path):
    job = attach(write_synthetic_run(tmp_path))
    with pytest.raises(ValueError, match="refresh_hz"):
        JobMonitor(job, refresh_hz=100, mode="static")
    with pytest.raises(ValueError, match="mode must be"):
        JobMonitor(job, mode="browser")


def _append_iteration(run_dir, step, *, ranks=2, comm=True):
    """One more step and its stage events on every rank (rank 1 one millisecond later), as a running job adds."""
    t = time.time()
    for rank in range(ranks):
        ops = [("F", 0.0, 2.0), ("B", 2.0, 6.0)] + ([("AR", 6.0, 8.0)] if comm else [])
        lines = [make_event("step", rank, t=t, step=step, loss=1.0 / (step + 1), samples_per_s=100.0, step_ms=10.0)]
        lines += [make_event("stage", rank, t=t, stage=0, op=op, microbatch=None if op == "AR" else 0,
                             iteration=step, start=start + rank + step % 3, end=end + rank + step % 3, t0=t)
                  for op, start, end in ops]
        with open(events_path(run_dir, rank), "a") as f:
            f.write("".join(json.dumps(e) + "\n" for e in lines))


def test_a_refresh_changes_data_only_in_one_message_per_figure(tmp_path, sent):
    """No trace is added or removed once the monitor is shown: a page never draws part of a figure."""
    run_dir = write_synthetic_run(tmp_path, steps=3, with_end=False)
    monitor = JobMonitor(attach(run_dir), mode="widget", start=False)
    figures = {"loss": monitor.loss_fig, "rate": monitor.rate_fig, "timeline": monitor.timeline_fig}
    comm_ids = {name: fig.comm.comm_id for name, fig in figures.items()}
    traces = {name: [t.name for t in fig.data] for name, fig in figures.items()}
    for step in (3, 4, 5):
        sent.clear()
        _append_iteration(run_dir, step, comm=step == 3)  # later iterations have no communication lanes
        monitor.update()
        for name, comm_id in comm_ids.items():
            messages = [state for sender, _, state in sent if sender == comm_id]
            changes = sorted({key for state in messages for key, value in state.items()
                              if key.startswith("_py2js_") and value is not None})
            assert changes == ["_py2js_update"], (name, step, changes)
            assert len([m for m in messages if m.get("_py2js_update")]) == 1, (name, step)
        assert {name: [t.name for t in fig.data] for name, fig in figures.items()} == traces
        assert lanes_top_to_bottom(monitor.timeline_fig)[0] == "rank 0"
    # the latest iteration every rank has finished for sure is shown: 4, which did not communicate
    assert monitor.timeline_fig.layout.title.text.startswith("timeline: measured iteration 4")
    assert lanes_top_to_bottom(monitor.timeline_fig) == ["rank 0", "rank 1"]


def test_cancel_pressed_as_the_run_ends_settles_on_the_final_state(tmp_path):
    job = attach(write_synthetic_run(tmp_path, steps=4))
    monitor = JobMonitor(job, mode="widget", start=False)  # the refresh thread is gone, as after a run's end
    monitor.cancel_button.click()
    wait_for(lambda: monitor.cancel_button.description != "Cancelling...", timeout=10, what="the button to settle")
    assert monitor.cancel_button.disabled and monitor.cancel_button.description == "Succeeded"
    assert "SUCCEEDED" in monitor.header.value


def test_a_monitor_attached_after_a_restart_shows_the_same(tmp_path):
    run_dir = write_synthetic_run(tmp_path, steps=6)
    live = JobMonitor(attach(run_dir), mode="widget", start=False)
    live.update()
    again = JobMonitor(attach(run_dir), mode="widget", start=False)  # a new kernel: only the directory is left
    again.update()
    for before, after in ((live.loss_fig, again.loss_fig), (live.rate_fig, again.rate_fig),
                          (live.timeline_fig, again.timeline_fig)):
        assert _without_uids(before) == _without_uids(after)
    assert live.log_box.value == again.log_box.value != ""
    cut = live.table.value.index("</th></tr>")  # heartbeat ages differ by the time between the two reads
    assert live.table.value[:cut] == again.table.value[:cut]
    assert live.cancel_button.description == again.cancel_button.description == "Succeeded"


def _without_uids(fig) -> dict:
    """The figure as JSON, without the random trace ids a FigureWidget gives its traces."""
    data = json.loads(fig.to_json())
    for trace in data["data"]:
        trace.pop("uid", None)
    return data
