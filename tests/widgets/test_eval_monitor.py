"""The monitor's validation chart: there for runs that evaluate, filled live, with the target line."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from job_test_helpers import write_synthetic_run  # noqa: E402

from workbench.core.rundir import events_path, make_event  # noqa: E402
from workbench.jobs import attach  # noqa: E402
from workbench.widgets.job_monitor import JobMonitor  # noqa: E402


def _append(run_dir, *events):
    with open(events_path(run_dir, 0), "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def test_runs_without_evaluation_have_no_validation_chart(tmp_path):
    monitor = JobMonitor(attach(write_synthetic_run(tmp_path, steps=3)), mode="widget", start=False)
    monitor.update()
    assert monitor.eval_fig is None
    assert "wb-monitor-eval" not in str(monitor.widget.children)


def test_validation_chart_gains_points_live_and_draws_the_target(tmp_path):
    run_dir = write_synthetic_run(tmp_path, steps=3, with_end=False)
    (run_dir / "config.json").write_text(json.dumps({"evaluation": {"every": 2, "target_accuracy": 0.7}}))
    monitor = JobMonitor(attach(run_dir), mode="widget", start=False)
    assert monitor.eval_fig is not None and "wb-monitor-eval" in monitor.eval_fig._dom_classes
    assert [len(t.x) for t in monitor.eval_fig.data] == [0, 0, 2]  # all three traces; the target from the start
    monitor.update()
    _append(run_dir, make_event("eval", 0, step=2, val_loss=1.2, accuracy=0.5, perplexity=None, train_s=1.0,
                                wall_s=1.5, eval_s=0.1, samples=64))
    monitor.update()
    metric, loss, target = monitor.eval_fig.data
    assert list(metric.x) == [1.5] and list(metric.y) == [0.5] and list(loss.y) == [1.2]
    assert list(target.y) == [0.7, 0.7] and target.name == "target accuracy"
    _append(run_dir, make_event("eval", 0, step=4, val_loss=0.8, accuracy=0.75, perplexity=None, train_s=2.0,
                                wall_s=3.0, eval_s=0.1, samples=64))
    monitor.update()
    assert list(monitor.eval_fig.data[0].y) == pytest.approx([0.5, 0.75])
    assert list(monitor.eval_fig.data[2].x) == [0.0, 3.0]  # the target spans the curve


def test_language_model_chart_shows_perplexity(tmp_path):
    run_dir = write_synthetic_run(tmp_path, steps=2, with_end=False)
    (run_dir / "config.json").write_text(json.dumps({"evaluation": {"every": 1}}))
    monitor = JobMonitor(attach(run_dir), mode="widget", start=False)
    _append(run_dir, make_event("eval", 0, step=1, val_loss=3.0, accuracy=0.2, perplexity=20.1, train_s=1.0,
                                wall_s=1.0, eval_s=0.1, samples=8))
    monitor.update()
    assert monitor.eval_fig.data[0].name == "val perplexity" and list(monitor.eval_fig.data[0].y) == [20.1]
    assert monitor.eval_fig.layout.yaxis.title.text == "perplexity" and len(monitor.eval_fig.data[2].x) == 0
