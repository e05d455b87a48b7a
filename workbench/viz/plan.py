"""The planner's ranking drawn: where each strategy's iteration goes, and what it costs in memory.

A ranked table says which strategy is fastest; the breakdown says why. One
horizontal bar per strategy (best on top) stacks the busiest rank's compute,
bubble and exposed communication, which add up to the iteration time; a
second panel gives each strategy's memory per device against the cap. The
strategy being inspected is outlined. Input is a list of plain rows
(``PlanResult.rows()`` or ``Estimate.to_dict()``: name, compute_ms,
bubble_ms, exposed_comm_ms, memory_gib), so the figure needs no planner.
"""

from __future__ import annotations

from typing import Any, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import CATEGORY_COLORS, IDLE, MEMORY_COLOR, apply_layout

__all__ = ["plan_breakdown_figure", "select_plan", "BREAKDOWN_PARTS"]

# row key -> legend name, colour; stacked left to right in this order
BREAKDOWN_PARTS = (("compute_ms", "compute", CATEGORY_COLORS["forward"]),
                   ("bubble_ms", "bubble", CATEGORY_COLORS[IDLE]),
                   ("exposed_comm_ms", "exposed communication", CATEGORY_COLORS["all-reduce"]))


def _outline(names: Sequence[str], selected: str | None) -> list[int]:
    return [3 if name == selected else 0 for name in names]


def plan_breakdown_figure(rows: Sequence[dict[str, Any]], *, selected: str | None = None,
                          memory_cap_gib: float | None = None, title: str | None = None) -> go.Figure:
    """Stacked compute / bubble / exposed-communication bars and memory per device, best strategy on top."""
    rows = [r for r in rows if r.get("feasible", True)]
    if not rows:
        raise ValueError("plan_breakdown_figure needs at least one feasible row (name, compute_ms, bubble_ms, "
                         "exposed_comm_ms, memory_gib)")
    for i, row in enumerate(rows):
        missing = [k for k, _, _ in BREAKDOWN_PARTS if k not in row] + [k for k in ("name", "memory_gib") if k not in row]
        if missing:
            raise ValueError(f"row {i} ({row.get('name', '?')}) lacks {missing}")
    names = [r["name"] for r in rows]
    outline = _outline(names, selected)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.7, 0.3], horizontal_spacing=0.03,
                        subplot_titles=["iteration time of the busiest rank (ms)", "memory per device (GiB)"])
    for key, name, color in BREAKDOWN_PARTS:
        fig.add_trace(go.Bar(y=names, x=[r[key] for r in rows], name=name, orientation="h",
                             marker={"color": color, "line": {"width": outline, "color": "black"}},
                             hovertemplate=f"%{{y}}<br>{name} %{{x:.3f}} ms<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(y=names, x=[r["memory_gib"] for r in rows], name="memory", orientation="h",
                         marker={"color": MEMORY_COLOR, "line": {"width": outline, "color": "black"}},
                         hovertemplate="%{y}<br>%{x:.3f} GiB<extra></extra>"), row=1, col=2)
    if memory_cap_gib:
        fig.add_vline(x=memory_cap_gib, line_dash="dash", line_color="red", annotation_text="cap", row=1, col=2)
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1])
    return apply_layout(fig, barmode="stack", title=title or "Ranked strategies: where the iteration goes",
                        height=max(280, 90 + 26 * len(rows)), legend={"y": -0.12},
                        margin={"l": 200, "r": 20, "t": 70, "b": 40})


def select_plan(fig: go.Figure, selected: str | None) -> None:
    """Outline ``selected`` in a :func:`plan_breakdown_figure`, in place."""
    for trace in fig.data:
        trace.marker.line.width = _outline(list(trace.y), selected)
