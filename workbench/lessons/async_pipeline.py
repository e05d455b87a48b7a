"""Lesson 05, the asynchronous pipeline: the weight versions a run's passes recorded, and the words and figure
that set the asynchronous pipeline against the synchronous one and naive model parallelism."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import plotly.graph_objects as go

from ..runtime.events import load_measured_timeline
from ..viz.style import apply_layout


def weight_versions(run_dir: str | Path) -> dict[tuple[int, int, int], dict[str, int | None]]:
    """Per (stage, iteration, micro-batch) of a finished run: the weight version its forward (``"F"``) and its
    backward (``"B"``) recorded, the backward's being the version its autograd graph read when it ran."""
    used: dict[tuple[int, int, int], dict[str, int | None]] = {}
    for e in load_measured_timeline(run_dir).events:
        if e.op in ("F", "B"):
            used.setdefault((e.stage, e.iteration, e.microbatch), {})[e.op] = e.version
    return used


def stash_cost_text(sync: Mapping, stashed: Mapping) -> str:
    """How many times the steps and the training seconds of the synchronous run the stashed asynchronous run
    needed to reach the target (nothing when either did not reach it)."""
    if not (sync["reached"] and stashed["reached"]):
        return ""
    return (f" The stashed asynchronous run needed {stashed['step'] / sync['step']:.1f}x the steps of the "
            f"synchronous one and {stashed['train_s'] / sync['train_s']:.1f}x its training seconds.")


def speedup_figure(speedup: Mapping[str, float], ideal: Mapping[str, float], title: str) -> go.Figure:
    """Measured throughput over naive model parallelism, next to the ideal of each way of running."""
    fig = go.Figure(
        [go.Bar(x=list(speedup), y=list(speedup.values()), name="measured",
                text=[f"{v:.2f}x" for v in speedup.values()], textposition="outside"),
         go.Bar(x=list(ideal), y=list(ideal.values()), name="ideal (no cost for smaller micro-batches)",
                opacity=0.4)])
    return apply_layout(fig, title=title, yaxis_title="x naive model parallelism", barmode="group")


def speedup_text(naive_samples_per_s: float, speedup: Mapping[str, float], ideal: Mapping[str, float]) -> str:
    """What naive model parallelism trained, how much faster 1F1B and the asynchronous pipeline were, which gained
    more, and how close each came to its ideal."""
    return (
        f"Measured on this machine: naive model parallelism trained **{naive_samples_per_s:.1f} samples/s**, 1F1B "
        f"**{speedup['1F1B']:.2f}x** that (ideal {ideal['1F1B']:.2f}x) and the asynchronous pipeline "
        f"**{speedup['async']:.2f}x** (ideal {ideal['async']:.0f}x). "
        + ("The asynchronous pipeline, which never flushes, gained the most. " if speedup["async"] >= speedup["1F1B"]
           else "1F1B gained more than the asynchronous pipeline in this run. ")
        + f"1F1B reached {speedup['1F1B'] / ideal['1F1B']:.0%} of its ideal and the asynchronous pipeline "
          f"{speedup['async'] / ideal['async']:.0%} of its own.")
