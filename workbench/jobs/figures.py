"""A job's static summary figure, and the plain data of its run state that the figures draw.

The figure itself is built by :mod:`workbench.viz.job_figures` (plotly,
imported only when a figure is asked for); here the run state becomes plain
numpy columns and dicts, and the prediction, or why there is none, is added.
"""

from __future__ import annotations

from typing import Any

from .monitor_model import RunState

__all__ = ["state_figure_data", "summary_figure"]


def state_figure_data(state: RunState) -> dict[str, Any]:
    """Plain numpy/dict data of a run state for the figure functions."""
    return {
        "metrics": {rank: {name: cols.column(name).copy() for name in ("t", "step", "loss", "samples_per_s",
                                                                         "restart")}
                    for rank, cols in sorted(state.metrics.items())},
        "rows": state.summary_rows(),
        "checkpoints": list(state.checkpoints),
        "evals": state.eval_series() if len(state.evals) else {},
        "targets": {"accuracy": state.targets.target_accuracy, "perplexity": state.targets.target_perplexity},
        "time_to_target": state.time_to_target(),
    }


def summary_figure(job, simulated=None):
    """A static plotly figure of ``job``'s run so far: curves, the measured iteration and its prediction.

    Without ``simulated`` the prediction is ``job.predicted_timeline``; when
    there is none, the timeline's title says why (``job.prediction_note``).
    """
    from ..viz.job_figures import job_summary_figure

    with job._lock:
        state = job.refresh()
        measured = state.timeline()
    note = ""
    if simulated is None:
        simulated = job.predicted_timeline(measured)
        note = job.prediction_note
    return job_summary_figure(state_figure_data(state), measured=measured, simulated=simulated,
                              title=f"{job.run_id}: {job.status().state}", note=note)
