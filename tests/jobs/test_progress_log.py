"""Rank 0's progress lines (workbench.runtime.progress): how often, what they say, who prints them."""

import io

import pytest

from workbench.runtime.progress import LOG_EVERY_ENV, ProgressLog, log_interval


@pytest.mark.parametrize("steps, every", [(1, 1), (12, 1), (40, 2), (100, 5), (200, 10), (10_000, 10)])
def test_about_twenty_lines_a_run_and_never_fewer_than_one_every_ten_steps(steps, every):
    assert log_interval(steps, environ={}) == every


def test_the_environment_sets_the_interval_or_turns_the_lines_off():
    assert log_interval(100, environ={LOG_EVERY_ENV: "3"}) == 3
    assert log_interval(100, environ={LOG_EVERY_ENV: "0"}) == 0
    with pytest.raises(ValueError, match=LOG_EVERY_ENV):
        log_interval(100, environ={LOG_EVERY_ENV: "often"})


def test_rank_0_prints_the_first_every_kth_and_the_last_step():
    out = io.StringIO()
    log = ProgressLog(0, 12, every=5, stream=out)
    for step in range(1, 13):
        log.step(step, 2.0 / step, 250.0, 12.5)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/12", "5/12", "10/12", "12/12"]
    assert lines[0] == "step 1/12  loss 2.0000  250.0 samples/s  12.5 ms/step"


def test_other_ranks_and_a_zero_interval_print_nothing():
    out = io.StringIO()
    for log in (ProgressLog(1, 10, every=1, stream=out), ProgressLog(0, 10, every=0, stream=out)):
        for step in range(1, 11):
            log.step(step, 1.0, 1.0, 1.0)
    assert out.getvalue() == ""
    missing = io.StringIO()
    ProgressLog(0, 1, every=1, stream=missing).step(1, float("nan"), 3.0, 4.0)
    assert "loss -" in missing.getvalue()


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_a_real_run_logs_rank_0_progress_in_the_console(tmp_path):
    from workbench.core.config import RunConfig
    from workbench.jobs import LaunchSpec, launch

    config = RunConfig.from_dict({"name": "progress", "model": "mlp", "plan": "pp2-1f1b-m4",
                                  "training": {"steps": 6, "global_batch": 16}, "events": {"stage_events": False}})
    job = launch(LaunchSpec(config=config, run_root=str(tmp_path), name="progress"))
    assert job.wait(timeout=90).state == "SUCCEEDED"
    lines = [line for line in job.logs(rank=0) if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == [f"{s}/6" for s in range(1, 7)]
    assert not [line for line in job.logs(rank=1) if line.startswith("step ")]
