"""Job.status() rebuilt from run directories alone (attach after the launcher is gone)."""

import json

from job_test_helpers import write_synthetic_run
from workbench.core.rundir import events_path, make_event
from workbench.jobs import attach


def test_dead_run_without_an_end_is_unknown_but_finished(tmp_path):
    run_dir = write_synthetic_run(tmp_path, steps=3, with_end=False)
    status = attach(run_dir).wait(timeout=5)
    assert status.state == "UNKNOWN" and status.finished and not status.is_terminal
    assert [r.state for r in status.ranks] == ["UNKNOWN", "UNKNOWN"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "UNKNOWN"


def test_dead_run_with_an_error_event_is_failed_with_root_cause(tmp_path):
    run_dir = write_synthetic_run(tmp_path, steps=3, with_end=False)
    with open(events_path(run_dir, 1), "a") as f:
        f.write(json.dumps(make_event("error", 1, message="bad shape", traceback="Traceback ...\nValueError: bad shape",
                                      exc_type="ValueError")) + "\n")
    status = attach(run_dir).status()
    assert status.state == "FAILED" and status.root_cause["rank"] == 1
    assert status.reason == "rank 1 raised ValueError: bad shape"
    assert [r.state for r in status.ranks] == ["FAILED", "FAILED"]


def test_guard_exit_code_decides_and_corrupt_lines_lose_nothing_else(tmp_path):
    run_dir = write_synthetic_run(tmp_path, steps=4)
    (run_dir / "logs" / "node0" / "exit_code").write_text("0\n")
    with open(events_path(run_dir, 0), "ab") as f:
        f.write(b"{not json\n")
        f.write((json.dumps(make_event("step", 0, step=4, loss=0.1)) + "\n").encode())
    job = attach(run_dir)
    status = job.status()
    assert status.state == "SUCCEEDED" and status.exit_codes == {"node0": 0}
    assert len(job.corrupt_lines) == 1 and job.corrupt_lines[0].path.endswith("rank0.jsonl")
    assert job.metrics().query("rank == 0")["step"].tolist() == [0, 1, 2, 3, 4]


def test_the_status_says_which_gpu_ranks_shared(tmp_path):
    """Ranks 0 and 2 on one GPU, rank 1 on its own (3 ranks round-robin on 2 GPUs), staged: one line says so."""
    from workbench.jobs.monitor_model import RunState
    from workbench.jobs.status import JobStatus, RankStatus

    state = RunState()
    state.apply([make_event("start", r, t=1.0, world_size=3, device=f"cuda:{r % 2}", backend="staged",
                            shared_by=2 if r != 1 else 1, memory_fraction=0.5 if r != 1 else 1.0) for r in range(3)])
    status = JobStatus(state="RUNNING", run_id="r", ranks=tuple(RankStatus(**row) for row in state.summary_rows(2.0)))
    line = status.devices_text()
    assert line == ("GPU shared: cuda:0 shared by 2 ranks (0, 2), each capped at 1/2 of its memory "
                    "over staged (through host memory)")
    assert line in status.text().splitlines()
    assert JobStatus.from_dict(status.to_dict()).devices_text() == line  # status.json keeps it
    own = RunState()
    own.apply([make_event("start", r, t=1.0, device="cpu", backend="gloo", shared_by=None) for r in range(2)])
    rows = tuple(RankStatus(**row) for row in own.summary_rows(2.0))
    assert JobStatus(state="RUNNING", ranks=rows).devices_text() == "devices: cpu over gloo"
    assert JobStatus(state="PENDING").devices_text() == ""
