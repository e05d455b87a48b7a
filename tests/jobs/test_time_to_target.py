"""Evaluation events in the monitor model, the job status and the summary: the eval series and time to target."""

import json

import numpy as np
import pytest

from job_test_helpers import write_synthetic_run
from workbench.core.rundir import events_path, make_event
from workbench.jobs import attach
from workbench.jobs.monitor_model import RunState
from workbench.jobs.status import JobStatus


def _start(**config):
    return make_event("start", 0, t=100.0, world_size=1, config={"evaluation": {"every": 2, **config}})


def _eval(step, t, **fields):
    return make_event("eval", 0, t=t, step=step, val_loss=fields.pop("val_loss", 1.0 / step), eval_s=0.1,
                      train_s=step * 0.5, wall_s=step * 0.5 + 1.0, samples=64, **fields)


def test_first_eval_at_or_past_the_accuracy_target_gives_training_and_wall_seconds():
    state = RunState()
    state.apply([_start(target_accuracy=0.7), _eval(2, 101, accuracy=0.5), _eval(4, 102, accuracy=0.72),
                 _eval(6, 103, accuracy=0.69), _eval(8, 104, accuracy=0.9)])
    assert state.time_to_target() == {"metric": "accuracy", "target": 0.7, "reached": True, "best": 0.9,
                                      "step": 4, "train_s": 2.0, "wall_s": 3.0}
    series = state.eval_series()
    assert series["step"].tolist() == [2, 4, 6, 8] and np.isnan(series["perplexity"]).all()
    assert state.last_eval()["step"] == 8 and state.last_eval()["accuracy"] == 0.9
    assert state.last_eval()["perplexity"] is None


def test_perplexity_target_is_reached_from_above_and_may_not_be_reached():
    state = RunState()
    state.apply([_start(target_perplexity=20.0), _eval(2, 101, perplexity=60.0), _eval(4, 102, perplexity=25.0)])
    target = state.time_to_target()
    assert target["metric"] == "perplexity" and not target["reached"] and target["best"] == 25.0
    assert target["step"] is target["train_s"] is target["wall_s"] is None
    state.apply([_eval(6, 103, perplexity=19.5)])
    assert state.time_to_target()["reached"] and state.time_to_target()["train_s"] == 3.0


def test_no_target_and_no_evals():
    state = RunState()
    assert state.time_to_target() is None and state.last_eval() is None
    state.apply([_start(), _eval(2, 101, accuracy=0.5)])
    assert state.time_to_target() is None and state.last_eval()["val_loss"] == 0.5
    state.apply([_start(target_accuracy=0.6)])  # a target, no evaluation reaching it yet
    assert state.time_to_target()["reached"] is False


def test_status_reports_time_to_target_in_json_text_and_summary(tmp_path):
    run_dir = write_synthetic_run(tmp_path, ranks=1, steps=4)
    lines = [_start(target_accuracy=0.6), _eval(2, 101, accuracy=0.4), _eval(4, 102, accuracy=0.65)]
    text = events_path(run_dir, 0).read_text().splitlines()
    # the start event with a target first, then the run's own lines, then the evaluations
    events_path(run_dir, 0).write_text("\n".join([json.dumps(lines[0]), *text[1:], *map(json.dumps, lines[1:])]) + "\n")
    job = attach(run_dir)
    status = job.status()
    assert status.time_to_target["reached"] and status.time_to_target["step"] == 4
    assert status.time_to_target["train_s"] == 2.0 and status.time_to_target["wall_s"] == 3.0
    assert status.last_eval["accuracy"] == 0.65
    data = json.loads(json.dumps(status.to_dict()))
    assert JobStatus.from_dict(data).time_to_target == status.time_to_target
    assert "target accuracy >= 0.6: reached at step 4 after 2 s of training, 3 s wall" in status.text()
    assert "eval at step 4: val_loss 0.25, accuracy 0.65" in status.text()
    again = attach(run_dir).status()  # from status.json, written when the run was seen finished
    assert again.time_to_target == status.time_to_target
    names = {t.name for t in job.summary_figure().data}
    assert {"val accuracy", "val loss", "target accuracy"} <= names
    assert job.evals()["step"].tolist() == [2, 4]


def test_not_reached_is_said_with_the_best_value():
    status = JobStatus(state="RUNNING", time_to_target={"metric": "perplexity", "target": 20.0, "reached": False,
                                                        "best": 25.5, "step": None, "train_s": None, "wall_s": None})
    assert "target perplexity <= 20: not reached (best 25.5)" in status.text()
    assert "target" not in JobStatus(state="RUNNING").text()
