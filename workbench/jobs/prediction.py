"""What the simulator predicts for a run, with the stage times the run measured.

The run's own ``config.json`` gives the schedule, its measured iteration
the compute of each stage (see :mod:`workbench.scheduling.from_config`).
When there is nothing to predict, or the simulator cannot predict this run,
the answer says why: the job keeps that reason (``Job.prediction_note``)
and its figures show it where the prediction would be.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.rundir import CONFIG_FILE, events_path, parse_event_line
from ..core.timeline import Timeline

__all__ = ["Prediction", "predict_run"]


@dataclass(frozen=True)
class Prediction:
    """The predicted timeline of one measured iteration, or ``None`` and why there is none."""

    timeline: Timeline | None
    note: str = ""  # why there is no timeline ("" when there is one)


def predict_run(run_dir: str | Path, measured: Timeline | None = None, *,
                measure: Callable[[], Timeline | None] | None = None,
                cluster: str | None = "local-cpu") -> Prediction:
    """Simulate the run's schedule with its measured stage times.

    ``measured`` is the measured iteration; without it ``measure()`` is asked
    for one, only once the run is known to be a scheduled pipeline. Sends and
    gradient all-reduces are timed on the links of the ``cluster`` preset
    (None: free communication); a preset smaller than the run, or an unknown
    one, is a ValueError for the caller. No config, a plan without a
    scheduled pipeline, no measured iteration, or a run the simulator cannot
    predict give no timeline and a note saying which.
    """
    from ..core.config import RunConfig
    from ..planning.costs.clusters import core_sharing, get_cluster
    from ..scheduling.from_config import predict_from_measured

    try:
        config = RunConfig.from_dict(json.loads((Path(run_dir) / CONFIG_FILE).read_text()))
    except (OSError, ValueError) as exc:
        return Prediction(None, f"no run config to predict from: {CONFIG_FILE} could not be read ({exc})")
    if not config.plan.is_scheduled:
        return Prediction(None, f"plan {config.plan.name!r} has no pipeline schedule to simulate")
    if measured is None and measure is not None:
        measured = measure()
    if measured is None or not len(measured):
        return Prediction(None, "no full iteration has been measured yet")
    spec = get_cluster(cluster) if cluster is not None else None
    if spec is not None and spec.world_size < config.world_size:
        raise ValueError(f"cluster preset {cluster!r} has {spec.world_size} devices but the run uses "
                         f"{config.world_size}; pass a larger preset or cluster=None")
    try:
        result = predict_from_measured(config, measured, cluster=spec, sharing=core_sharing(spec),
                                       schedule_costs=_schedule_costs(run_dir))
    except ValueError as exc:
        return Prediction(None, f"the simulator cannot predict plan {config.plan.name!r} from the measured "
                                f"iteration: {exc}")
    return Prediction(result.timeline)


def _schedule_costs(run_dir: str | Path):
    """The stage costs the run built its schedule from (``zb-auto``: rank 0 profiles them at the start and its
    start event records them), or None."""
    from ..scheduling.stagecosts import StageCosts

    try:
        with open(events_path(run_dir, 0)) as fh:
            for line in fh:
                event = parse_event_line(line)
                if event.get("kind") == "start":
                    costs = event.get("stage_costs")
                    return StageCosts(**costs) if costs else None
    except (OSError, ValueError, TypeError):
        return None
    return None
