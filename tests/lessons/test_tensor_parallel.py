"""Lesson 06's helpers: blocks on the grid, SUMMA's broadcasts, memory per rank, and the dense twin of a grid run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workbench.core.config import RunConfig
from workbench.lessons.tensor_parallel import (blocks, comparison_table, dense_twin, memory_figure,
                                               per_rank_comparison, summa_broadcasts, summa_step_figure)
from workbench.planning.costs.tensor_costs import TransformerShape

ROOT = Path(__file__).resolve().parents[2]
GPT2_SMALL = TransformerShape(hidden=768, heads=12, layers=12, vocab=50257, positions=1024, batch=8, seq=1024)


def test_blocks_tile_the_matrix_row_by_row():
    matrix = np.arange(24.0).reshape(4, 6)
    grid = blocks(matrix, 2)
    assert [[b.shape for b in row] for row in grid] == [[(2, 3), (2, 3)], [(2, 3), (2, 3)]]
    assert grid[1][0].tolist() == [[12.0, 13.0, 14.0], [18.0, 19.0, 20.0]]
    assert np.array_equal(np.block(grid), matrix)


def test_summa_broadcasts_send_column_t_along_rows_and_row_t_down_columns():
    steps = summa_broadcasts(3)
    assert len(steps) == 3
    rows, cols = steps[1]
    assert rows == {0: (0, 1), 1: (1, 1), 2: (2, 1)} and cols == {0: (1, 0), 1: (1, 1), 2: (1, 2)}
    # adding the products the broadcasts bring to each rank gives A @ B
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((6, 9)), rng.standard_normal((9, 3))
    a, b = blocks(A, 3), blocks(B, 3)
    C = [[sum(a[i][rows_t[i][1]] @ b[cols_t[j][0]][j] for rows_t, cols_t in steps) for j in range(3)]
         for i in range(3)]
    assert np.allclose(np.block(C), A @ B)


def test_the_step_figure_has_a_panel_per_step_and_colours_the_senders():
    fig = summa_step_figure(2)
    assert len(fig.data) == 2
    # step 0: rank (0, 0) sends both blocks (3), (1, 0) its A block (1), (0, 1) its B block (2)
    assert np.asarray(fig.data[0].z).tolist() == [[3.0, 2.0], [1.0, 0.0]]
    assert np.asarray(fig.data[1].z).tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert fig.data[1].text[1][0] == "r2<br>A11·B10"


def test_2d_keeps_the_fewest_activations_per_rank_for_more_collective_calls():
    comparison = per_rank_comparison(GPT2_SMALL, 2)
    assert list(comparison) == ["dense", "1d", "2d"]
    assert [row["ranks"] for row in comparison.values()] == [1, 4, 4]
    assert comparison["2d"]["activations_mib"] < comparison["1d"]["activations_mib"] < \
        comparison["dense"]["activations_mib"]
    assert comparison["2d"]["params_mib"] < comparison["dense"]["params_mib"] / 3
    assert comparison["dense"]["collective_calls"] == 0 < comparison["1d"]["collective_calls"] < \
        comparison["2d"]["collective_calls"]
    lines = comparison_table(comparison).splitlines()
    assert lines[0].split()[:2] == ["mode", "ranks"] and [line.split()[0] for line in lines[1:]] == ["dense", "1d", "2d"]
    assert lines[3].split()[2] == f"{comparison['2d']['params_mib']:.1f}"
    fig = memory_figure(comparison, "memory")
    assert [t.name for t in fig.data] == ["parameters", "activations"] and list(fig.data[0].x) == ["dense", "1d", "2d"]


def test_the_dense_twin_trains_the_same_way_every_time():
    torch = pytest.importorskip("torch")
    config = RunConfig.from_toml(ROOT / "launch" / "tensor2d_gpt2.toml").replace(training={"steps": 2})

    def first_losses():
        model, batches = dense_twin(config)
        out = []
        for _, (token_ids, _targets) in zip(range(2), batches):
            out.append(model(token_ids, labels=token_ids).loss.item())
        return out

    torch.set_num_threads(1)
    first, again = first_losses(), first_losses()
    assert first == again and all(np.isfinite(first))
    assert first[0] == pytest.approx(np.log(256), rel=0.2)  # untrained over a byte vocabulary: about ln 256
