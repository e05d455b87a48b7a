"""Figures of a run: loss and throughput per rank, restarts, and measured vs simulated timelines.

Pure functions from plain data (numpy columns per rank, a
:class:`~workbench.core.timeline.Timeline`) to ``go.Figure``; the live
monitor wraps the same builders in ``FigureWidget`` and the static summary
uses them as they are, so the headless report and the live view cannot
disagree. Long curves are thinned by striding to ``max_points`` per trace
before they reach plotly.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.timeline import Timeline

__all__ = ["OP_COLORS", "thin", "restart_steps", "metric_figure", "timeline_traces", "timeline_figure_pair",
           "job_summary_figure"]

OP_COLORS = {"F": "#4C78A8", "B": "#F58518", "I": "#E45756", "W": "#72B7B2", "AR": "#54A24B", "STEP": "#B279A2",
             "SEND_F": "#9D755D", "RECV_F": "#BAB0AC", "SEND_B": "#9D755D", "RECV_B": "#BAB0AC",
             "STASH": "#EECA3B", "RESTORE": "#EECA3B"}
RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def thin(values: np.ndarray, max_points: int) -> np.ndarray:
    """Every k-th value so at most ``max_points`` remain (the last one always kept)."""
    if values.size <= max_points:
        return values
    stride = int(np.ceil(values.size / max_points))
    picked = values[::stride]
    return picked if picked[-1] == values[-1] else np.append(picked, values[-1])


def _thin_pair(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    if x.size <= max_points:
        return x, y
    index = thin(np.arange(x.size), max_points)
    return x[index], y[index]


def restart_steps(columns: Mapping[str, np.ndarray]) -> list[float]:
    """Steps at which a new torchrun attempt reported its first step."""
    restarts, steps = columns.get("restart"), columns.get("step")
    if restarts is None or steps is None or restarts.size < 2:
        return []
    changed = np.nonzero(np.diff(restarts) > 0)[0] + 1
    return [float(steps[i]) for i in changed]


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def metric_figure(metrics: Mapping[int, Mapping[str, np.ndarray]], field: str, *, title: str,
                  max_points: int = 2000, width: int | None = None) -> go.Figure:
    """One line per rank of ``field`` against step; dashed lines where torchrun restarted.

    ``width`` in pixels (None: plotly's default, 700).
    """
    fig = go.Figure()
    for rank, columns in sorted(metrics.items()):
        x, y = _thin_pair(columns["step"], columns[field], max_points)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"rank {rank}",
                                 line={"color": rank_color(rank)}, marker={"size": 4}))
    for step in sorted({s for columns in metrics.values() for s in restart_steps(columns)}):
        fig.add_vline(x=step, line_dash="dash", line_color="gray", annotation_text="restart")
    fig.update_layout(title=title, xaxis_title="step", yaxis_title=field, height=280, width=width,
                      margin={"l": 50, "r": 10, "t": 40, "b": 40}, legend={"orientation": "h"})
    return fig


def timeline_traces(timeline: Timeline, label: str) -> list[go.Bar]:
    """Horizontal bars, one trace per op, rows named ``"<label> r<rank>"``."""
    traces = []
    by_op: dict[str, list] = {}
    for event in timeline:
        by_op.setdefault(event.op, []).append(event)
    for op, events in sorted(by_op.items()):
        traces.append(go.Bar(
            orientation="h", name=f"{label} {op}", legendgroup=op,
            y=[f"{label} r{e.rank}" for e in events], x=[e.duration for e in events],
            base=[e.start for e in events], text=[e.label for e in events], textposition="inside",
            marker={"color": OP_COLORS.get(op, "#888888"), "opacity": 1.0 if label == "measured" else 0.55},
            hovertemplate="%{text}: %{base:.2f} ms + %{x:.2f} ms<extra></extra>"))
    return traces


def timeline_figure_pair(measured: Timeline | None, simulated: Timeline | None = None) -> go.Figure:
    """The measured iteration's timeline with the simulated one beside it (rows per rank)."""
    fig = go.Figure()
    for timeline, label in ((simulated, "simulated"), (measured, "measured")):
        if timeline is not None and len(timeline):
            for trace in timeline_traces(timeline, label):
                fig.add_trace(trace)
    iteration = measured.meta.get("iteration") if measured is not None else None
    title = "timeline" + (f" (measured iteration {iteration})" if iteration is not None else " (no stage events yet)")
    fig.update_layout(title=title, barmode="overlay", xaxis_title="ms", height=260,
                      margin={"l": 90, "r": 10, "t": 40, "b": 40}, showlegend=False)
    fig.update_yaxes(autorange="reversed")
    return fig


def job_summary_figure(data: Mapping[str, Any], *, measured: Timeline | None = None,
                       simulated: Timeline | None = None, title: str = "", max_points: int = 2000) -> go.Figure:
    """A static summary: loss and throughput per rank (top), iteration timeline (bottom)."""
    metrics = data.get("metrics", {})
    fig = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], vertical_spacing=0.15,
                        subplot_titles=("loss", "samples / s", "timeline (ms)"))
    for rank, columns in sorted(metrics.items()):
        for col, field in ((1, "loss"), (2, "samples_per_s")):
            x, y = _thin_pair(columns["step"], columns[field], max_points)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"rank {rank}", legendgroup=f"rank {rank}",
                                     showlegend=col == 1, line={"color": rank_color(rank)}), row=1, col=col)
    for step in sorted({s for columns in metrics.values() for s in restart_steps(columns)}):
        for col in (1, 2):
            fig.add_vline(x=step, line_dash="dash", line_color="gray", row=1, col=col)
    for timeline, label in ((simulated, "simulated"), (measured, "measured")):
        if timeline is not None and len(timeline):
            for trace in timeline_traces(timeline, label):
                trace.showlegend = False
                fig.add_trace(trace, row=2, col=1)
    fig.update_layout(title=title, barmode="overlay", height=620, margin={"l": 90, "r": 10, "t": 60, "b": 40})
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=2, col=1)
    return fig
