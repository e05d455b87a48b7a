"""A job without a prediction says why: on the job, in its summary figure and in the monitor's timeline.

Hand-written run directories (no torchrun): the measured iteration of each
is one stage per rank, so a two-stage pipeline plan cannot be predicted from
it, and the simulator's reason reaches the user instead of a silent None.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job_test_helpers import write_synthetic_run  # noqa: E402

from workbench.jobs import attach  # noqa: E402
from workbench.jobs.prediction import predict_run  # noqa: E402


def _run(tmp_path, plan, ranks=2):
    run_dir = write_synthetic_run(tmp_path, run_id=f"run-{plan}", ranks=ranks)
    if plan is not None:
        (run_dir / "config.json").write_text(json.dumps({"model": "mlp", "plan": plan,
                                                         "training": {"global_batch": 8, "steps": 5}}))
    return attach(run_dir)


def _timeline_title(figure) -> str:
    return next(a.text for a in figure.layout.annotations if a.text.startswith("timeline"))


def test_a_run_the_simulator_cannot_predict_keeps_the_reason_and_shows_it(tmp_path):
    job = _run(tmp_path, "pp2-1f1b-m2")  # only stage 0 was measured
    assert job.predicted_timeline() is None
    assert "cannot predict plan 'pp2-1f1b-m2'" in job.prediction_note
    assert "no forward/backward events for stages [1]" in job.prediction_note
    assert _timeline_title(job.summary_figure()) == f"timeline (ms) (no prediction: {job.prediction_note})"


def test_a_prediction_clears_the_reason(tmp_path):
    job = _run(tmp_path, "pp1-1f1b-m1", ranks=1)  # one stage: its measured iteration is all there is to know
    job.prediction_note = "an earlier reason"
    predicted = job.predicted_timeline()
    assert predicted is not None and len(predicted) and job.prediction_note == ""
    assert _timeline_title(job.summary_figure()) == "timeline (ms)"


@pytest.mark.parametrize("plan, words", [("dp2", "plan 'dp2' has no pipeline schedule to simulate"),
                                         (None, "no run config to predict from: config.json could not be read")])
def test_nothing_to_predict_says_why(tmp_path, plan, words):
    job = _run(tmp_path, plan)
    assert job.predicted_timeline() is None and words in job.prediction_note


def test_no_measured_iteration_yet(tmp_path):
    job = _run(tmp_path, "pp2-1f1b-m2")
    prediction = predict_run(job.run_dir, measure=lambda: None)
    assert prediction.timeline is None and prediction.note == "no full iteration has been measured yet"


def test_a_preset_smaller_than_the_run_is_the_callers_error(tmp_path):
    job = _run(tmp_path, "pp2-1f1b-m2")
    with pytest.raises(ValueError, match="has 1 devices but the run uses 2"):
        job.predicted_timeline(cluster="1xH100")


def test_the_monitor_timeline_names_the_reason(tmp_path):
    pytest.importorskip("ipywidgets")
    from workbench.widgets.job_monitor import JobMonitor

    job = _run(tmp_path, "pp2-1f1b-m2")
    monitor = JobMonitor(job, mode="widget", start=False)
    monitor.update()
    title = monitor.timeline_fig.layout.title.text
    assert title.startswith("timeline: measured iteration") and "(no prediction: the simulator cannot" in title
