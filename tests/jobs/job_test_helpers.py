"""Helpers for the job tests: specs for the test worker, synthetic run directories, leftover checks."""

import json
import time
from pathlib import Path

import psutil

from workbench.core.rundir import events_path, make_event
from workbench.jobs import LaunchSpec
from workbench.jobs.process import run_processes

WORKER_DIR = Path(__file__).resolve().parent / "worker_module"
WORKER = "wb_jobs_worker"


def worker_spec(run_root, *, nproc=2, name="t", max_restarts=0, stall_after_s=30.0, **worker) -> LaunchSpec:
    return LaunchSpec(config={"worker": {"heartbeat_s": 0.3, **worker}}, nproc_per_node=nproc, entry=WORKER,
                      env={"PYTHONPATH": str(WORKER_DIR)}, run_root=str(run_root), name=name,
                      max_restarts=max_restarts, stall_after_s=stall_after_s)


def wait_for(predicate, timeout=30.0, poll=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def assert_no_processes(run_id: str, timeout: float = 10.0) -> None:
    """No process of the run is left (zombies of our own children do not count)."""
    def gone():
        alive = []
        for proc in run_processes(run_id):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        return not alive
    wait_for(gone, timeout, what=f"processes of {run_id} to exit")


def write_synthetic_run(run_root: Path, run_id="synthetic-run", *, ranks=2, steps=5, backend="local",
                        agent_pid=None, with_end=True, t0=None) -> Path:
    """A run directory as a finished or running job would leave it, written by hand."""
    run_dir = Path(run_root) / run_id
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "logs" / "node0").mkdir(parents=True)
    pid = agent_pid if agent_pid is not None else 999_999_0
    launch = {"backend": backend, "run_id": run_id, "host": "test", "start_time": time.time(),
              "agents": [{"node": 0, "pid": pid, "create_time": None}], "launcher_pid": pid,
              "launcher_create_time": None}
    (run_dir / "launch.json").write_text(json.dumps(launch))
    (run_dir / "spec.json").write_text(json.dumps({"name": "synthetic", "stall_after_s": 30.0}))
    t0 = time.time() - 10 if t0 is None else t0
    console = []
    for rank in range(ranks):
        lines = [make_event("start", rank, t=t0, world_size=ranks, strategy=f"dp{ranks}", config={}, pid=1, host="h",
                            restart=0)]
        for step in range(steps):
            t = t0 + 0.1 * (step + 1)
            lines.append(make_event("step", rank, t=t, step=step, loss=1.0 / (step + 1), samples_per_s=100.0 + rank,
                                    step_ms=10.0, memory_bytes=0))
            for op, start, end in (("F", 0.0, 2.0), ("B", 2.0, 6.0), ("AR", 6.0, 8.0)):
                lines.append(make_event("stage", rank, t=t, stage=0, op=op, microbatch=None if op == "AR" else 0,
                                        iteration=step, start=start + rank, end=end + rank, t0=t))
            console.append(f"[rank{rank}]:step {step} on rank {rank}")
        if with_end:
            lines.append(make_event("end", rank, t=t0 + 1, step=steps - 1, status="SUCCEEDED"))
        events_path(run_dir, rank).write_text("".join(json.dumps(e) + "\n" for e in lines))
    (run_dir / "logs" / "node0" / "console.log").write_text("\n".join(console) + "\n")
    return run_dir

