"""launch_sweep: several real runs in one torchrun, one job each, from success through failure to not run."""

import json

import psutil
import pytest

from job_test_helpers import assert_no_processes
from workbench.core.rundir import events_path, parse_event_line
from workbench.jobs import LaunchSpec, attach, launch_sweep, reap
from workbench.jobs.process import run_processes

BASE = {"model": "mlp", "data": {"kind": "digits"}, "plan": "dp2", "events": {"tensorboard": False},
        "training": {"global_batch": 16, "steps": 4, "checkpoint_every": 0, "optimizer": {"name": "sgd", "lr": 0.1}}}


def event_time(run_dir, rank, kind):
    lines = events_path(run_dir, rank).read_text().splitlines()
    return next(e["t"] for e in map(parse_event_line, lines) if e["kind"] == kind)


def spec(tmp_path, name, **changes):
    return LaunchSpec(config={**BASE, **changes}, run_root=str(tmp_path), name=name)


@pytest.mark.multiproc
def test_a_sweep_trains_its_runs_in_order_and_a_failure_stops_the_rest(tmp_path):
    jobs = launch_sweep([spec(tmp_path, "first"), spec(tmp_path, "second", plan="pp2-1f1b-m2"),
                         spec(tmp_path, "failing", faults={"step": 2, "rank": 1}),
                         spec(tmp_path, "after")])
    assert len({job.run_dir for job in jobs}) == 4
    host = jobs[0].launch_info
    assert all(job.launch_info["agents"] == host["agents"] for job in jobs)  # one set of processes
    assert [job.launch_info["sweep"]["index"] for job in jobs] == [0, 1, 2, 3]
    assert all(job.launch_info["process_run_id"] == jobs[0].run_id for job in jobs)
    assert jobs[0].commands[0].count("--config") == 4
    states = [job.wait(timeout=300) for job in jobs]
    assert [s.state for s in states[:2]] == ["SUCCEEDED", "SUCCEEDED"], [s.text() for s in states]
    for job, plan in zip(jobs[:2], ("dp2", "pp2-1f1b-m2")):
        frame = job.metrics()  # each run's own events: its own steps, both ranks
        assert sorted(frame["rank"].unique()) == [0, 1] and frame.groupby("rank")["step"].max().tolist() == [4, 4]
        assert json.loads((job.run_dir / "config.json").read_text())["plan"] == plan
    # in order: the second run's ranks start after every rank of the first has ended
    first_end = max(event_time(jobs[0].run_dir, rank, "end") for rank in (0, 1))
    assert first_end <= min(event_time(jobs[1].run_dir, rank, "start") for rank in (0, 1))
    assert states[2].state == "FAILED" and states[2].root_cause is not None
    assert "fault" in states[2].reason.lower() or "injected" in states[2].reason.lower(), states[2].reason
    assert states[3].state == "FAILED" and "not run" in states[3].reason, states[3].reason
    assert jobs[3].metrics().empty
    # every run reads the shared console log, and a second process sees the same states
    assert jobs[1].logs(tail=None) and jobs[1].logs(tail=None) == jobs[0].logs(tail=None)
    assert [attach(job.run_dir).status().state for job in jobs] == ["SUCCEEDED", "SUCCEEDED", "FAILED", "FAILED"]
    assert_no_processes(jobs[0].run_id)


@pytest.mark.multiproc
def test_the_last_run_of_a_sweep_ends_when_its_processes_have_exited(tmp_path):
    jobs = launch_sweep([spec(tmp_path, "one"), spec(tmp_path, "two")])
    assert [job.wait(timeout=300).state for job in jobs] == ["SUCCEEDED", "SUCCEEDED"]
    assert jobs[1].status().exit_codes == {"node0": 0}  # from the exited processes, not only the events
    alive = [p for p in run_processes(jobs[0].run_id) if p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [] and reap(tmp_path) == []


@pytest.mark.multiproc
def test_cancelling_one_run_of_a_sweep_cancels_the_runs_that_share_its_processes(tmp_path):
    long = {"training": {**BASE["training"], "steps": 100000}}
    jobs = launch_sweep([spec(tmp_path, "long", **long), spec(tmp_path, "next")])
    assert jobs[1].status().state == "PENDING"
    assert "the runs before it" in jobs[1].status().reason
    while jobs[0].status().step is None or jobs[0].status().step < 1:
        jobs[0].wait(timeout=0.5)
    status = jobs[0].cancel(grace_s=3.0)
    assert status.state == "CANCELLED"
    after = jobs[1].wait(timeout=60)
    assert after.state == "CANCELLED" and jobs[0].run_id in after.reason
    assert_no_processes(jobs[0].run_id)


@pytest.mark.parametrize(("changes", "words"), [
    ({"plan": "dp4"}, ["LaunchSpec.nproc_per_node", "run 1"]),
    ({"run": {"device": "cpu"}}, ["run.device", "launch them apart"]),
    ({"training": {**BASE["training"], "resume": True, "checkpoint_every": 2}}, ["training.resume", "sweep"]),
])
def test_runs_that_cannot_share_processes_are_refused_before_anything_starts(tmp_path, changes, words):
    with pytest.raises(ValueError) as error:
        launch_sweep([spec(tmp_path, "a"), spec(tmp_path, "b", **changes)], check_entry=False)
    assert all(word in str(error.value) for word in words), str(error.value)
    assert not any(tmp_path.iterdir())  # no run directory was made


def test_a_sweep_refuses_restarts_and_other_backends(tmp_path):
    with pytest.raises(ValueError, match="max_restarts"):
        launch_sweep([spec(tmp_path, "a"), spec(tmp_path, "b").replace(max_restarts=1)], check_entry=False)
    with pytest.raises(ValueError, match="'local' backend"):
        launch_sweep([spec(tmp_path, "a")], backend="slurm")
    with pytest.raises(ValueError, match="non-empty list"):
        launch_sweep([])


@pytest.mark.slow
def test_the_runs_of_a_sweep_are_checked_against_their_models_in_one_process(tmp_path):
    bad = {"name": "resnet18", "overrides": {"image_size": 32, "no_such_field": 1}}
    with pytest.raises(ValueError) as error:
        launch_sweep([spec(tmp_path, "a", model={"name": "resnet18", "overrides": {"image_size": 32}}),
                      spec(tmp_path, "b"), spec(tmp_path, "c", model=bad)])
    assert str(error.value).startswith("run 2 of the sweep: "), str(error.value)
    assert "no_such_field" in str(error.value)
    assert not any(tmp_path.iterdir())
