"""The chosen stage-to-device placement and what its communication is predicted to cost.

A placement is easiest to judge as a picture of the devices, node by node,
with each pipeline drawn as a path through the stages it visits: a segment
that crosses the dotted node line travels over the slow link, and its width
says how many bytes go over it. ``placement_figure`` draws that for the
chosen mapping on the left and, on the right, the predicted milliseconds of
every transfer (boundary of a replica, all-reduce of a stage) for the chosen
and the naive node-major mapping side by side, coloured by link.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.costs import ClusterSpec
from ..core.topology import Topology
from .style import apply_layout, palette_color

__all__ = ["placement_figure"]


def placement_figure(placement, cluster: ClusterSpec, *, title: str | None = None) -> go.Figure:
    """Devices with the pipelines drawn through them, and chosen vs naive cost per transfer.

    ``placement`` is a :class:`workbench.planning.partitioning.placement.Placement` (any
    object with its ``device_of``, ``num_stages``, ``rows``, ``naive_rows``,
    ``cost_ms`` and ``naive_cost_ms``).
    """
    d, S = cluster.devices_per_node, placement.num_stages
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.12,
                        subplot_titles=("devices (row = node)", "predicted ms per iteration"))
    fig.add_trace(go.Scatter(
        x=[dev % d for dev in range(cluster.world_size)], y=[dev // d for dev in range(cluster.world_size)],
        mode="markers", marker=dict(symbol="square", size=34, color="#eee", line=dict(color="#bbb", width=1)),
        hoverinfo="skip", showlegend=False), row=1, col=1)
    heaviest = max([r["bytes"] for r in placement.rows if r["what"].startswith("replica")] or [1]) or 1
    layout = Topology(dp=len(placement.device_of) // S, pp=S)
    for g, pipeline in enumerate(layout.groups("pp")):
        devices = [placement.device_of[r] for r in pipeline]
        color = palette_color(g)
        for s in range(S - 1):
            row = placement.rows[g * (S - 1) + s]
            a, b = devices[s], devices[s + 1]
            fig.add_trace(go.Scatter(
                x=[a % d, b % d], y=[a // d, b // d], mode="lines", showlegend=False,
                line=dict(color=color, width=1 + 7 * row["bytes"] / heaviest),
                hovertext=f"{row['what']}: {row['bytes'] / 1e6:.3f} MB over {row['link']}, {row['ms']:.3f} ms",
                hoverinfo="text"), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=[dev % d for dev in devices], y=[dev // d for dev in devices], mode="markers+text",
            marker=dict(symbol="square", size=34, color=color, line=dict(color="white", width=2)),
            text=[f"s{s}" for s in range(S)], textfont=dict(color="white", size=12), name=f"replica {g}",
            hovertext=[f"replica {g} stage {s} on device {dev}" for s, dev in enumerate(devices)],
            hoverinfo="text"), row=1, col=1)
    for node in range(1, cluster.num_nodes):
        fig.add_hline(y=node - 0.5, line=dict(color="#888", dash="dot"), row=1, col=1)
    labels = [r["what"] for r in placement.rows]
    for name, rows, pattern in (("chosen", placement.rows, ""), ("naive", placement.naive_rows, "/")):
        fig.add_trace(go.Bar(
            y=labels, x=[r["ms"] for r in rows], orientation="h", name=f"{name} mapping",
            marker=dict(color=[palette_color(0 if r["link"] == cluster.intra_node.name else 3) for r in rows],
                        pattern_shape=pattern),
            text=[r["link"] for r in rows], textposition="auto",
            hovertext=[f"{name}: {r['bytes'] / 1e6:.3f} MB over {r['link']}, {r['ms']:.3f} ms" for r in rows],
            hoverinfo="text"), row=1, col=2)
    fig.update_yaxes(autorange="reversed", tickvals=list(range(cluster.num_nodes)),
                     ticktext=[f"node {n}" for n in range(cluster.num_nodes)], showgrid=False, zeroline=False,
                     row=1, col=1)
    fig.update_xaxes(visible=False, range=[-0.6, d - 0.4], row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_xaxes(title_text="ms (red: inter-node link, blue: intra-node)", row=1, col=2)
    apply_layout(
        fig,
        title=title or (f"placement on {cluster.name}: {placement.cost_ms:.3f} ms of communication per iteration "
                        f"(naive {placement.naive_cost_ms:.3f} ms)"),
        barmode="group", height=max(320, 60 * cluster.num_nodes + 28 * len(labels) + 160),
        width=1000, margin=dict(l=70, r=20, t=80, b=40))
    return fig
