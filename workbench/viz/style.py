"""One figure style: the colour of every schedule op, the shared palette and the layout defaults.

Problem. The same pipeline is drawn in many places: the simulated and the
measured timeline, the stage balance, the planner's breakdown, the job
monitor, the lessons. A reader compares them side by side, so a forward pass
has to be the same blue in every one of them, and the figures have to share
one look (template, font, legend placement); two colour maps drift apart as
soon as one is edited.

Approach. This module is the only place that names a colour. Ops are grouped
in categories (``F`` -> forward, ``SEND_F`` -> send/recv, ``STEP`` ->
optimizer ...), each with one colour: forward blue, backward green, and when
a zero-bubble schedule splits it, its input-gradient half teal and its
weight-gradient half a lighter green, point-to-point communication orange,
gradient all-reduce red, optimizer steps dark grey, weight stashing yellow,
and idle time a pale grey that is drawn explicitly so bubbles are visible
rather than blank. :data:`OP_COLORS` is the op -> colour map derived from
the categories; :data:`PALETTE` colours things that have no op (ranks,
replicas, axis coordinates); :func:`apply_layout` puts the layout defaults
on a figure, with each figure's own settings on top.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

__all__ = ["CATEGORY_COLORS", "CATEGORY_ORDER", "OP_CATEGORY", "OP_COLORS", "IDLE", "MEASURED_OPACITY",
           "category_of", "op_color", "PALETTE", "palette_color", "MEMORY_COLOR", "MEMORY_PEAK_COLOR",
           "STATE_COLORS", "EVAL_COLORS", "LAYOUT_DEFAULTS", "apply_layout", "mark_memory_cap"]

IDLE = "idle"
CATEGORY_COLORS = {
    "forward": "#4C78A8",
    "backward": "#54A24B",
    "input-grad": "#2E8B8B",
    "weight-grad": "#9BD18B",
    "send/recv": "#F58518",
    "all-reduce": "#E45756",
    "optimizer": "#6F6F6F",
    "weight stash": "#EECA3B",
    IDLE: "#DDDDDD",
}
CATEGORY_ORDER = tuple(CATEGORY_COLORS)  # legend and trace order of every timeline
OP_CATEGORY = {
    "F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad",
    "SEND_F": "send/recv", "RECV_F": "send/recv", "SEND_B": "send/recv", "RECV_B": "send/recv",
    "AR": "all-reduce", "STEP": "optimizer", "STASH": "weight stash", "RESTORE": "weight stash",
}
# the op -> colour map every figure reads ("idle" is the time between compute ops)
OP_COLORS = {op: CATEGORY_COLORS[category] for op, category in OP_CATEGORY.items()} | {IDLE: CATEGORY_COLORS[IDLE]}
MEASURED_OPACITY = 0.55  # the second of two overlaid runs, so the first stays readable where they overlap

# things that are not ops (ranks, replicas, axis coordinates) cycle through this palette
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6",
           "#9D755D", "#BAB0AC")
MEMORY_COLOR, MEMORY_PEAK_COLOR = "#B279A2", "#7A4F73"  # memory bars; the fullest one darker
# validation curves: the metric (accuracy or perplexity), the validation loss, and the target line
EVAL_COLORS = {"metric": "#54A24B", "val_loss": "#E45756", "target": "#7F7F7F"}
STATE_COLORS = {"RUNNING": "#2CA02C", "SUCCEEDED": "#1F77B4", "FAILED": "#D62728", "CANCELLED": "#7F7F7F",
                "STALLED": "#FF7F0E", "PENDING": "#BCBD22", "UNKNOWN": "#7F7F7F"}  # job and rank states

LAYOUT_DEFAULTS: dict[str, Any] = {
    "template": "plotly_white",  # a white plot area, on which the pale idle bars still show
    "colorway": PALETTE,
    "font": {"size": 12},
    "legend": {"orientation": "h"},
    "margin": {"l": 60, "r": 20, "t": 60, "b": 40},
}


def category_of(op: str) -> str:
    """The colour category of an event op (``"F"`` -> ``"forward"``)."""
    if op not in OP_CATEGORY:
        raise ValueError(f"unknown op {op!r}; known: {sorted(OP_CATEGORY)}")
    return OP_CATEGORY[op]


def op_color(op: str) -> str:
    """The colour of an op, or of ``"idle"``."""
    if op not in OP_COLORS:
        raise ValueError(f"unknown op {op!r}; known: {sorted(OP_COLORS)}")
    return OP_COLORS[op]


def palette_color(index: int) -> str:
    """The ``index``-th palette colour (cycling), e.g. for rank ``index``."""
    return PALETTE[index % len(PALETTE)]


def apply_layout(fig: go.Figure, **layout: Any) -> go.Figure:
    """Put :data:`LAYOUT_DEFAULTS` on ``fig``, then ``layout`` over them (nested keys merge); returns ``fig``."""
    fig.update_layout(LAYOUT_DEFAULTS)
    fig.update_layout(**layout)
    return fig


CAP_COLOR = "red"
CAP_OFF_SCALE = 1.5  # a cap more than this many times the fullest bar is written, not drawn (it would squash them)


def mark_memory_cap(fig: go.Figure, values: Any, cap: float | None, *, row: int, col: int, axis: str = "y",
                    unit: str = "GiB") -> None:
    """Scale a memory panel to its bars and mark the cap: a dashed line when it is near the bars, else a note
    saying it is off the scale (a far cap drawn as a line squashes every bar to nothing)."""
    values = [float(v) for v in values]
    top = max(values, default=0.0)
    update = fig.update_yaxes if axis == "y" else fig.update_xaxes
    if not cap or cap <= 0:
        if top > 0:
            update(range=[0, top * 1.15], row=row, col=col)
        return
    if top > 0 and cap > CAP_OFF_SCALE * top:
        update(range=[0, top * 1.3], row=row, col=col)
        text = f"cap {cap:.3g} {unit} (off the scale)"
        if axis == "y":
            fig.add_annotation(text=text, xref="x domain" if col == 1 else f"x{col} domain", x=1, xanchor="right",
                               yref="y" if col == 1 else f"y{col}", y=top * 1.25, showarrow=False,
                               font={"color": CAP_COLOR, "size": 11})
        else:
            fig.add_annotation(text=text, yref="y domain" if col == 1 else f"y{col} domain", y=1, yanchor="bottom",
                               xref="x" if col == 1 else f"x{col}", x=top * 1.25, xanchor="right", showarrow=False,
                               font={"color": CAP_COLOR, "size": 11})
        return
    line = fig.add_hline if axis == "y" else fig.add_vline
    kwargs = {"y": cap} if axis == "y" else {"x": cap}
    line(**kwargs, line_dash="dash", line_color=CAP_COLOR, annotation_text=f"cap {cap:.3g} {unit}", row=row, col=col)
    update(range=[0, max(top, cap) * 1.15], row=row, col=col)
