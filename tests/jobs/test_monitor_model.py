import numpy as np
import pytest

from workbench.core.rundir import make_event
from workbench.jobs.monitor_model import MetricColumns, RunState


def test_metric_columns_grow_and_keep_missing_as_nan():
    cols = MetricColumns(capacity=2)
    for i in range(5):
        cols.append({"step": i, "loss": None if i == 2 else 1.0 / (i + 1)})
    assert len(cols) == 5
    assert cols.column("step").tolist() == [0, 1, 2, 3, 4]
    assert np.isnan(cols.column("loss")[2]) and cols.column("loss")[3] == pytest.approx(0.25)


def test_rank_states_pending_running_stalled_done():
    state = RunState(stall_after_s=5.0)
    state.apply([make_event("start", 0, t=100.0, world_size=3), make_event("start", 1, t=100.0),
                 make_event("heartbeat", 1, t=110.0, step=4), make_event("end", 2, t=111.0, status="SUCCEEDED")])
    state.rank(3)
    assert state.rank_states(now=112.0) == {0: "STALLED", 1: "RUNNING", 2: "SUCCEEDED", 3: "PENDING"}
    rows = {r["rank"]: r for r in state.summary_rows(now=112.0)}
    assert rows[0]["heartbeat_age_s"] == pytest.approx(12.0) and rows[1]["step"] == 4


def test_restart_resets_rank_and_root_cause_is_first_error_of_latest_attempt():
    state = RunState()
    state.apply([make_event("start", 0, t=1.0, restart=0), make_event("start", 1, t=1.0, restart=0),
                 make_event("step", 0, t=2.0, step=0, loss=1.0),
                 make_event("error", 1, t=3.0, message="boom", traceback="tb1", exc_type="RuntimeError"),
                 make_event("error", 0, t=3.5, message="peer gone", traceback="tb0", exc_type="RuntimeError")])
    assert state.rank_states(now=4.0) == {0: "FAILED", 1: "FAILED"}
    assert state.root_cause()["rank"] == 1
    state.apply([make_event("start", 0, t=5.0, restart=1), make_event("start", 1, t=5.0, restart=1),
                 make_event("step", 0, t=6.0, step=1, loss=0.5)])
    assert state.restarts == 1
    assert state.rank_states(now=6.5) == {0: "RUNNING", 1: "RUNNING"}
    assert state.metrics[0].column("restart").tolist() == [0, 1]
    assert state.final_loss() == 0.5


def test_unknown_kinds_are_skipped_and_version_counts_changes():
    state = RunState()
    assert state.apply([{"kind": "future-kind", "rank": 0, "v": 1}]) == 0
    before = state.version
    state.apply([make_event("heartbeat", 0, step=1)])
    assert state.version == before + 1


def test_an_iteration_is_complete_only_once_every_rank_of_the_run_reported_it():
    state = RunState()
    state.apply([make_event("start", rank, t=1.0, world_size=2) for rank in (0, 1)])
    for it in (0, 1):  # rank 0's events are read first, as a tailer may read one rank's file before another's
        state.apply([make_event("stage", 0, stage=0, op="F", microbatch=0, iteration=it, start=0.0, end=1.0, t0=1.0)])
    assert state.measured_iterations() == [] and len(state.timeline()) == 0
    state.apply([make_event("stage", 1, stage=1, op="F", microbatch=0, iteration=0, start=1.0, end=2.0, t0=1.0)])
    assert state.measured_iterations() == [0]
    assert sorted(e.rank for e in state.timeline()) == [0, 1]


def test_timeline_of_latest_complete_iteration_starts_at_zero_and_bounds_memory():
    state = RunState()
    for it in range(10):
        for rank in (0, 1):
            t0 = 1000.0 + it
            state.apply([make_event("stage", rank, stage=rank, op="F", microbatch=0, iteration=it,
                                    start=5.0 * rank, end=5.0 * rank + 3.0, t0=t0)])
    assert state.measured_iterations() == [6, 7, 8, 9]
    timeline = state.timeline()
    assert timeline.meta["iteration"] == 8 and timeline.start == 0.0
    assert [(e.rank, e.start, e.end, e.source) for e in timeline] == [(0, 0.0, 3.0, "measured"),
                                                                       (1, 5.0, 8.0, "measured")]
    assert len(state.timeline(iteration=9)) == 2
