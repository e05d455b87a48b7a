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

from .style import CATEGORY_COLORS, IDLE, MEMORY_COLOR, apply_layout, mark_memory_cap, palette_color

__all__ = ["plan_breakdown_figure", "select_plan", "layer_strip_figure", "layer_option_text", "BREAKDOWN_PARTS"]

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
    mark_memory_cap(fig, [r["memory_gib"] for r in rows], memory_cap_gib, row=1, col=2, axis="x")
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1])
    return apply_layout(fig, barmode="stack", title=title or "Ranked strategies: where the iteration goes",
                        height=max(280, 90 + 26 * len(rows)), legend={"y": -0.12},
                        margin={"l": 200, "r": 20, "t": 70, "b": 40})


def select_plan(fig: go.Figure, selected: str | None) -> None:
    """Outline ``selected`` in a :func:`plan_breakdown_figure`, in place."""
    for trace in fig.data:
        trace.marker.line.width = _outline(list(trace.y), selected)


def layer_option_text(layer: dict[str, Any]) -> str:
    """``DDP``, ``FSDP + TP2``, ``ZeRO-2 + TP4 strided + recompute``: one layer's options in words."""
    words = [{"replicate": "DDP", "zero2": "ZeRO-2", "fsdp": "FSDP"}.get(layer["dp_kind"], layer["dp_kind"])]
    if layer.get("tp", 1) > 1:
        kind = "2D " if layer.get("tp_kind") == "2d" else ""
        words.append(f"{kind}TP{layer['tp']}" + ("" if layer.get("consecutive", True) else " strided"))
    if layer.get("recompute"):
        words.append("recompute")
    return " + ".join(words)


def layer_strip_figure(layers: Sequence[dict[str, Any]], *, stage_memory_gib: Sequence[float] | None = None,
                       budget_gib: float | None = None, title: str | None = None) -> go.Figure:
    """A plan's options along the layers: one coloured cell per layer (a colour per distinct option), stage
    boundaries marked; beside it each stage's memory per device against the budget.

    ``layers``: ``RankedPlan.layers()`` rows (``name``, ``tp``, ``dp_kind``,
    ``recompute``; ``stage``, ``tp_kind`` and ``consecutive`` if known).
    """
    if not layers:
        raise ValueError("layer_strip_figure needs the plan's layers (name, tp, dp_kind, recompute)")
    for i, layer in enumerate(layers):
        missing = [k for k in ("name", "tp", "dp_kind", "recompute") if k not in layer]
        if missing:
            raise ValueError(f"layer {i} ({layer.get('name', '?')}) lacks {missing}")
    texts = [layer_option_text(l) for l in layers]
    options = list(dict.fromkeys(texts))
    with_memory = bool(stage_memory_gib)
    fig = make_subplots(rows=1, cols=2 if with_memory else 1, column_widths=[0.75, 0.25] if with_memory else None,
                        horizontal_spacing=0.08,
                        subplot_titles=["options per layer"] + (["memory per device by stage (GiB)"] if with_memory
                                                                else []))
    for k, option in enumerate(options):
        index = [i for i, t in enumerate(texts) if t == option]
        fig.add_trace(go.Bar(x=index, y=[1] * len(index), name=option, width=1.0,
                             marker={"color": palette_color(k), "line": {"width": 0.5, "color": "white"}},
                             customdata=[layers[i]["name"] for i in index],
                             hovertemplate=f"layer %{{x}} %{{customdata}}<br>{option}<extra></extra>"), row=1, col=1)
    stages = [l.get("stage", 0) for l in layers]
    for i in range(1, len(layers)):
        if stages[i] != stages[i - 1]:
            fig.add_vline(x=i - 0.5, line_width=3, line_color="black", row=1, col=1)
    fig.update_yaxes(visible=False, range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text="layer", range=[-0.5, len(layers) - 0.5], row=1, col=1)
    if with_memory:
        names = [f"stage {k}" for k in range(len(stage_memory_gib))]
        fig.add_trace(go.Bar(x=names, y=list(stage_memory_gib), name="memory", marker={"color": MEMORY_COLOR},
                             showlegend=False, hovertemplate="%{x}: %{y:.2f} GiB<extra></extra>"), row=1, col=2)
        mark_memory_cap(fig, stage_memory_gib, budget_gib, row=1, col=2)
    return apply_layout(fig, barmode="overlay", title=title or "Per-layer plan", height=300,
                        legend={"orientation": "h", "y": -0.35}, margin={"l": 40, "r": 20, "t": 70, "b": 90})
