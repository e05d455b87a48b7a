"""One picture each of data, pipeline and tensor parallelism: who holds which part of a 4-layer model.

Each panel shows two devices as rows and the model's layers as coloured blocks (one colour per layer,
the same in every panel), with what the devices must exchange written on the arrow between them.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..viz.style import apply_layout, palette_color

__all__ = ["strategy_pictures", "PANELS"]

LAYERS = 4
# panel title -> (what each device holds: (device, layer, share of the layer's width), the rows' labels, the arrow)
PANELS = {
    "data parallel": ([(d, layer, (0.0, 1.0)) for d in (0, 1) for layer in range(LAYERS)],
                      ("samples 0-31", "samples 32-63"), "all-reduce the gradients once per step"),
    "pipeline parallel": ([(0, layer, (0.0, 1.0)) for layer in (0, 1)] + [(1, layer, (0.0, 1.0)) for layer in (2, 3)],
                          ("layers 0-1", "layers 2-3"), "send activations forward, gradients back"),
    "tensor parallel": ([(d, layer, (0.5 * d, 0.5 * d + 0.5)) for d in (0, 1) for layer in range(LAYERS)],
                        ("half of every matrix", "the other half"), "all-reduce inside every layer"),
}


def _panel(fig: go.Figure, col: int, blocks, labels, arrow: str) -> None:
    for device, layer, (left, right) in blocks:
        y = 1 - device
        x0 = layer + 0.08 + left * 0.84
        fig.add_shape(type="rect", x0=x0, x1=x0 + (right - left) * 0.84, y0=y + 0.15, y1=y + 0.75,
                      fillcolor=palette_color(layer), line={"width": 1, "color": "white"}, row=1, col=col)
    for device, label in enumerate(labels):
        fig.add_annotation(x=-0.1, y=1 - device + 0.45, text=f"device {device}<br>{label}", showarrow=False,
                           xanchor="right", font={"size": 11}, row=1, col=col)
    fig.add_annotation(x=LAYERS / 2, y=0.95, ax=LAYERS / 2, ay=0.55, text="", showarrow=True, arrowhead=2,
                       arrowside="end+start", xref=f"x{col}", yref=f"y{col}", axref=f"x{col}", ayref=f"y{col}")
    fig.add_annotation(x=LAYERS / 2, y=-0.2, text=arrow, showarrow=False, font={"size": 11}, row=1, col=col)


def strategy_pictures() -> go.Figure:
    """Three panels: data parallel, pipeline parallel, tensor parallel, for two devices and four layers."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=list(PANELS), horizontal_spacing=0.12)
    for col, (blocks, labels, arrow) in enumerate(PANELS.values(), start=1):
        _panel(fig, col, blocks, labels, arrow)
        fig.update_xaxes(range=[-1.9, LAYERS + 0.1], visible=False, row=1, col=col)
        fig.update_yaxes(range=[-0.35, 2.0], visible=False, row=1, col=col)
    for layer in range(LAYERS):  # the legend: one colour per layer
        fig.add_scatter(x=[None], y=[None], mode="markers", name=f"layer {layer}",
                        marker={"symbol": "square", "size": 12, "color": palette_color(layer)}, row=1, col=1)
    return apply_layout(fig, title="Three ways to split training over two devices", height=300,
                        legend={"orientation": "h", "y": -0.1}, margin={"l": 20, "r": 20, "t": 70, "b": 30})
