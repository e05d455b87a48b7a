"""Measured vs simulated iteration time for each pipeline strategy on this machine.

Each strategy runs for real under torchrun (vgg-tiny, 2 stages, 4
micro-batches; GroPipe 2 groups x 2 stages). The simulator then predicts
the same iteration from the run's own schedule, its measured per-stage
compute times and the ``local-cpu`` cluster preset (gloo loopback: 4.4 GB/s
point-to-point, 1.2 GB/s all-reduce, 70 us latency; its processes share the
machine's cores, and compute and communication that overlap there slow each
other by the measured overlap slowdown), so the error measures the schedule
and communication model, not the profiler. Strategies are
interleaved over repeats; the median ratio predicted / measured is reported.
Writes ``bench/results/prediction.json`` with each run's directory (kept
under ``runs/bench-prediction``), so ``--repredict`` can predict the same
measured runs again after a change to the simulator without running them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from workbench.jobs import LaunchSpec, launch

REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
CASES = {  # plans on 2 stages, 4 micro-batches
    "gpipe": {"plan": "pp2-gpipe-m4"},
    "1f1b": {"plan": "pp2-1f1b-m4"},
    "gropipe-d0": {"plan": "gropipe-2x2-1f1b-m4-d0"},
    "gropipe-d1": {"plan": "gropipe-2x2-1f1b-m4-d1"},
}
BASE = {"name": "predict", "model": "vgg-tiny", "training": {"global_batch": 32, "steps": 6},
        "data": {"kind": "synthetic"}}


OUT = Path(__file__).resolve().parent / "results" / "prediction.json"


def repredict() -> int:
    """Predict the runs recorded in prediction.json again (measured times unchanged)."""
    from workbench.jobs import attach

    result = json.loads(OUT.read_text())
    for name, case in result["cases"].items():
        pairs = []
        for measured_ms, _, load, run_dir in case["pairs"]:
            job = attach(run_dir)
            measured = job.timeline()
            pairs.append((measured_ms, job.predicted_timeline(measured).makespan, load, run_dir))
        case["pairs"] = pairs
    result["repredicted_at"] = time.strftime("%Y-%m-%d %H:%M")
    return report(result, {name: case["pairs"] for name, case in result["cases"].items()})


def report(result: dict, rows: dict) -> int:
    print(f"\n{'strategy':<11} {'measured ms':>12} {'predicted ms':>13} {'pred/meas':>10} {'load':>6}")
    for name, pairs in rows.items():
        ratio = statistics.median(p / m for m, p, *_ in pairs)
        meas = statistics.median(m for m, *_ in pairs)
        pred = statistics.median(p for _, p, *_ in pairs)
        load = statistics.median(row[2] for row in pairs)
        result["cases"][name] = {"measured_ms": meas, "predicted_ms": pred, "ratio": ratio, "load_avg_1m": load,
                                 "pairs": pairs}
        print(f"{name:<11} {meas:12.1f} {pred:13.1f} {ratio:10.3f} {load:6.2f}")
    OUT.write_text(json.dumps(result, indent=1))
    print(f"wrote {OUT}")
    return 0


def main() -> int:
    if "--repredict" in sys.argv[1:]:
        return repredict()
    rows: dict[str, list[tuple]] = {name: [] for name in CASES}
    root = Path(__file__).resolve().parents[1] / "runs" / "bench-prediction" / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for rep in range(REPEATS):
        for name, extra in CASES.items():
            job = launch(LaunchSpec(config={**BASE, **extra, "name": name}, name=name, run_root=root))
            state = job.wait(timeout=300).state
            if state != "SUCCEEDED":
                print(f"{name}: run {rep} ended {state}", file=sys.stderr)
                return 1
            measured = job.timeline()
            predicted = job.predicted_timeline(measured)
            load = os.getloadavg()[0]
            rows[name].append((measured.makespan, predicted.makespan, load, str(job.run_dir)))
            print(f"rep {rep} {name:<11} measured {measured.makespan:7.1f} ms  predicted {predicted.makespan:7.1f} ms  "
                  f"load {load:.2f}", flush=True)
    result = {"repeats": REPEATS, "load_avg_1m": os.getloadavg()[0], "cases": {}}
    return report(result, rows)


if __name__ == "__main__":
    sys.exit(main())
