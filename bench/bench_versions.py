"""Two checkouts of the workbench, the same runs, interleaved: what a runtime change bought.

A change to the runtime is measured against the code before it on the same
machine in the same session: each plan is trained by checkout A, then by
checkout B, then A again (the order alternating every round), so a drifting
machine hits both sides alike. Every run is ``python -m workbench.cli run
CONFIG`` with that checkout on ``PYTHONPATH`` (each checkout's own runtime,
this venv's packages); throughput is the global batch over the median gap
between rank 0's step events after ``--warmup`` steps.

    .venv/bin/python bench/bench_versions.py --a /tmp/old-checkout [--b .] [--rounds 3] [--plans dp1,dp4]

The default case is ``vgg-tiny`` with 4096-wide fully connected layers,
global batch 64, synthetic data (``bench_microbatch_costs.py``'s case).
Writes ``bench/results/versions.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "versions.json"
PLANS = "dp1,dp4,gropipe-2x2-1f1b-m2-d0,gropipe-2x2-1f1b-m2-d1"


def _config(plan: str, steps: int) -> str:
    return (f'name = "versions-{plan}"\nplan = "{plan}"\n\n[model]\nname = "vgg-tiny"\n'
            f'overrides = {{ fc_width = 4096 }}\n\n[training]\nglobal_batch = 64\nsteps = {steps}\n')


def run_once(tree: Path, plan: str, steps: int, warmup: int, root: Path) -> float:
    """One training run of ``plan`` with the runtime of checkout ``tree``; samples/s."""
    path = root / f"{plan}.toml"
    path.write_text(_config(plan, steps))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    env.pop("WORKBENCH_WARM_RANKS", None)  # each rank starts from its own checkout's code
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(path), "--run-root", str(root)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"{plan} in {tree}: exited {proc.returncode}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    run_dir = Path(lines[-1].strip())
    times = sorted((e["step"], e["t"]) for e in map(json.loads, (run_dir / "events" / "rank0.jsonl").open())
                   if e["kind"] == "step")
    gaps = [b - a for (step, a), (_, b) in zip(times, times[1:]) if step >= warmup]
    return 64 / statistics.median(gaps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="the checkout before the change")
    parser.add_argument("--b", type=Path, default=ROOT, help="the checkout with the change (default: this one)")
    parser.add_argument("--plans", default=PLANS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=4)
    args = parser.parse_args()
    plans = args.plans.split(",")
    rates: dict[str, dict[str, list[float]]] = {p: {"a": [], "b": []} for p in plans}
    with tempfile.TemporaryDirectory(prefix="bench-versions-") as tmp:
        for r in range(args.rounds):
            for plan in plans:
                for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                    rate = run_once(getattr(args, side).resolve(), plan, args.steps, args.warmup, Path(tmp))
                    rates[plan][side].append(rate)
                    print(f"round {r} {plan:<26} {side}: {rate:7.1f} samples/s", flush=True)
    rows = []
    print(f"\n{'plan':<26} {'A':>8} {'B':>8} {'B/A':>6}")
    for plan in plans:
        a, b = (statistics.median(rates[plan][s]) for s in ("a", "b"))
        rows.append({"plan": plan, "a_samples_per_s": a, "b_samples_per_s": b, "ratio": b / a, "rounds": rates[plan]})
        print(f"{plan:<26} {a:8.1f} {b:8.1f} {b / a:6.3f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"a": str(args.a), "b": str(args.b), "date": time.strftime("%Y-%m-%d %H:%M"),
                               "rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
