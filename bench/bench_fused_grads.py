"""Fused weight-gradient accumulation against autograd's, one linear layer at a time, in one process.

For each layer shape, a step of ``--microbatches`` micro-batches (``--samples`` each): forward, backward,
then the optimizer's ``zero_grad(set_to_none=True)``, as a pipeline stage runs them. Timed per step,
median of ``--steps`` after a warm-up, with autograd's accumulation (a new weight gradient per micro-batch
added to ``.grad``; ``.grad`` allocated anew each step) and fused (``workbench.models.fused_grads``: the
product accumulates into ``.grad``, kept across steps), interleaved in rounds so that drift hits both.
Reports the ratio autograd / fused (above 1: fused is faster) and the minor page faults per step.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_fused_grads.py [--rounds 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from workbench.models.fused_grads import WeightGradBuffers, fuse_weight_grads

RESULTS = Path(__file__).resolve().parent / "results" / "fused_grads.json"
# (inputs, outputs): vgg-tiny's fc1 and fc2, vgg-fc4096's fc2, GPT-2 small's MLP projection
SHAPES = [(2048, 1024), (1024, 1024), (4096, 4096), (768, 3072)]


def _step_ms(layer: nn.Linear, inputs: list[torch.Tensor], steps: int) -> tuple[float, float]:
    """Median ms per step and minor page faults per step."""
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps + 2):
        start = time.perf_counter()
        for x in inputs:
            layer(x).sum().backward()
        layer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / (steps + 2)
    return statistics.median(times[2:]) * 1e3, faults


def measure(shape: tuple[int, int], samples: int, microbatches: int, rounds: int, steps: int) -> dict:
    torch.manual_seed(0)
    plain = nn.Linear(*shape)
    fused = nn.Linear(*shape)
    fused.load_state_dict(plain.state_dict())
    fuse_weight_grads(fused, WeightGradBuffers())
    inputs = [torch.randn(samples, shape[0], requires_grad=True) for _ in range(microbatches)]
    autograd_ms, fused_ms, autograd_faults, fused_faults = [], [], [], []
    for _ in range(rounds):
        ms, faults = _step_ms(plain, inputs, steps)
        autograd_ms.append(ms)
        autograd_faults.append(faults)
        ms, faults = _step_ms(fused, inputs, steps)
        fused_ms.append(ms)
        fused_faults.append(faults)
    row = {"inputs": shape[0], "outputs": shape[1], "samples": samples, "microbatches": microbatches,
           "autograd_ms": statistics.median(autograd_ms), "fused_ms": statistics.median(fused_ms),
           "autograd_rounds": autograd_ms, "fused_rounds": fused_ms,
           "autograd_faults_per_step": statistics.median(autograd_faults),
           "fused_faults_per_step": statistics.median(fused_faults)}
    row["ratio"] = row["autograd_ms"] / row["fused_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'layer (in x out)':<18} {'autograd ms':>12} {'fused ms':>9} {'ratio':>6} {'faults/step':>18}", flush=True)
    rows = []
    for shape in SHAPES:
        row = measure(shape, args.samples, args.microbatches, args.rounds, args.steps)
        rows.append(row)
        print(f"{shape[0]:>6} x {shape[1]:<8} {row['autograd_ms']:>12.2f} {row['fused_ms']:>9.2f} {row['ratio']:>6.2f} "
              f"{row['autograd_faults_per_step']:>8.0f} / {row['fused_faults_per_step']:<7.0f}", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"topic": "fused weight gradients", "time": time.time(), **vars(args),
                                   "threads": torch.get_num_threads(), "rows": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
