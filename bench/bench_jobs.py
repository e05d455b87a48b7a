"""Job launching and monitoring costs: launch-to-first-metric, metric-to-widget, monitor CPU.

1. Launch to first metric: ``workbench.jobs.launch`` (guard + torchrun +
   workers) until ``Job.status()`` shows a step, against the peer: the same
   torchrun command started bare with ``subprocess`` until the first step
   line is in the events file. Paired, interleaved launches; medians.
2. Metric to widget: a step line appended to a rank's events file until the
   live ``JobMonitor`` (default 3 Hz refresh thread) has it in its loss trace,
   against the peer: a bare ``EventTailer`` polled every 5 ms (the file-system
   floor). Target: under 1 s.
3. Monitor CPU: CPU seconds the monitor's refresh thread uses per wall second
   while a real 2-rank job runs, against the CPU the job's processes use.

Run: ``.venv/bin/python bench/bench_jobs.py [--repeats 3]``; writes bench/results/jobs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
WORKER_DIR = ROOT / "tests" / "jobs" / "worker_module"
sys.path.insert(0, str(ROOT))

from workbench.core.rundir import events_path, make_event  # noqa: E402
from workbench.jobs import LaunchSpec, attach, launch  # noqa: E402
from workbench.jobs.backends.local import node_log_dir, torchrun_argv  # noqa: E402
from workbench.jobs.tailer import EventTailer  # noqa: E402
from workbench.widgets.job_monitor import JobMonitor  # noqa: E402


def worker_spec(root: Path, steps: int, step_s: float) -> LaunchSpec:
    return LaunchSpec(config={"worker": {"steps": steps, "step_s": step_s, "heartbeat_s": 0.5}}, nproc_per_node=2,
                      entry="wb_jobs_worker", env={"PYTHONPATH": str(WORKER_DIR)}, run_root=str(root), name="bench")


def first_step_seen(path: Path) -> bool:
    return path.is_file() and b'"kind": "step"' in path.read_bytes()


def launch_latency_ours(root: Path) -> float:
    began = time.perf_counter()
    job = launch(worker_spec(root, steps=3, step_s=0.0))
    while job.status().step is None:
        time.sleep(0.02)
    latency = time.perf_counter() - began
    job.wait(timeout=120)
    return latency


def launch_latency_bare(root: Path) -> float:
    spec = worker_spec(root, steps=3, step_s=0.0)
    run_dir = root / f"bare-{time.time_ns()}"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(spec.config))
    argv = torchrun_argv(spec, run_dir, run_dir.name, endpoint="localhost:0", log_dir=node_log_dir(run_dir, 0))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **spec.env}
    began = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not first_step_seen(events_path(run_dir, 0)):
        time.sleep(0.02)
    latency = time.perf_counter() - began
    proc.wait(timeout=120)
    return latency


def synthetic_running_run(root: Path) -> tuple[Path, subprocess.Popen]:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    run_dir = root / f"synthetic-{time.time_ns()}"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "launch.json").write_text(json.dumps({
        "backend": "local", "run_id": run_dir.name, "host": "bench", "start_time": time.time(),
        "agents": [{"node": 0, "pid": sleeper.pid, "create_time": psutil.Process(sleeper.pid).create_time()}]}))
    (run_dir / "spec.json").write_text(json.dumps({"stall_after_s": 30.0}))
    with open(events_path(run_dir, 0), "a") as f:
        f.write(json.dumps(make_event("start", 0, world_size=1)) + "\n")
    return run_dir, sleeper


def widget_latencies(root: Path, samples: int) -> list[float]:
    run_dir, sleeper = synthetic_running_run(root)
    monitor = JobMonitor(attach(run_dir), mode="widget", refresh_hz=3.0)
    out = []
    try:
        with open(events_path(run_dir, 0), "a", buffering=1) as f:
            for step in range(samples):
                time.sleep(0.05 + (step * 0.137) % 0.3)  # writes land at varied phases of the refresh period
                f.write(json.dumps(make_event("step", 0, step=step, loss=1.0 / (step + 1))) + "\n")
                written = time.perf_counter()
                while not (monitor.loss_fig.data
                           and getattr(monitor.loss_fig.data[0].y, "size", 0) == step + 1):
                    time.sleep(0.002)
                out.append(time.perf_counter() - written)
    finally:
        monitor.stop()
        sleeper.kill()
        sleeper.wait()
    return out


def tailer_latencies(root: Path, samples: int) -> list[float]:
    run_dir, sleeper = synthetic_running_run(root)
    sleeper.kill()
    sleeper.wait()
    tailer = EventTailer(run_dir)
    tailer.poll()
    out = []
    stop = threading.Event()
    seen: list[float] = []

    def poll() -> None:
        while not stop.is_set():
            seen.extend(time.perf_counter() for _ in tailer.poll())
            time.sleep(0.005)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    with open(events_path(run_dir, 0), "a", buffering=1) as f:
        for step in range(samples):
            time.sleep(0.05)
            f.write(json.dumps(make_event("step", 0, step=step)) + "\n")
            written = time.perf_counter()
            while len(seen) < step + 1:
                time.sleep(0.001)
            out.append(seen[step] - written)
    stop.set()
    return out


def monitor_cpu(root: Path) -> dict[str, float]:
    job = launch(worker_spec(root, steps=120, step_s=0.05))
    while job.status().step is None:
        time.sleep(0.05)
    procs = [psutil.Process(a["pid"]) for a in job.launch_info["agents"]]
    tree = procs + [c for p in procs for c in p.children(recursive=True)]
    job_cpu_before = sum(sum(p.cpu_times()[:2]) for p in tree)
    monitor = JobMonitor(job, mode="widget", refresh_hz=3.0)
    began = time.perf_counter()
    time.sleep(5.0)
    wall = time.perf_counter() - began
    monitor.stop()
    job_cpu = sum(sum(p.cpu_times()[:2]) for p in tree if p.is_running()) - job_cpu_before
    job.cancel(grace_s=3.0)
    return {"monitor_cpu_fraction_of_core": monitor.cpu_s / wall, "job_cpu_fraction_of_core": job_cpu / wall,
            "monitor_updates_per_s": monitor.updates / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ours, bare = [], []
        for _ in range(args.repeats):  # interleaved pairs: drift on a shared machine hits both alike
            ours.append(launch_latency_ours(root))
            bare.append(launch_latency_bare(root))
        widget = widget_latencies(root, args.samples)
        floor = tailer_latencies(root, args.samples)
        cpu = monitor_cpu(root)
    result = {
        "launch_to_first_metric_s": {"workbench": statistics.median(ours), "bare_torchrun": statistics.median(bare),
                                     "ratio": statistics.median(ours) / statistics.median(bare),
                                     "samples": {"workbench": ours, "bare_torchrun": bare}},
        "metric_to_widget_s": {"monitor_median": statistics.median(widget), "monitor_max": max(widget),
                               "tailer_5ms_median": statistics.median(floor),
                               "under_1s": max(widget) < 1.0, "samples": widget},
        "monitor_cpu": cpu,
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
    }
    rows = [
        ("launch -> first metric, workbench (s)", f"{result['launch_to_first_metric_s']['workbench']:.2f}"),
        ("launch -> first metric, bare torchrun (s)", f"{result['launch_to_first_metric_s']['bare_torchrun']:.2f}"),
        ("  ratio workbench / bare", f"{result['launch_to_first_metric_s']['ratio']:.2f}"),
        ("metric -> widget, median (s)", f"{result['metric_to_widget_s']['monitor_median']:.3f}"),
        ("metric -> widget, max (s)", f"{result['metric_to_widget_s']['monitor_max']:.3f}"),
        ("metric -> tailer at 5 ms polling, median (s)", f"{result['metric_to_widget_s']['tailer_5ms_median']:.4f}"),
        ("monitor thread CPU (fraction of a core)", f"{cpu['monitor_cpu_fraction_of_core']:.4f}"),
        ("job processes CPU (fraction of a core)", f"{cpu['job_cpu_fraction_of_core']:.3f}"),
        ("monitor refreshes per second", f"{cpu['monitor_updates_per_s']:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    out = ROOT / "bench" / "results" / "jobs.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
