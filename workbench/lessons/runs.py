"""Where a lesson's runs go, and what the lessons read back from a run's metrics."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go

from ..viz.style import apply_layout


def is_smoke_run() -> bool:
    """True when ``WORKBENCH_SMOKE=1`` asks for the small sizes the test suite runs."""
    return os.environ.get("WORKBENCH_SMOKE") == "1"


def repo_root(start: Path | None = None) -> Path:
    """The project folder: ``start`` (default: the working directory) or the first of its parents that holds
    ``launch/`` (a lesson runs in ``notebooks/``, a script from the project folder)."""
    here = Path.cwd() if start is None else Path(start)
    found = next((p for p in (here, *here.parents) if (p / "launch").is_dir()), None)
    if found is None:
        raise FileNotFoundError(f"no folder with launch/ at or above {here}: open the lesson from the project")
    return found


def lesson_run_root(start: Path | None = None) -> str:
    """Where a lesson's runs go: ``WORKBENCH_RUN_ROOT`` when set, else the project's ``runs/``."""
    return os.environ.get("WORKBENCH_RUN_ROOT") or str(repo_root(start) / "runs")


def rank_losses(frame, rank: int = 0) -> list[float]:
    """The loss of every step ``rank`` reported, in step order, from a job's metrics frame."""
    return frame[frame["rank"] == rank].sort_values("step")["loss"].tolist()


def median_samples_per_s(frame, after_step: int = 1) -> float:
    """Median samples/s of rank 0 over the steps after ``after_step`` (the first steps include warm-up)."""
    rows = frame[(frame["rank"] == 0) & (frame["step"] > after_step)]
    return float(rows["samples_per_s"].median())


def median_step_ms(frame, from_step: int = 2) -> float:
    """The median step time from ``from_step`` on, each step timed by its slowest rank."""
    per_step = frame.groupby("step")["step_ms"].max()
    return float(statistics.median(per_step[per_step.index >= from_step]))


def loss_figure(curves: Mapping[str, Sequence[float]], *, title: str = "Training loss per step",
                x_title: str = "step - 1", mode: str = "lines+markers", **layout) -> go.Figure:
    """One line per run: its loss at every step."""
    fig = go.Figure([go.Scatter(y=list(losses), name=name, mode=mode) for name, losses in curves.items()])
    return apply_layout(fig, title=title, xaxis_title=x_title, yaxis_title="loss", **layout)
