"""Where the lessons' runs go and what they read back from a run's metrics."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.lessons.runs import (is_smoke_run, lesson_run_root, loss_figure, median_samples_per_s,
                                    median_step_ms, rank_losses, repo_root)


def _metrics() -> pd.DataFrame:
    rows = []
    for rank in (0, 1):
        for step in (3, 1, 2, 4):  # out of order, as frames of several ranks may be
            rows.append({"rank": rank, "step": step, "loss": 10.0 * rank + step,
                         "samples_per_s": 100.0 * step + rank, "step_ms": 5.0 * step + 20 * rank})
    return pd.DataFrame(rows)


def test_repo_root_is_the_first_folder_up_with_launch(tmp_path, monkeypatch):
    (tmp_path / "launch").mkdir()
    (tmp_path / "notebooks" / "deep").mkdir(parents=True)
    assert repo_root(tmp_path / "notebooks" / "deep") == tmp_path
    monkeypatch.chdir(tmp_path / "notebooks")
    assert repo_root() == tmp_path


def test_repo_root_says_where_it_looked_when_there_is_no_project(tmp_path):
    with pytest.raises(FileNotFoundError, match="no folder with launch/"):
        repo_root(tmp_path)


def test_the_run_root_is_the_environments_or_the_projects_runs(tmp_path, monkeypatch):
    (tmp_path / "launch").mkdir()
    monkeypatch.delenv("WORKBENCH_RUN_ROOT", raising=False)
    assert lesson_run_root(tmp_path) == str(tmp_path / "runs")
    monkeypatch.setenv("WORKBENCH_RUN_ROOT", "/shared/runs")
    assert lesson_run_root(tmp_path) == "/shared/runs"


def test_a_smoke_run_is_asked_for_by_workbench_smoke(monkeypatch):
    monkeypatch.setenv("WORKBENCH_SMOKE", "1")
    assert is_smoke_run()
    monkeypatch.setenv("WORKBENCH_SMOKE", "0")
    assert not is_smoke_run()


def test_losses_throughput_and_step_times_from_a_metrics_frame():
    frame = _metrics()
    assert rank_losses(frame) == [1.0, 2.0, 3.0, 4.0]
    assert rank_losses(frame, 1) == [11.0, 12.0, 13.0, 14.0]
    assert median_samples_per_s(frame) == 300.0  # rank 0, steps 2-4: 200, 300, 400
    assert median_samples_per_s(frame, after_step=3) == 400.0
    assert median_step_ms(frame, from_step=2) == 35.0  # the slower rank: 30, 35, 40
    assert median_step_ms(frame, from_step=1) == 32.5


def test_the_loss_figure_draws_one_line_per_run():
    fig = loss_figure({"a": [3.0, 2.0], "b": [3.0, 2.5, 2.0]}, height=320)
    assert [trace.name for trace in fig.data] == ["a", "b"]
    assert list(fig.data[1].y) == [3.0, 2.5, 2.0]
    assert fig.layout.yaxis.title.text == "loss" and fig.layout.height == 320
