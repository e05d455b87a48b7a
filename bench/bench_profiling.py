"""How faithful and how costly is per-layer profiling?

For each model the benchmark measures a whole training step (forward, loss,
backward; device-synchronised; median of ``--repeats``) before and after
profiling it layer by layer, and reports

* ratio = sum over layers of (forward + backward) median / whole-step median
  (the per-layer view should add up to the real step: target within 15%),
  and the same ratio of minima (less sensitive to other processes sharing
  the machine),
* the profile's wall time and the whole step's time, both measured in this run.

Cases: ResNet-18 and a tiny BERT (the accuracy check), ResNet-50 and BERT-base
at batch 8 (the cost of profiling a real model). The machine's load average
is recorded with the results: on a shared machine it explains the noise. Run:

    .venv/bin/python bench/bench_profiling.py [--quick]

Prints a table and writes bench/results/profiling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from workbench.models import build_model, sample_batch
from workbench.profiling import measure_step_ms, profile

# (model, batch size, config overrides, repeats); the big models get fewer repeats to keep the run short
# on a shared 2-core machine (BERT-base at sequence length 64: about 120 GFLOP per training step).
CASES = [
    ("resnet18", 8, {}, 3),
    ("bert-tiny", 32, {}, 3),
    ("resnet50", 8, {}, 2),
    ("bert-base", 8, {"seq_len": 64}, 2),
]
QUICK = [("resnet18", 4, {"image_size": 112}, 2), ("bert-tiny", 16, {}, 2)]


def run_case(name: str, batch_size: int, overrides: dict, repeats: int) -> dict:
    seq = build_model(name, **overrides)
    batch = sample_batch(seq, batch_size)
    before = measure_step_ms(seq, batch, warmup=1, repeats=repeats)
    started = time.perf_counter()
    costs = profile(seq, batch, warmup=1, repeats=repeats, cache=False, progress=False)
    profile_s = time.perf_counter() - started
    after = measure_step_ms(seq, batch, warmup=1, repeats=repeats)
    step_ms = statistics.median(before + after)
    layer_sum_ms = costs.total("forward_ms") + costs.total("backward_ms")
    samples = costs.meta["samples_ms"]
    layer_sum_min_ms = sum(min(f) + min(b) for f, b in zip(samples["forward_ms"], samples["backward_ms"]))
    step_min_ms = min(before + after)
    return {
        "model": name, "batch_size": batch_size, "overrides": overrides, "repeats": repeats, "layers": len(costs),
        "layer_sum_ms": round(layer_sum_ms, 2), "step_ms": round(step_ms, 2),
        "step_ms_samples": [round(t, 2) for t in before + after],
        "ratio": round(layer_sum_ms / step_ms, 3), "ratio_of_minima": round(layer_sum_min_ms / step_min_ms, 3),
        "profile_wall_s": round(profile_s, 2),
        "profile_over_step": round(profile_s * 1e3 / step_ms, 1), "gflop_forward": round(costs.total("flops") / 1e9, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small cases only (a smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="override every case's repeats")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "profiling.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    header = (f"{'model':<11}{'batch':>6}{'layers':>7}{'sum ms':>10}{'step ms':>10}{'ratio':>7}{'min ratio':>10}"
              f"{'profile s':>10}{'x step':>8}")
    print(header)
    for name, batch_size, overrides, repeats in QUICK if args.quick else CASES:
        row = run_case(name, batch_size, overrides, args.repeats or repeats)
        rows.append(row)
        print(f"{row['model']:<11}{row['batch_size']:>6}{row['layers']:>7}{row['layer_sum_ms']:>10.1f}"
              f"{row['step_ms']:>10.1f}{row['ratio']:>7.3f}{row['ratio_of_minima']:>10.3f}{row['profile_wall_s']:>10.1f}{row['profile_over_step']:>8.1f}",
              flush=True)
    result = {"benchmark": "profiling", "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": platform.machine(), "load_average": list(os.getloadavg()), "rows": rows,
              "note": "ratio = per-layer forward+backward sum / whole training step (fwd+loss+bwd), same run"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
