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

from .style import CATEGORY_COLORS

__all__ = ["balance_figure", "stage_values"]

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


def balance_figure(result: Any, *, title: str | None = None) -> go.Figure:
    """Per-stage time (stacked) and memory bars with the bottleneck stage marked."""
    data = stage_values(result)
    n = len(data["forward_ms"])
    partition = data.get("partition")
    bounds = getattr(partition, "bounds", None)
    labels = [f"s{k}" + (f" ({bounds[k][0]}-{bounds[k][1]})" if bounds else "") for k in range(n)]
    total = [f + b + c for f, b, c in zip(data["forward_ms"], data["backward_ms"], data["comm_ms"])]
    worst = max(range(n), key=total.__getitem__)
    has_memory = "memory_bytes" in data
    fig = make_subplots(rows=1, cols=2 if has_memory else 1,
                        subplot_titles=["time per micro-batch (ms)"] + (["memory (GiB)"] if has_memory else []))
    outline = [3 if k == worst else 0 for k in range(n)]
    for key, name, color in (("forward_ms", "forward", CATEGORY_COLORS["forward"]),
                             ("backward_ms", "backward", CATEGORY_COLORS["backward"]),
                             ("comm_ms", "boundary transfer", CATEGORY_COLORS["send/recv"])):
        fig.add_trace(go.Bar(x=labels, y=data[key], name=name, marker={"color": color,
                             "line": {"width": outline, "color": "black"}}), row=1, col=1)
    fig.add_annotation(x=labels[worst], y=total[worst], text=f"bottleneck {total[worst]:.3g} ms", showarrow=True,
                       arrowhead=2, yshift=4, row=1, col=1)
    if has_memory:
        mem = [m / GIB for m in data["memory_bytes"]]
        fullest = max(range(n), key=mem.__getitem__)
        fig.add_trace(go.Bar(x=labels, y=mem, name="memory", marker={
            "color": ["#B279A2" if k != fullest else "#7A4F73" for k in range(n)]}), row=1, col=2)
        cap = data.get("memory_cap_bytes")
        if cap:
            fig.add_hline(y=cap / GIB, line_dash="dash", line_color="red", annotation_text="cap", row=1, col=2)
    fig.update_layout(barmode="stack", title=title or (f"Stage balance {partition}" if partition else "Stage balance"),
                      height=380, legend={"orientation": "h", "y": -0.2})
    return fig
