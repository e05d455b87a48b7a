"""Time to accuracy: the evaluation checks 04 and 05 share, the accuracy figure and the reach sentence."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from workbench.lessons.targets import accuracy_figure, check_evaluations, eval_steps, reach_text


def _job(last_step: int):
    return SimpleNamespace(status=lambda: SimpleNamespace(last_eval={"step": last_step}))


def _run(steps=(4, 8, 10), accuracy=(0.5, 0.8, 0.9), train_s=(1.0, 2.0, 2.5)):
    frame = pd.DataFrame({"step": pd.array(steps, dtype="Int64"), "accuracy": accuracy, "train_s": train_s})
    best = max(accuracy)
    reached = best >= 0.75
    step = next((s for s, a in zip(steps, accuracy) if a >= 0.75), None)
    return frame, {"metric": "accuracy", "target": 0.75, "reached": reached, "best": best, "step": step}


def _check(frame, reach, last_step=10, **changes):
    kwargs = {"steps": 10, "every": 4, "target": 0.75, **changes}
    check_evaluations({"run": _job(last_step)}, {"run": frame}, {"run": reach}, **kwargs)


def test_evaluations_are_every_few_steps_and_after_the_last():
    assert eval_steps(10, 4) == [4, 8, 10]
    assert eval_steps(12, 4) == [4, 8, 12]
    assert eval_steps(3, 5) == [3]


def test_evaluations_on_schedule_pass_the_check():
    _check(*_run())
    _check(*_run(accuracy=(0.1, 0.2, 0.3)))  # never reached: no step, the best of them


@pytest.mark.parametrize(("what", "run", "changes"), [
    ("off schedule", _run(steps=(5, 8, 10)), {}),
    ("accuracy above 1", _run(accuracy=(0.5, 1.2, 0.9)), {}),
    ("seconds going back", _run(train_s=(1.0, 3.0, 2.5)), {}),
    ("last evaluation not at the last step", _run(), {"last_step": 8}),
    ("another target", _run(), {"target": 0.8}),
])
def test_each_broken_promise_fails_the_check(what, run, changes):
    frame, reach = run
    with pytest.raises(AssertionError):
        _check(frame, reach, **changes)


def test_a_reach_record_that_contradicts_its_evaluations_fails_the_check():
    frame, reach = _run()
    for wrong in ({"step": None}, {"best": 0.8}, {"metric": "perplexity"}):
        with pytest.raises(AssertionError):
            _check(frame, {**reach, **wrong})


def test_the_accuracy_figure_has_a_line_per_run_and_the_target():
    frame, _ = _run()
    fig = accuracy_figure({"sync": frame, "async": frame}, 0.75, 4)
    assert [t.name for t in fig.data] == ["sync", "async"]
    assert list(fig.data[0].x) == [1.0, 2.0, 2.5] and list(fig.data[0].y) == [0.5, 0.8, 0.9]
    assert "every 4 steps" in fig.layout.title.text and tuple(fig.layout.yaxis.range) == (0, 1)
    assert fig.layout.shapes[0].y0 == 0.75 and fig.layout.annotations[0].text == "target 75%"


def test_the_reach_sentence_lists_who_reached_the_target_and_the_best_of_the_others():
    reach = {"sync": {"reached": True, "step": 20, "train_s": 3.456, "best": 0.9},
             "async": {"reached": True, "step": 30, "train_s": 4.0, "best": 0.88},
             "no stash": {"reached": False, "step": None, "train_s": None, "best": 0.123},
             "none": {"reached": False, "step": None, "train_s": None, "best": None}}
    assert reach_text(reach, 0.85, 150) == (
        "The target of 85% validation accuracy was reached by **sync** at step 20 (3.46 s of training) and "
        "**async** at step 30 (4.00 s of training); not reached in 150 steps by **no stash** (best 12.3%) and "
        "**none**.")
    assert reach_text({"a": reach["none"]}, 0.5, 10) == (
        "The target of 50% validation accuracy was not reached in 10 steps by **a**.")
