"""Figures of a per-layer profile: where the time, the FLOPs and the memory go.

Partitioning is about per-layer imbalance, so each figure puts layers on the
x axis in model order: time as grouped forward/backward bars (error bars are
the spread over repeats), with the backward's input-gradient (I) and
weight-gradient (W) parts beside them where the profile measured them (the
split zero-bubble schedules run; timed apart they need not add up to the
fused backward), FLOPs per pass, memory stacked by kind (parameters,
gradients, optimizer state, saved activations, output). ``layer_cost_table``
shows the same numbers as a table. Pure functions of ``ModelCosts``; plotly
only.
"""

from __future__ import annotations

import plotly.graph_objects as go

from ..core.costs import ModelCosts
from .style import CATEGORY_COLORS, apply_layout, op_color

__all__ = ["layer_cost_bars", "layer_cost_table", "METRICS"]

METRICS = ("time", "flops", "memory")
MB = 1024 ** 2


def _title(costs: ModelCosts, what: str) -> str:
    return f"{costs.model}: {what} per layer (batch {costs.batch_size}, {costs.device}, {costs.dtype})"


def _has_split(costs: ModelCosts) -> bool:
    return any(layer.has_split_backward for layer in costs.layers)


def _time_bars(costs: ModelCosts) -> list[go.Bar]:
    bars = [
        go.Bar(name="forward", x=costs.names, y=costs.column("forward_ms"), marker_color=CATEGORY_COLORS["forward"],
               error_y={"type": "data", "array": costs.column("forward_ms_spread"), "visible": True}),
        go.Bar(name="backward", x=costs.names, y=costs.column("backward_ms"), marker_color=CATEGORY_COLORS["backward"],
               error_y={"type": "data", "array": costs.column("backward_ms_spread"), "visible": True}),
    ]
    if _has_split(costs):  # I in the backward's colour, hatched apart from the fused bar; W in its own
        for label, op, attr, pattern in (("input grad (I)", "I", "input_grad_ms", "/"),
                                         ("weight grad (W)", "W", "weight_grad_ms", "")):
            bars.append(go.Bar(name=label, x=costs.names, y=costs.column(attr), marker_color=op_color(op),
                               marker_pattern_shape=pattern,
                               error_y={"type": "data", "array": costs.column(f"{attr}_spread"), "visible": True}))
    return bars


def _flop_bars(costs: ModelCosts) -> list[go.Bar]:
    bars = [go.Bar(name="forward", x=costs.names, y=[f / 1e9 for f in costs.column("flops")],
                   marker_color=CATEGORY_COLORS["forward"])]
    backward = costs.meta.get("backward_flops")
    if isinstance(backward, list) and len(backward) == len(costs):
        bars.append(go.Bar(name="backward", x=costs.names, y=[f / 1e9 for f in backward],
                           marker_color=CATEGORY_COLORS["backward"]))
    return bars


def _memory_bars(costs: ModelCosts) -> list[go.Bar]:
    kinds = [("parameters", "param_bytes"), ("gradients", "grad_bytes"), ("optimizer state", "optimizer_bytes"),
             ("saved for backward", "saved_bytes"), ("output", "activation_bytes")]
    return [go.Bar(name=label, x=costs.names, y=[(v or 0) / MB for v in costs.column(attr)]) for label, attr in kinds]


def layer_cost_bars(costs: ModelCosts, metric: str = "time") -> go.Figure:
    """Per-layer bars of ``metric``: 'time' (ms), 'flops' (GFLOP) or 'memory' (MiB)."""
    if not isinstance(costs, ModelCosts):
        raise ValueError(f"costs must be a ModelCosts, got {type(costs).__name__}")
    builders = {"time": (_time_bars, "time (ms)", "group"), "flops": (_flop_bars, "GFLOP", "group"),
                "memory": (_memory_bars, "MiB", "stack")}
    if metric not in builders:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    build, axis_title, mode = builders[metric]
    figure = go.Figure(build(costs))
    return apply_layout(figure, barmode=mode, title=_title(costs, metric), xaxis_title="layer",
                        yaxis_title=axis_title, legend={"y": -0.25})


def layer_cost_table(costs: ModelCosts) -> go.Figure:
    """All per-layer numbers as a plotly table (times in ms, FLOPs in GFLOP, bytes in MiB)."""
    if not isinstance(costs, ModelCosts):
        raise ValueError(f"costs must be a ModelCosts, got {type(costs).__name__}")
    columns = {
        "layer": costs.names,
        "fwd ms": [f"{v:.3f}" for v in costs.column("forward_ms")],
        "bwd ms": [f"{v:.3f}" for v in costs.column("backward_ms")],
        **({"I ms": [f"{v:.3f}" if v is not None else "-" for v in costs.column("input_grad_ms")],
            "W ms": [f"{v:.3f}" if v is not None else "-" for v in costs.column("weight_grad_ms")]}
           if _has_split(costs) else {}),
        "GFLOP": [f"{v / 1e9:.3f}" for v in costs.column("flops")],
        "params": [f"{v:,}" for v in costs.column("num_params")],
        "param MiB": [f"{v / MB:.2f}" for v in costs.column("param_bytes")],
        "output MiB": [f"{v / MB:.2f}" for v in costs.column("activation_bytes")],
        "saved MiB": [f"{v / MB:.2f}" for v in costs.column("saved_bytes")],
        "peak MiB": [f"{v / MB:.2f}" for v in costs.column("peak_bytes")],
    }
    figure = go.Figure(go.Table(header={"values": list(columns)}, cells={"values": list(columns.values())}))
    return apply_layout(figure, title=_title(costs, "costs"))
