"""A real pipeline run shows its measured timeline next to the simulator's prediction."""

import importlib.util

import pytest

from workbench.jobs import LaunchSpec, launch

pytestmark = [pytest.mark.multiproc,
              pytest.mark.skipif(importlib.util.find_spec("workbench.runtime.entry") is None,
                                 reason="needs the training entry workbench.runtime.entry")]

# wide enough that compute (milliseconds per micro-batch), not per-call overhead (a fraction of a
# millisecond that the simulator does not model), makes the iteration; the compared iteration is
# past the warm-up
CONFIG = {"name": "pred", "model": {"name": "mlp", "overrides": {"hidden": 2048}}, "plan": "pp2-1f1b-m4",
          "training": {"global_batch": 64, "steps": 6}, "data": {"kind": "synthetic"}}


def test_monitor_prediction_uses_the_runs_own_schedule_and_stage_times(tmp_path):
    job = launch(LaunchSpec(config=CONFIG, name="pred", run_root=str(tmp_path)))
    assert job.wait(timeout=180).state == "SUCCEEDED"
    measured = job.timeline()
    predicted = job.predicted_timeline(measured)
    assert predicted is not None
    assert predicted.ranks == [0, 1] and {e.source for e in predicted} == {"simulated"}
    # the same actions as the run executed: 4 forwards and 4 backwards per stage
    for rank in (0, 1):
        ops = [e.op for e in predicted.on_rank(rank) if e.op in ("F", "B")]
        assert ops.count("F") == 4 and ops.count("B") == 4
        assert sorted(e.op for e in measured.on_rank(rank) if e.op in ("F", "B")) == sorted(ops)
    # the prediction is calibrated by the measured stage times, so its makespan is of the same order
    assert 0.33 < predicted.makespan / measured.makespan < 3
    sources = {getattr(t, "name", "") for t in job.summary_figure().data}
    assert any("simulated" in s for s in sources) and any("measured" in s for s in sources)
