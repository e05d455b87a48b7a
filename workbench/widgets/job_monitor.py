"""The live job monitor: curves, rank table, log tail, timeline and a Cancel button.

A background thread (not an asyncio task: tasks starve while another cell
blocks, e.g. in ``job.wait()``) polls the run directory at ``refresh_hz``
(2 to 4 Hz) and pushes only what changed: numpy arrays into ``FigureWidget``
traces inside one ``batch_update`` per figure, the rank table as one HTML
string, and a bounded log tail as one ``Textarea`` value (no ever-growing
``Output`` history). Widgets are created in the constructor (the calling
cell's thread) and only their traits are set from the thread.

Every figure is a :func:`~.figure.figure_widget` made with all its traces
(one line per rank; one timeline trace per run and op category), so a
refresh only changes data: one ``Plotly.update`` per figure, never a trace
added or removed, so no reading of the page shows part of a figure. The
Cancel button ends disabled and grey, labelled with the final state, once
the run is over, however it ended (a press that comes as the run finishes
included). A run that evaluates (``eval_every`` in its config) also gets a
validation chart: accuracy (or perplexity) and validation loss against wall
time, with the target as a dashed line when the config sets one. Page
hooks: the box has class ``wb-job-monitor``; its parts ``wb-monitor-header``,
``wb-monitor-cancel``, ``wb-monitor-ranks``, ``wb-monitor-log`` and (runs that
evaluate) ``wb-monitor-eval``.

Without a widget frontend (``WORKBENCH_STATIC=1``, no IPython kernel, or no
anywidget for ``FigureWidget``) the monitor displays the static summary
figure instead (renderer ``WORKBENCH_PLOTLY_RENDERER``, default
``plotly_mimetype+notebook_connected``, which nbconvert can render), so
headless runs and saved notebooks show real data.
"""

from __future__ import annotations

import html
import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pandas  # noqa: F401  plotly imports it lazily on the monitor's thread; a notebook's main thread importing it
# at the same moment (Job.metrics) then finds a partially initialised module: importing it here first avoids the race

from ..core.fields import check_int
from ..core.rundir import CONFIG_FILE
from ..core.timeline import Timeline
from ..jobs.monitor_model import EvalTargets
from ..viz.job_figures import (eval_figure, eval_metric, eval_traces, metric_figure, monitor_timeline_figure,
                               restart_steps, thin)
from ..viz.style import STATE_COLORS, palette_color
from ..viz.timeline import update_timeline_slots

__all__ = ["JobMonitor", "ui_mode"]

# the loss and throughput curves, side by side: 2 x 480 px fit a notebook's output area (plotly's default
# is 700 px each)
CURVE_WIDTH_PX = 480


def ui_mode() -> str:
    """``"widget"`` inside a kernel with widget support, else ``"static"``."""
    if os.environ.get("WORKBENCH_STATIC") == "1":
        return "static"
    try:
        import anywidget  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return "static"
    shell = get_ipython()
    return "widget" if shell is not None and getattr(shell, "kernel", None) is not None else "static"


