"""Figures of a run: loss and throughput per rank, restarts, validation curves, and measured vs simulated timelines.

Pure functions from plain data (numpy columns per rank, a
:class:`~workbench.core.timeline.Timeline`) to ``go.Figure``; the live
monitor wraps the same builders in ``FigureWidget`` and the static summary
uses them as they are, so the headless report and the live view cannot
disagree. Long curves are thinned by striding to ``max_points`` per trace
before they reach plotly. The timelines are drawn by
:mod:`workbench.viz.timeline` (the prediction overlaid on the measured
run), and every colour comes from :mod:`workbench.viz.style`, so a run's
timeline here looks as it does in the lessons and the partition editor.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.timeline import Timeline
from .style import EVAL_COLORS, apply_layout, palette_color
from .timeline import add_timeline, timeline_figure, timeline_slots

__all__ = ["thin", "restart_steps", "metric_figure", "timeline_figure_pair", "monitor_timeline_figure",
           "job_summary_figure", "TIMELINE_RUNS", "eval_metric", "eval_traces", "eval_figure", "EVAL_TRACES"]

TIMELINE_RUNS = ("simulated", "measured")  # the runs a job's timeline overlays, the prediction on top


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


def metric_figure(metrics: Mapping[int, Mapping[str, np.ndarray]], field: str, *, title: str,
                  max_points: int = 2000, width: int | None = None, ranks: int = 0) -> go.Figure:
    """One line per rank of ``field`` against step; dashed lines where torchrun restarted.

    ``width`` in pixels (None: plotly's default, 700). ``ranks``: draw a
    line (maybe empty) for every rank below it too, so a live view that
    fills them in later never has to add a trace.
    """
    fig = go.Figure()
    empty = {"step": np.empty(0), field: np.empty(0)}
    for rank in sorted(set(metrics) | set(range(ranks))):
        columns = metrics.get(rank, empty)
        x, y = _thin_pair(columns["step"], columns[field], max_points)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"rank {rank}",
                                 line={"color": palette_color(rank)}, marker={"size": 4}))
    for step in sorted({s for columns in metrics.values() for s in restart_steps(columns)}):
        fig.add_vline(x=step, line_dash="dash", line_color="gray", annotation_text="restart")
    return apply_layout(fig, title=title, xaxis_title="step", yaxis_title=field, height=280, width=width,
                        margin={"l": 50, "r": 10, "t": 40, "b": 40})


EVAL_TRACES = ("metric", "val_loss", "target")  # the validation chart's traces, in order, always all three


def eval_metric(evals: Mapping[str, np.ndarray], targets: Mapping[str, float] | None = None) -> str:
    """``"perplexity"`` for a run with a perplexity target or (without an accuracy target) perplexities
    evaluated, else ``"accuracy"``: the validation metric a chart of the run shows."""
    targets = targets or {}
    if targets.get("perplexity"):
        return "perplexity"
    perplexity = evals.get("perplexity")
    has_perplexity = perplexity is not None and bool(np.isfinite(perplexity).any())
    return "perplexity" if has_perplexity and not targets.get("accuracy") else "accuracy"


def eval_traces(evals: Mapping[str, np.ndarray], metric: str, target: float = 0.0,
                max_points: int = 2000) -> list[go.Scatter]:
    """The validation chart's three traces against wall seconds: ``metric`` (left axis), validation loss
    (right axis, ``y2``) and the target as a dashed line across the curve's span (empty without a target)."""
    empty = np.empty(0)
    wall = evals.get("wall_s", empty)
    x, y = _thin_pair(wall, evals.get(metric, empty), max_points)
    _, loss = _thin_pair(wall, evals.get("val_loss", empty), max_points)
    span = [0.0, float(np.nanmax(wall)) if wall.size and np.isfinite(wall).any() else 1.0]
    return [
        go.Scatter(x=x, y=y, mode="lines+markers", name=f"val {metric}", line={"color": EVAL_COLORS["metric"]},
                   marker={"size": 5}),
        go.Scatter(x=x, y=loss, mode="lines+markers", name="val loss", yaxis="y2",
                   line={"color": EVAL_COLORS["val_loss"], "dash": "dot"}, marker={"size": 4}),
        go.Scatter(x=span if target else [], y=[target, target] if target else [], mode="lines",
                   name=f"target {metric}", line={"color": EVAL_COLORS["target"], "dash": "dash"}),
    ]


def eval_figure(evals: Mapping[str, np.ndarray], *, metric: str = "accuracy", target: float = 0.0,
                title: str = "validation", width: int | None = None, max_points: int = 2000) -> go.Figure:
    """Validation ``metric`` and loss against wall time, with the target as a line when set.

    Always :data:`EVAL_TRACES` (maybe empty), so a live view fills them in by data alone.
    """
    fig = go.Figure(eval_traces(evals, metric, target, max_points))
    return apply_layout(fig, title=title, xaxis_title="wall s", yaxis_title=metric, height=310, width=width,
                        yaxis2={"title": "val loss", "overlaying": "y", "side": "right", "showgrid": False},
                        legend={"orientation": "h", "x": 0.0, "y": -0.3, "yanchor": "top"},
                        margin={"l": 50, "r": 50, "t": 40, "b": 70})  # legend under the axis title, clear of both


def _runs(measured: Timeline | None, simulated: Timeline | None) -> tuple[list[Timeline], list[str]]:
    """The timelines there are to draw, the prediction first (it takes the top of each lane)."""
    pairs = [(t, name) for t, name in ((simulated, "simulated"), (measured, "measured")) if t is not None and len(t)]
    return [t for t, _ in pairs], [name for _, name in pairs]


def timeline_figure_pair(measured: Timeline | None, simulated: Timeline | None = None, *,
                         note: str = "") -> go.Figure:
    """The measured iteration's timeline with the simulated one overlaid (lanes per rank, rank 0 on top).

    ``note``: why there is no prediction, shown in the title beside a measured iteration drawn alone."""
    timelines, names = _runs(measured, simulated)
    iteration = measured.meta.get("iteration") if measured is not None else None
    if iteration is None:
        title = "timeline (no stage events yet)"
    elif "simulated" in names:
        title = f"timeline: measured iteration {iteration} (pale), predicted (solid)"
    else:
        title = f"timeline: measured iteration {iteration}" + (f" (no prediction: {note})" if note else "")
    return timeline_figure(timelines or [Timeline(())], names=names or ["measured"], title=title)


def monitor_timeline_figure(measured: Timeline | None, simulated: Timeline | None = None, *,
                            note: str = "") -> go.Figure:
    """:func:`timeline_figure_pair` with a trace for every run and op category, present or not.

    Every reading has the same traces in the same order, so a live view
    changes from one iteration to the next by data alone
    (``viz.timeline.update_timeline_slots``).
    """
    fig = timeline_slots(timeline_figure_pair(measured, simulated, note=note), TIMELINE_RUNS)
    # a live view's title changes with the iteration: the legend goes beside the lanes, out of its way
    return fig.update_layout(legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1.0, "yanchor": "top"})


