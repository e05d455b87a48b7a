"""The runtime on GPUs: GroPipe vs DDP, our 1F1B vs torch's Schedule1F1B, and model FLOPs utilisation.

Needs CUDA; without it the script says so and exits 0 without measuring or
writing anything (so ``make bench`` and ``bench/run_all.py`` pass on a
machine without a GPU).

The two comparisons are those of ``bench/bench_runtime.py``, run with its
own functions on this machine's GPUs: paired, interleaved launches of real
``torchrun`` runs (median ratio of samples per second over ``--reps``
pairs), each side at its best setting for the same global batch (every
pipeline at the micro-batch count among ``--microbatches`` that ran fastest
in a sweep, DDP without gradient accumulation):

1. GroPipe (delay 0 and 1) vs torch DDP on ResNet-18 (224 x 224 inputs,
   synthetic data): 2 groups x 2 stages vs 4 replicas with 4 or more GPUs,
   1 group x 2 stages vs 2 replicas with 2 or 3;
2. our interpreter running 1F1B vs ``torch.distributed.pipelining``'s
   ``Schedule1F1B`` on the same model and partition, on 2 stages (and on 4
   with 4 or more GPUs).

Every rank has a GPU of its own (NCCL); a comparison that needs more GPUs
than the machine has is listed as skipped with the count it needs.

MFU (model FLOPs utilisation) of every measured side: the model FLOPs of a
sample (forward and backward, summed over the per-layer counts of a
profile of the model on this GPU) x samples per second, over the GPUs the
run used x the GPU's peak dense FLOP/s for the run's precision (datasheet
figures, :data:`PEAK_TFLOPS`; a GPU not in the table gets no MFU). With
``fp32``, convolutions that cuDNN runs as TF32 or Winograd can reach more
than the plain float32 peak.

Prints a table and writes ``bench/results/gpu.json``.

    .venv/bin/python bench/bench_gpu.py [--reps 3] [--steps 12] [--warmup 4] [--global-batch 128]
                                        [--precision bf16] [--quick] [--only TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench_runtime import compare_at_best
from workbench.core.devices import DATASHEET_DEVICES

RESULTS = Path(__file__).resolve().parent / "results" / "gpu.json"

# Peak dense TFLOP/s by a part of torch.cuda.get_device_name(), first match wins: the planner's datasheet devices
# (SXM parts), and the variants it has no preset for (datasheet figures, dense).
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200 NVL", {"float32": 60.0, "bfloat16": 835.0}),
    ("H200", {"float32": 66.9, "bfloat16": 989.4}),  # the H100 SXM's compute with more, faster memory
    ("H100 PCIe", {"float32": 51.2, "bfloat16": 756.0}),
    ("H100", DATASHEET_DEVICES["H100"].peak_tflops),
    ("A100", DATASHEET_DEVICES["A100"].peak_tflops),
]
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The table's peak for ``device_name`` at ``precision`` (``bf16`` or ``fp32``), None for an unknown GPU."""
    for part, peaks in PEAK_TFLOPS:
        if part in device_name:
            return peaks.get(DTYPES[precision])
    return None


def flops_per_sample(fields: dict) -> float:
    """Forward + backward model FLOPs of one sample: the per-layer counts of a profile on this GPU."""
    from workbench.core.config import RunConfig
    from workbench.models import sample_batch
    from workbench.profiling import profile
    from workbench.runtime.batches import run_model

    model = run_model(RunConfig.from_dict({**fields, "plan": "dp1"}))
    batch = 4
    costs = profile(model, sample_batch(model, batch), device="cuda", warmup=1, repeats=1, progress=False)
    return (sum(costs.column("flops")) + sum(costs.meta["backward_flops"])) / batch


def mfu(samples_per_s: float, gpus: int, per_sample: float, peak: float | None) -> float | None:
    return None if peak is None else samples_per_s * per_sample / (gpus * peak * 1e12)


def world_size(plan: str) -> int:
    from workbench.core.plan import ParallelPlan

    return ParallelPlan.parse(plan).world_size


