"""Lesson 06, 2D tensor parallelism: blocks on a q x q grid, SUMMA's broadcasts drawn step by step, the cost
model's memory per rank for dense, 1D and 2D, and the dense twin a real grid run is checked against."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..planning.costs.tensor_costs import (TransformerShape, activation_bytes_per_rank, collective_calls,
                                           param_bytes_per_rank)
from ..viz.style import apply_layout
from .text import text_table

MIB = 2**20
# a rank that sends nothing, its A block along its row, its B block down its column, or both
ROLE_COLORS = [[0, "#eeeeee"], [1 / 3, "#1f77b4"], [2 / 3, "#ff7f0e"], [1, "#9467bd"]]


def blocks(matrix: np.ndarray, q: int) -> list[list[np.ndarray]]:
    """The q x q blocks of ``matrix``: ``blocks[i][j]`` lives on rank (i, j)."""
    return [np.hsplit(band, q) for band in np.vsplit(matrix, q)]


def summa_broadcasts(q: int) -> list[tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]]:
    """Per SUMMA step ``t``: the rank that broadcasts along each row i (rank (i, t) sends A_it) and down each
    column j (rank (t, j) sends B_tj)."""
    return [({i: (i, t) for i in range(q)}, {j: (t, j) for j in range(q)}) for t in range(q)]


def summa_step_figure(q: int) -> go.Figure:
    """One panel per SUMMA step on the grid: what each rank multiplies, and which ranks send."""
    fig = make_subplots(rows=1, cols=q, subplot_titles=[f"step t = {t}" for t in range(q)], horizontal_spacing=0.06)
    for t, (row_senders, col_senders) in enumerate(summa_broadcasts(q)):
        role = np.zeros((q, q))
        for i, j in row_senders.values():
            role[i, j] += 1
        for i, j in col_senders.values():
            role[i, j] += 2
        text = [[f"r{i * q + j}<br>A{i}{t}·B{t}{j}" for j in range(q)] for i in range(q)]
        fig.add_trace(go.Heatmap(z=role, text=text, texttemplate="%{text}", zmin=0, zmax=3, showscale=False,
                                 colorscale=ROLE_COLORS, xgap=3, ygap=3, hoverinfo="skip"), row=1, col=t + 1)
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(title="SUMMA: broadcasts and block products per step", height=320, margin={"t": 80})
    return fig


def per_rank_comparison(shape: TransformerShape, q: int) -> dict[str, dict[str, float]]:
    """Per mode (dense on one rank, 1D over q * q ranks, 2D on a q x q grid): its ranks, and each rank's
    parameters and activations in MiB and collective calls per step, from the cost model."""
    comparison = {}
    for mode, degree, ranks in (("dense", 1, 1), ("1d", q * q, q * q), ("2d", q, q * q)):
        comparison[mode] = {
            "ranks": ranks,
            "params_mib": param_bytes_per_rank(shape, mode, degree) / MIB,
            "activations_mib": activation_bytes_per_rank(shape, mode, degree) / MIB,
            "collective_calls": 0 if mode == "dense" else collective_calls(shape, mode, degree)["total"],
        }
    return comparison


def comparison_table(comparison: Mapping[str, Mapping[str, float]]) -> str:
    rows = [(mode, row["ranks"], row["params_mib"], row["activations_mib"], row["collective_calls"])
            for mode, row in comparison.items()]
    return text_table(["mode", "ranks", "params MiB/rank", "activations MiB/rank", "collective calls/step"], rows,
                      ["<7", ">6", ">17.1f", ">22.1f", ">23"])


def memory_figure(comparison: Mapping[str, Mapping[str, float]], title: str) -> go.Figure:
    """Parameters and activations per rank of each mode, side by side."""
    fig = go.Figure([go.Bar(name=name, x=list(comparison), y=[row[key] for row in comparison.values()])
                     for name, key in (("parameters", "params_mib"), ("activations", "activations_mib"))])
    return apply_layout(fig, title=title, barmode="group", height=320)


def dense_twin(config: Any) -> tuple[Any, Iterator]:
    """The dense GPT-2 a tensor-parallel ``config`` cuts into blocks (the same seed, so the same initial weights)
    and the global batches its run trains on, in order: what one process trains to check the grid against."""
    from ..models import build_model
    from ..runtime.batches import global_batches
    from ..runtime.strategies.tensor2d.train import TensorParallelConfig, dense_gpt2
    from ..runtime.strategies.tensor_parallel import GPT2_SIZES

    sequence = build_model(config.model.name, seed=config.training.seed, **config.model.overrides)
    dense = dense_gpt2(TensorParallelConfig(mode="dense", seed=config.training.seed, device="cpu",
                                            **{k: int(sequence.config[k]) for k in GPT2_SIZES}))
    return dense, global_batches(config, sequence)