def job_summary_figure(data: Mapping[str, Any], *, measured: Timeline | None = None,
                       simulated: Timeline | None = None, title: str = "", max_points: int = 2000,
                       note: str = "") -> go.Figure:
    """A static summary: loss and throughput per rank (top), iteration timeline (middle) and, for a run that
    evaluates (``data["evals"]``), validation metric and loss against wall time with the target (bottom).

    ``note``: why there is no prediction, shown in the timeline's title when a measured iteration is drawn
    alone."""
    metrics = data.get("metrics", {})
    evals = data.get("evals") or {}
    rows = 3 if evals else 2
    specs = [[{}, {}], [{"colspan": 2}, None]] + ([[{"colspan": 2, "secondary_y": True}, None]] if evals else [])
    timeline_title = "timeline (ms)"
    if note and (simulated is None or not len(simulated)) and measured is not None and len(measured):
        timeline_title += f" (no prediction: {note})"
    fig = make_subplots(rows=rows, cols=2, specs=specs, vertical_spacing=0.15 if rows == 2 else 0.1,
                        subplot_titles=("loss", "samples / s", timeline_title) + (("validation",) if evals else ()))
    if evals:
        targets = data.get("targets") or {}
        metric = eval_metric(evals, targets)
        for trace in eval_traces(evals, metric, float(targets.get(metric) or 0.0), max_points):
            on_loss = trace.yaxis == "y2"
            trace.yaxis = None
            fig.add_trace(trace, row=3, col=1, secondary_y=on_loss)
        fig.update_xaxes(title_text="wall s", row=3, col=1)
        fig.update_yaxes(title_text=metric, row=3, col=1, secondary_y=False)
        fig.update_yaxes(title_text="val loss", row=3, col=1, secondary_y=True, showgrid=False)
    for rank, columns in sorted(metrics.items()):
        for col, field in ((1, "loss"), (2, "samples_per_s")):
            x, y = _thin_pair(columns["step"], columns[field], max_points)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"rank {rank}", legendgroup=f"rank {rank}",
                                     showlegend=col == 1, line={"color": palette_color(rank)}), row=1, col=col)
    for step in sorted({s for columns in metrics.values() for s in restart_steps(columns)}):
        for col in (1, 2):
            fig.add_vline(x=step, line_dash="dash", line_color="gray", row=1, col=col)
    timelines, names = _runs(measured, simulated)
    if timelines:
        add_timeline(fig, timelines, names=names, row=2, col=1, showlegend=False)
    apply_layout(fig, title=title, height=620 if rows == 2 else 860, margin={"l": 90, "r": 10, "t": 60, "b": 40},
                 legend={"orientation": "v"})
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    return fig