class JobMonitor:
    """Live view of a :class:`~workbench.jobs.Job`; ``stop()`` ends the refresh thread."""

    def __init__(self, job, *, simulated: Timeline | None = None, refresh_hz: float = 3.0, log_lines: int = 200,
                 max_points: int = 2000, mode: str | None = None, start: bool = True):
        if not 0.1 <= refresh_hz <= 20:
            raise ValueError(f"refresh_hz must be between 0.1 and 20, got {refresh_hz!r}")
        check_int("log_lines", log_lines, 1)
        self.job = job
        self.simulated = simulated
        self.refresh_hz = refresh_hz
        self.max_points = max_points
        self.mode = mode or ui_mode()
        if self.mode not in ("widget", "static"):
            raise ValueError(f"mode must be 'widget', 'static' or None, got {self.mode!r}")
        self.log_tail: deque[str] = deque(maxlen=log_lines)
        self.updates = 0
        self.cpu_s = 0.0
        self.last_update_t = 0.0
        self._seen_version = -1
        self._timeline_key: Any = None
        self._log_tailers: dict[Any, Any] = {}
        self._update_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.widget = self._build() if self.mode == "widget" else None
        if start and self.mode == "widget":
            self.start()

    # -- construction --------------------------------------------------------------------
    def _build(self):
        import ipywidgets as w

        from .figure import figure_widget

        # The figures are filled from the run as it stands before they become widgets, with a line for every
        # rank the run will have and every timeline trace there can be: a refresh then only changes data.
        ranks = int(self.job.launch_info.get("world_size") or 0)
        self.loss_fig = metric_figure({}, "loss", title="loss", width=CURVE_WIDTH_PX, ranks=ranks)
        self.rate_fig = metric_figure({}, "samples_per_s", title="samples / s", width=CURVE_WIDTH_PX, ranks=ranks)
        self.timeline_fig = monitor_timeline_figure(None, self.simulated)
        state = self.job.refresh()
        self._eval_targets = self._read_eval_targets(state)
        self.eval_fig = None
        if self._eval_targets is not None:
            metric = eval_metric({}, self._eval_targets)
            self.eval_fig = eval_figure({}, metric=metric, target=self._eval_targets.get(metric, 0.0),
                                        title="validation", width=CURVE_WIDTH_PX)
        self._seen_version = state.version
        self._update_curves(state)
        self._update_evals(state)
        self._update_timeline(state)
        self.loss_fig, self.rate_fig, self.timeline_fig = (
            figure_widget(fig) for fig in (self.loss_fig, self.rate_fig, self.timeline_fig))
        if self.eval_fig is not None:
            self.eval_fig = figure_widget(self.eval_fig)
            self.eval_fig.add_class("wb-monitor-eval")
        self.header = w.HTML()
        self.table = w.HTML()
        self.log_box = w.Textarea(layout=w.Layout(width="100%", height="180px"), disabled=True,
                                  placeholder="rank 0 logs its progress here every few steps; every rank its errors")
        self.cancel_button = w.Button(description="Cancel", button_style="danger", icon="stop")
        self.cancel_button.on_click(self._on_cancel)
        for part, name in ((self.header, "header"), (self.table, "ranks"), (self.log_box, "log"),
                           (self.cancel_button, "cancel")):
            part.add_class(f"wb-monitor-{name}")
        curves = [w.HBox([self.loss_fig, self.rate_fig])] + ([w.HBox([self.eval_fig])] if self.eval_fig else [])
        box = w.VBox([w.HBox([self.header, self.cancel_button]), *curves, self.table, self.timeline_fig,
                      self.log_box])
        box.add_class("wb-job-monitor")
        return box

    # -- refresh loop ---------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"job-monitor-{self.job.run_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        period = 1.0 / self.refresh_hz
        while not self._stop.is_set():
            began = time.thread_time()
            terminal = self.update()
            self.cpu_s += time.thread_time() - began
            if terminal:
                return
            self._stop.wait(period)

    def update(self) -> bool:
        """One refresh of every view; returns True once the job has ended."""
        with self._update_lock:  # the refresh thread and a Cancel press may both refresh
            status = self.job.status()
            state = self.job.refresh()
            if self.widget is not None:
                if state.version != self._seen_version:
                    self._seen_version = state.version
                    self._update_curves(state)
                    self._update_evals(state)
                    self._update_timeline(state)
                self._update_table(status)
                self._update_logs()
                if status.finished:
                    self._show_ended(status.state)
            self.updates += 1
            self.last_update_t = time.time()
            return status.finished

    def _show_ended(self, state: str) -> None:
        """The run is over: the button can do nothing more, and says how the run ended."""
        button = self.cancel_button
        with button.hold_sync():
            button.disabled = True
            button.button_style = ""
            button.icon = ""
            button.description = state.capitalize()

    def _update_curves(self, state) -> None:
        for fig, field in ((self.loss_fig, "loss"), (self.rate_fig, "samples_per_s")):
            drawn = {t.name for t in fig.data}
            for rank in sorted(r for r in state.metrics if f"rank {r}" not in drawn):  # more ranks than launched
                fig.add_scatter(mode="lines+markers", name=f"rank {rank}", line={"color": palette_color(rank)},
                                marker={"size": 4})
            with fig.batch_update():
                for rank, columns in sorted(state.metrics.items()):
                    trace = next(t for t in fig.data if t.name == f"rank {rank}")
                    index = thin(np.arange(len(columns)), self.max_points)
                    trace.x = columns.column("step")[index]
                    trace.y = columns.column(field)[index]
                marks = sorted({s for rank, columns in state.metrics.items()
                                for s in restart_steps({k: columns.column(k) for k in ("restart", "step")})})
                fig.layout.shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": s, "x1": s, "y0": 0,
                                      "y1": 1, "line": {"dash": "dash", "color": "gray"}} for s in marks]

    def _read_eval_targets(self, state) -> dict[str, float] | None:
        """``{"accuracy": target, "perplexity": target}`` (0: none) for a run that evaluates, else None.

        From the run's config.json (there from launch) or, without one, the start event's config."""
        config: dict = {}
        try:
            config = json.loads((Path(self.job.run_dir) / CONFIG_FILE).read_text())
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        found, targets = EvalTargets.from_config(config), state.targets
        every = found.eval_every or targets.eval_every
        if not every and not len(state.evals):
            return None
        return {"accuracy": float(found.target_accuracy or targets.target_accuracy),
                "perplexity": float(found.target_perplexity or targets.target_perplexity)}

    def _update_evals(self, state) -> None:
        if self.eval_fig is None or not len(state.evals):
            return
        series = state.eval_series()
        metric = eval_metric(series, self._eval_targets)
        traces = eval_traces(series, metric, self._eval_targets.get(metric, 0.0), self.max_points)
        with self.eval_fig.batch_update():
            for live, new in zip(self.eval_fig.data, traces):
                live.x, live.y, live.name = new.x, new.y, new.name
            self.eval_fig.layout.yaxis.title.text = metric

    def _update_timeline(self, state) -> None:
        measured = state.timeline()
        key = (measured.meta.get("iteration"), len(measured))
        if key == self._timeline_key:
            return
        self._timeline_key = key
        note = ""
        if self.simulated is not None:
            simulated = self.simulated
        else:
            simulated = self.job.predicted_timeline(measured)
            note = getattr(self.job, "prediction_note", "")  # why there is no prediction, in the title
        update_timeline_slots(self.timeline_fig, monitor_timeline_figure(measured, simulated, note=note))

    def _update_table(self, status) -> None:
        head = (f"<b>{html.escape(status.run_id)}</b> <span style='color:{STATE_COLORS.get(status.state, '#000')}'>"
                f"{status.state}</span> restarts: {status.restarts}")
        if status.reason:
            head += f" <i>{html.escape(status.reason)}</i>"
        devices = status.devices_text()
        if devices:
            head += f"<br><span class='wb-monitor-devices'>{html.escape(devices)}</span>"
        self.header.value = head
        cells = "".join(
            f"<tr><td>{r.rank}</td><td style='color:{STATE_COLORS.get(r.state, '#000')}'>{r.state}</td>"
            f"<td>{'-' if r.step is None else r.step}</td><td>{'-' if r.loss is None else f'{r.loss:.4g}'}</td>"
            f"<td>{'-' if r.samples_per_s is None else f'{r.samples_per_s:.1f}'}</td>"
            f"<td>{'-' if r.heartbeat_age_s is None else f'{r.heartbeat_age_s:.1f} s'}</td><td>{r.restart}</td></tr>"
            for r in status.ranks)
        self.table.value = ("<table><tr><th>rank</th><th>state</th><th>step</th><th>loss</th><th>samples/s</th>"
                            f"<th>heartbeat</th><th>restart</th></tr>{cells}</table>")

    def _update_logs(self) -> None:
        from ..jobs.tailer import TextTailer

        changed = False
        for path in self.job._console_files():
            tailer = self._log_tailers.setdefault(path, TextTailer(path))
            for line in tailer.poll():
                self.log_tail.append(line)
                changed = True
        if changed:
            self.log_box.value = "\n".join(self.log_tail)

    def _on_cancel(self, _button=None) -> None:
        with self.cancel_button.hold_sync():
            self.cancel_button.disabled = True
            self.cancel_button.description = "Cancelling..."
        threading.Thread(target=self._cancel, name=f"job-cancel-{self.job.run_id}", daemon=True).start()

    def _cancel(self) -> None:
        """Stop the run, then refresh once more: the refresh thread may have ended before the run did."""
        try:
            self.job.cancel(grace_s=5.0)
        except Exception as error:  # noqa: BLE001 - shown on the page, where the press was made
            self.header.value += f" <b style='color:#d62728'>cancel failed: {html.escape(str(error))}</b>"
            with self.cancel_button.hold_sync():
                self.cancel_button.disabled = False
                self.cancel_button.description = "Cancel"
            return
        self.update()

    # -- display --------------------------------------------------------------------------
    def summary_figure(self):
        return self.job.summary_figure(simulated=self.simulated)

    def _ipython_display_(self) -> None:
        if self.widget is not None:
            from IPython.display import display

            display(self.widget)
            return
        renderer = os.environ.get("WORKBENCH_PLOTLY_RENDERER", "plotly_mimetype+notebook_connected")
        self.summary_figure().show(renderer=renderer)

