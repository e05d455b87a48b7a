"""Time to accuracy: the evaluations of a lesson's runs, checked, drawn and put in words.

A run with ``evaluation.every`` and a ``target_accuracy`` evaluates itself every ``every`` steps and after its
last; its ``evals()`` frame holds one row per evaluation, and ``status().time_to_target`` says when it first
reached the target (``reached``, ``step``, ``train_s``, ``best``, ``metric``, ``target``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from ..viz.style import apply_layout
from .text import listing


def eval_steps(steps: int, every: int) -> list[int]:
    """The steps a run of ``steps`` steps evaluates at: every ``every`` steps, and after the last."""
    return sorted(set(range(every, steps + 1, every)) | {steps})


def _check(condition: bool, *detail: Any) -> None:
    if not condition:
        raise AssertionError(detail)


def check_evaluations(jobs: Mapping[str, Any], evals: Mapping[str, Any], reach: Mapping[str, dict], *,
                      steps: int, every: int, target: float) -> None:
    """Raise AssertionError unless every run evaluated on schedule (at :func:`eval_steps`, its last evaluation at
    the last step), its accuracies lie in [0, 1] and its training seconds grow, and its time to target reports
    the configured accuracy target, reached exactly when it names a step, with the best accuracy evaluated."""
    expected = eval_steps(steps, every)
    for label, frame in evals.items():
        _check(frame["step"].tolist() == expected, label, "evaluated at", frame["step"].tolist(), "not", expected)
        _check(bool(frame["accuracy"].between(0, 1).all()), label, "accuracy outside [0, 1]", frame)
        _check(bool(frame["train_s"].is_monotonic_increasing), label, "training seconds do not grow", frame)
        _check(jobs[label].status().last_eval["step"] == steps, label, "last evaluation not at step", steps)
        r = reach[label]
        _check(r["metric"] == "accuracy" and r["target"] == target, label, r)
        _check(r["reached"] == (r["step"] is not None) and r["best"] == frame["accuracy"].max(), label, r)


def accuracy_figure(evals: Mapping[str, Any], target: float, every: int) -> go.Figure:
    """Each run's validation accuracy against its training seconds, the target as a dashed line."""
    fig = go.Figure([go.Scatter(x=frame["train_s"], y=frame["accuracy"], name=label, mode="lines+markers")
                     for label, frame in evals.items()])
    apply_layout(fig, title=f"Validation accuracy, evaluated every {every} steps",
                 xaxis_title="training seconds (step times, evaluations excluded)",
                 yaxis_title="validation accuracy", yaxis_range=[0, 1], height=360)
    fig.add_hline(y=target, line_dash="dash", annotation_text=f"target {target:.0%}")
    return fig


def reach_text(reach: Mapping[str, dict], target: float, steps: int) -> str:
    """Which runs reached the target accuracy, at which step and after how many training seconds, and the best
    accuracy of those that did not, as one sentence."""
    reached = [label for label, r in reach.items() if r["reached"]]
    missed = [label for label, r in reach.items() if not r["reached"]]
    parts = []
    if reached:
        parts.append("reached by " + listing([
            f"**{label}** at step {reach[label]['step']} ({reach[label]['train_s']:.2f} s of training)"
            for label in reached]))
    if missed:
        parts.append(f"not reached in {steps} steps by " + listing([
            f"**{label}** (best {reach[label]['best']:.1%})" if reach[label]["best"] is not None else f"**{label}**"
            for label in missed]))
    return f"The target of {target:.0%} validation accuracy was " + "; ".join(parts) + "."
