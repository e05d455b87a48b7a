"""An async pipeline that adapts its depths at run time, against the same pipeline fixed at its launch depths and
fixed at the depths the adaptation picks, on 2 CPU ranks (gloo), interleaved rounds.

``async-1x2-m4-if1`` runs one micro-batch in flight per stage (no pipelining); ``...-adapt4`` starts there and
re-decides every 4 steps from what it measured (``adapt_every``); ``async-1x2-m4-if2.1`` is the pipeline fixed at
the depths the adaptation chooses. VGG-tiny, global batch 64, 20 steps; step time = median of the steps after the
8th. Writes ``bench/results/async_adapt.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANS = ("async-1x2-m4-if1", "async-1x2-m4-if1-adapt4", "async-1x2-m4-if2.1")
ROUNDS, STEPS, WARMUP = 2, 20, 8


def run(plan: str) -> dict:
    from workbench.core.config import RunConfig

    folder = Path(tempfile.mkdtemp(prefix="bench-adapt-"))
    config = RunConfig.from_dict({"model": "vgg-tiny", "plan": plan,
                                  "training": {"global_batch": 64, "steps": STEPS, "seed": 0}})
    path = config.save_toml(folder / "config.toml")
    out = subprocess.run([str(Path(sys.executable).with_name("workbench")), "run", str(path), "--run-root",
                          str(folder)], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_dir = Path(out.stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in (run_dir / "events" / "rank0.jsonl").read_text().splitlines()]
    steps = [r["step_ms"] for r in records if r["kind"] == "step" and r["step"] > WARMUP]
    return {"step_ms": statistics.median(steps),
            "adaptations": [(r["step"], r["inflight_to"], r["mode_to"]) for r in records if r["kind"] == "adapt"]}


def main() -> None:
    rounds = []
    for i in range(ROUNDS):
        row = {plan: run(plan) for plan in PLANS}
        rounds.append(row)
        print(f"round {i}: " + ", ".join(f"{p} {r['step_ms']:.1f} ms" for p, r in row.items()), flush=True)
    for plan in PLANS:
        print(f"{plan}: " + ", ".join(f"{r[plan]['step_ms']:.1f}" for r in rounds) + " ms; adaptations "
              f"{rounds[0][plan]['adaptations']}")
    out = ROOT / "bench" / "results" / "async_adapt.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rounds": rounds, "load": os.getloadavg()[0]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
