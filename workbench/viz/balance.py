"""Stage balance: time and memory per pipeline stage, bottleneck marked.

A partition is judged by its slowest stage (it paces the pipeline) and by
its fullest stage (it decides whether the partition fits at all). The figure
puts the two side by side: stacked forward / backward / boundary-transfer
time per stage with the bottleneck outlined and annotated, and memory per
stage against the device cap when one is known. Input is a partition result
(anything with ``stage_forward_ms``, ``stage_backward_ms``,
``stage_memory_bytes`` ...) or a plain dict of per-stage lists.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import CATEGORY_COLORS, MEMORY_COLOR, MEMORY_PEAK_COLOR, apply_layout, mark_memory_cap

__all__ = ["balance_figure", "stage_values", "update_balance_figure"]

GIB = 2**30


def stage_values(result: Any) -> dict[str, Any]:
    """Normalise a partition result or dict to per-stage lists."""
    if isinstance(result, dict):
        data = dict(result)
    else:
        data = {name: getattr(result, attr) for name, attr in (
            ("forward_ms", "stage_forward_ms"), ("backward_ms", "stage_backward_ms"), ("comm_ms", "stage_comm_ms"),
            ("memory_bytes", "stage_memory_bytes"), ("memory_cap_bytes", "memory_cap_bytes"),
            ("partition", "partition")) if hasattr(result, attr)}
    if "compute_ms" in data and "forward_ms" not in data:
        data["forward_ms"], data["backward_ms"] = list(data["compute_ms"]), [0.0] * len(data["compute_ms"])
    if "forward_ms" not in data:
        raise ValueError("balance_figure needs per-stage times: a partition result or a dict with 'compute_ms' "
                         "or 'forward_ms'/'backward_ms'")
    n = len(data["forward_ms"])
    data.setdefault("backward_ms", [0.0] * n)
    data.setdefault("comm_ms", [0.0] * n)
    for key in ("backward_ms", "comm_ms", "memory_bytes"):
        if key in data and len(data[key]) != n:
            raise ValueError(f"'{key}' has {len(data[key])} stages but 'forward_ms' has {n}")
    return data


_TIME_BARS = (("forward_ms", "forward", CATEGORY_COLORS["forward"]),
              ("backward_ms", "backward", CATEGORY_COLORS["backward"]),
              ("comm_ms", "boundary transfer", CATEGORY_COLORS["send/recv"]))


def _bar_values(data: dict[str, Any]) -> dict[str, Any]:
    """Stage labels, the bottleneck and its outline, and memory bars with the fullest stage darkened."""
    n = len(data["forward_ms"])
    bounds = getattr(data.get("partition"), "bounds", None)
    labels = [f"s{k}" + (f" ({bounds[k][0]}-{bounds[k][1]})" if bounds else "") for k in range(n)]
    total = [f + b + c for f, b, c in zip(data["forward_ms"], data["backward_ms"], data["comm_ms"])]
    worst = max(range(n), key=total.__getitem__)
    out = {"labels": labels, "worst": worst, "worst_ms": total[worst], "outline": [3 if k == worst else 0 for k in range(n)]}
    if "memory_bytes" in data:
        mem = [m / GIB for m in data["memory_bytes"]]
        fullest = max(range(n), key=mem.__getitem__)
        out["memory_gib"] = mem
        out["memory_colors"] = [MEMORY_PEAK_COLOR if k == fullest else MEMORY_COLOR for k in range(n)]
    return out


def _title(data: dict[str, Any], title: str | None) -> str:
    partition = data.get("partition")
    return title or (f"Stage balance {partition}" if partition else "Stage balance")


def update_balance_figure(fig: go.Figure, result: Any, *, title: str | None = None) -> bool:
    """Put ``result`` into ``fig`` (a ``balance_figure`` with as many stages) in place.

    Returns False, leaving ``fig`` as it was, when the stage count or the
    memory panel differ (then draw a new figure).
    """
    data = stage_values(result)
    values = _bar_values(data)
    names = [name for _, name, _ in _TIME_BARS] + (["memory"] if "memory_gib" in values else [])
    if [t.name for t in fig.data] != names or len(fig.data[0].x) != len(values["labels"]):
        return False
    for trace, (key, _, _) in zip(fig.data, _TIME_BARS):  # plain property sets: the cheapest path in plotly
        trace.x = values["labels"]
        trace.y = data[key]
        trace.marker.line.width = values["outline"]
    if "memory_gib" in values:
        fig.data[3].x = values["labels"]
        fig.data[3].y = values["memory_gib"]
        fig.data[3].marker.color = values["memory_colors"]
    mark = fig.layout.annotations[fig.layout.meta["bottleneck_annotation"]]
    mark.x, mark.y = values["labels"][values["worst"]], values["worst_ms"]
    mark.text = f"bottleneck {values['worst_ms']:.3g} ms"
    fig.layout.title.text = _title(data, title)
    return True


def balance_figure(result: Any, *, title: str | None = None) -> go.Figure:
    """Per-stage time (stacked) and memory bars with the bottleneck stage marked."""
    data = stage_values(result)
    values = _bar_values(data)
    labels, worst = values["labels"], values["worst"]
    has_memory = "memory_gib" in values
    fig = make_subplots(rows=1, cols=2 if has_memory else 1,
                        subplot_titles=["time per micro-batch (ms)"] + (["memory (GiB)"] if has_memory else []))
    for key, name, color in _TIME_BARS:
        fig.add_trace(go.Bar(x=labels, y=data[key], name=name, marker={"color": color,
                             "line": {"width": values["outline"], "color": "black"}}), row=1, col=1)
    fig.add_annotation(x=labels[worst], y=values["worst_ms"], text=f"bottleneck {values['worst_ms']:.3g} ms",
                       showarrow=True, arrowhead=2, yshift=4, row=1, col=1)
    fig.update_layout(meta={"bottleneck_annotation": len(fig.layout.annotations) - 1})
    if has_memory:
        fig.add_trace(go.Bar(x=labels, y=values["memory_gib"], name="memory",
                             marker={"color": values["memory_colors"]}), row=1, col=2)
        cap = data.get("memory_cap_bytes")
        mark_memory_cap(fig, values["memory_gib"], cap / GIB if cap else None, row=1, col=2)
    return apply_layout(fig, barmode="stack", title=_title(data, title), height=380, legend={"y": -0.2})
