"""The rank grid of a parallel layout, coloured by one axis.

Hybrid parallelism is easiest to explain as a picture of the ranks: which
ranks form a pipeline, which hold the same stage (and so all-reduce
together), which form a tensor-parallel row or column, and which share a
node. ``topology_figure`` draws every rank as a tile laid out node by node
(or by the first axis when no cluster is given), coloured by its coordinate
on the chosen axis, with every coordinate in the hover text.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from ..core.costs import ClusterSpec
from ..core.topology import Topology
from .style import apply_layout, palette_color

__all__ = ["topology_figure", "tile_positions"]


def tile_positions(topology: Topology, cluster: ClusterSpec | None = None) -> list[tuple[int, int]]:
    """(row, column) of every rank: one row per node, or per first-axis index."""
    n = topology.world_size
    if cluster is not None:
        if cluster.world_size != n:
            raise ValueError(f"cluster {cluster.name} has {cluster.world_size} devices but the layout has {n} ranks")
        per_row = cluster.devices_per_node
    else:
        per_row = n // topology.sizes[0] if len(topology.sizes) > 1 else min(n, 8)
    return [(r // per_row, r % per_row) for r in range(n)]


def topology_figure(topology: Topology, color_by: str | None = None, *, cluster: ClusterSpec | None = None,
                    title: str | None = None) -> go.Figure:
    """Tiles for every rank, coloured by ``color_by`` (default: the last axis)."""
    axis = color_by or topology.names[-1]
    if axis not in topology.names:
        raise ValueError(f"color_by must be one of the layout's axes {list(topology.names)}, got {axis!r}")
    positions = tile_positions(topology, cluster)
    rows = max(p[0] for p in positions) + 1
    cols = max(p[1] for p in positions) + 1
    fig = go.Figure()
    for value in range(topology.size(axis)):
        ranks = [r for r in range(topology.world_size) if topology.coord(r, axis) == value]
        fig.add_trace(go.Scatter(
            x=[positions[r][1] for r in ranks],
            y=[positions[r][0] for r in ranks],
            mode="markers+text",
            marker=dict(symbol="square", size=min(80, 480 // max(cols, 1)), color=palette_color(value),
                        line=dict(color="white", width=2)),
            text=[f"r{r}" for r in ranks],
            textfont=dict(color="white", size=13),
            hovertext=[", ".join(f"{k}={v}" for k, v in topology.coords(r).items()) for r in ranks],
            hoverinfo="text",
            name=f"{axis}={value}",
        ))
    row_label = "node" if cluster is not None else (topology.names[0] if len(topology.names) > 1 else "row")
    apply_layout(
        fig,
        title=title or f"{topology} (world size {topology.world_size}), coloured by {axis}",
        xaxis=dict(visible=False, range=[-0.6, cols - 0.4]),
        yaxis=dict(range=[rows - 0.4, -0.6], tickvals=list(range(rows)), ticktext=[f"{row_label} {i}" for i in range(rows)],
                   showgrid=False, zeroline=False),
        legend_title_text=axis,
        height=max(220, 110 * rows + 120),
        width=max(420, int(100 * cols + 240)),
        margin=dict(l=70, r=20, t=60, b=20),
    )
    if cluster is not None and math.isfinite(rows):
        for node in range(1, rows):
            fig.add_hline(y=node - 0.5, line=dict(color="#888", dash="dot"))
    return fig