def comparisons(gpus: int, model: dict, counts: list[int], quick: bool) -> tuple[list[tuple], list[dict]]:
    """(name, A's label, fields, plans, B's label, fields, plans) per comparison this machine can run; the skipped."""
    runnable, skipped = [], []
    groups = 2 if gpus >= 4 else 1
    ddp = (f"ddp x{2 * groups}", model, {1: f"dp{2 * groups}"})
    gro = {d: (f"gropipe {groups}x2 d{d}", model, {m: f"gropipe-{groups}x2-1f1b-m{m}-d{d}" for m in counts})
           for d in (0, 1)}
    for delay in (0, 1):
        runnable.append((f"gropipe {groups}x2 delay {delay} vs ddp x{2 * groups}", *gro[delay], *ddp))
    for ranks in (2,) if quick else (2, 4):
        runnable.append((f"1f1b ours vs torch Schedule1F1B, {ranks} GPUs",
                         f"ours pp{ranks}", model, {m: f"pp{ranks}-1f1b-m{m}" for m in counts},
                         f"torch pp{ranks}", model, {m: f"torchpp{ranks}-1f1b-m{m}" for m in counts}))
    kept = []
    for row in runnable:
        needed = max(world_size(next(iter(row[3].values()))), world_size(next(iter(row[6].values()))))
        if needed > gpus:
            skipped.append({"comparison": row[0], "reason": f"needs {needed} GPUs, this machine has {gpus}"})
        else:
            kept.append(row)
    return kept, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="paired launches per comparison (median)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of the throughput (start-up)")
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--precision", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--microbatches", default="2,4,8", help="micro-batch counts each pipeline is swept over")
    parser.add_argument("--quick", action="store_true", help="only the 2-GPU 1F1B comparison besides GroPipe vs DDP")
    parser.add_argument("--only", default="", help="run only the comparisons whose name contains this text")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu.py needs CUDA (torch.cuda.is_available() is False): nothing measured, nothing written")
        return 0
    gpus, name = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    model = {"model": "resnet18", "global_batch": args.global_batch, "data": {"kind": "synthetic"},
             "device": "cuda", "precision": args.precision, "tensorboard": False}
    counts = [int(m) for m in args.microbatches.split(",")]
    peak = peak_tflops(name, args.precision)
    per_sample = flops_per_sample(model)
    print(f"{gpus} x {name}; {args.precision} peak {peak if peak is not None else 'unknown'} TFLOP/s per GPU; "
          f"resnet18 {per_sample / 1e9:.2f} GFLOP per sample (forward + backward)", flush=True)
    planned, skipped = comparisons(gpus, model, counts, args.quick)
    for entry in skipped:
        print(f"skipped: {entry['comparison']} ({entry['reason']})", flush=True)
    sweeps: dict[str, dict[int, float]] = {}
    rows = compare_at_best(planned, args, sweeps)
    for row in rows:
        for side in ("a", "b"):
            used = min(world_size(row[f"{side}_plan"]), gpus)
            row[f"{side}_gpus"] = used
            row[f"{side}_mfu"] = mfu(row[f"{side}_samples_per_s"], used, per_sample, peak)
    print(f"\n{'comparison (A vs B)':<44} {'A plan':>24} {'A MFU':>7} {'B plan':>24} {'B MFU':>7}")
    for row in rows:
        cells = [f"{row[k]:.3f}" if row[k] is not None else "n/a" for k in ("a_mfu", "b_mfu")]
        print(f"{row['comparison']:<44} {row['a_plan']:>24} {cells[0]:>7} {row['b_plan']:>24} {cells[1]:>7}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "topic": "gpu", "time": time.time(), "device": name, "gpus": gpus, "torch": torch.__version__,
        "precision": args.precision, "peak_tflops_per_gpu": peak, "model": "resnet18",
        "global_batch": args.global_batch, "flops_per_sample": per_sample, "reps": args.reps, "steps": args.steps,
        "warmup": args.warmup, "rows": rows, "skipped": skipped}, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
