"""2D (SUMMA) vs 1D (Megatron) tensor parallelism vs dense on GPT-2, 4 CPU ranks with gloo.

Measures, for a tiny and a small GPT-2: step time (median over steps, modes
interleaved within each launch and their order rotated between launches),
per-rank parameter and activation bytes, the communication volume counted by
the runtime against the cost model's formula, and the largest batch whose
per-rank memory (parameters + gradients + AdamW state + activations) fits a
cap, measured (activation bytes at two batch sizes, linear in the batch) and
predicted. Dense runs in one process of the same job while the other ranks
wait. Writes bench/results/tensor2d.json.

Run: .venv/bin/python bench/bench_tensor2d.py [--repeats 3] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workbench.core.topology import Topology
from workbench.planning.costs.tensor_costs import (
    TransformerShape, activation_bytes_per_rank, max_batch_under_cap, param_bytes_per_rank, step_volume_1d, step_volume_2d)
from workbench.runtime.groups import ParallelGroups, build_groups
from workbench.runtime.strategies.tensor2d.train import TensorParallelConfig, run_tensor_parallel

HERE = Path(__file__).resolve().parent
CONFIGS = {
    "tiny": dict(n_embd=64, n_head=4, n_layer=2, vocab_size=256, n_positions=64, batch_size=8, seq_len=32),
    "small": dict(n_embd=256, n_head=8, n_layer=4, vocab_size=1024, n_positions=128, batch_size=16, seq_len=64),
}
CAP_BYTES = {"tiny": 8 << 20, "small": 96 << 20}
# label -> (mode, 2D linear algorithm)
MODES = {"2d": ("2d", "broadcast"), "2d_allgather": ("2d", "allgather"), "1d": ("1d", "broadcast"), "dense": ("dense", "broadcast")}
Q, DEGREE_1D = 2, 4


def shape_of(sizes: dict, batch: int) -> TransformerShape:
    return TransformerShape(hidden=sizes["n_embd"], heads=sizes["n_head"], layers=sizes["n_layer"],
                            vocab=sizes["vocab_size"], positions=sizes["n_positions"], batch=batch, seq=sizes["seq_len"])


def run_mode(label: str, sizes: dict, steps: int, groups: dict, rank: int, measure_memory: bool) -> dict | None:
    mode, summa = MODES[label]
    degree = Q if mode == "2d" else DEGREE_1D
    config = TensorParallelConfig(mode=mode, q=degree, steps=steps, summa=summa, **sizes)
    if mode == "dense":
        if rank != 0:
            return None
        result = run_tensor_parallel(config, ParallelGroups(Topology(dp=1), 0, {"dp": None}))
    else:
        result = run_tensor_parallel(config, groups[mode])
    timing = {"step_ms": result["step_ms"][1:], "losses": result["losses"], "param_bytes": result["param_bytes"],
              "activation_bytes": result["activation_bytes"], "comm_elements_per_step": result["comm"]["total_elements"] / steps}
    if not measure_memory:
        return timing
    double = TensorParallelConfig(mode=mode, q=degree, steps=1, summa=summa, **{**sizes, "batch_size": 2 * sizes["batch_size"]})
    bigger = run_tensor_parallel(double, groups.get(mode) or ParallelGroups(Topology(dp=1), 0, {"dp": None}))
    return {**timing, "activation_bytes_2x": bigger["activation_bytes"]}


def rank_body(rank: int, world: int, init_file: str, out_file: str, sizes: dict, repeat: int, steps: int,
              batches: dict[str, int]) -> None:
    """Run every label of ``batches`` (label -> batch size) in a rotated order; rank 0 writes the results."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    groups = {"2d": build_groups(Topology(dp=1, tp_row=Q, tp_col=Q)), "1d": build_groups(Topology(dp=1, tp=DEGREE_1D))}
    labels = list(batches)
    order = labels[repeat % len(labels):] + labels[:repeat % len(labels)]
    results = {}
    for label in order:
        dist.barrier()
        at_default = batches[label] == sizes["batch_size"]
        results[label] = run_mode(label, {**sizes, "batch_size": batches[label]}, steps, groups, rank, at_default)
        dist.barrier()
    if rank == 0:
        Path(out_file).write_text(json.dumps({"order": list(order), **results}))
    dist.destroy_process_group()


def fit_max_batch(batch: int, act: int, act_2x: int, param_bytes: int, cap: int, multiple: int) -> int:
    """Largest batch (a multiple of ``multiple``) under ``cap``, activations linear in the batch."""
    per_sample = (act_2x - act) / batch
    fixed = act - per_sample * batch + 4 * param_bytes
    if per_sample <= 0 or fixed > cap:
        return 0
    return int((cap - fixed) // per_sample) // multiple * multiple


def summarise(name: str, sizes: dict, launches: list[dict]) -> dict:
    batch = sizes["batch_size"]
    shape = shape_of(sizes, batch)
    out: dict = {"config": sizes, "cap_bytes": CAP_BYTES[name], "modes": {}}
    for label, (mode, _) in MODES.items():
        degree = Q if mode == "2d" else (DEGREE_1D if mode == "1d" else 1)
        runs = [launch[label] for launch in launches]
        step_ms = statistics.median(ms for run in runs for ms in run["step_ms"])
        first = runs[0]
        formula = {"2d": lambda: step_volume_2d(shape, Q)["total_elements"],
                   "1d": lambda: step_volume_1d(shape, DEGREE_1D)["total_elements"], "dense": lambda: 0.0}[mode]()
        out["modes"][label] = {
            "ranks": 4 if mode != "dense" else 1,
            "step_ms_median": step_ms,
            "step_ms_per_launch": [statistics.median(run["step_ms"]) for run in runs],
            "param_bytes_per_rank": first["param_bytes"],
            "param_bytes_predicted": param_bytes_per_rank(shape, mode, degree),
            "activation_bytes_per_rank": first["activation_bytes"],
            "activation_bytes_predicted": activation_bytes_per_rank(shape, mode, degree),
            "comm_elements_per_step": first["comm_elements_per_step"],
            "comm_elements_formula": formula,
            "max_batch_measured": fit_max_batch(batch, first["activation_bytes"], first["activation_bytes_2x"],
                                                first["param_bytes"], CAP_BYTES[name], Q if mode == "2d" else 1),
            "max_batch_predicted": max_batch_under_cap(shape, mode, degree, CAP_BYTES[name]),
            "final_loss": first["losses"][-1],
        }
    m = out["modes"]
    out["ratios"] = {
        "step_time_1d_over_2d": m["1d"]["step_ms_median"] / m["2d"]["step_ms_median"],
        "step_time_dense_over_2d": m["dense"]["step_ms_median"] / m["2d"]["step_ms_median"],
        "activation_bytes_2d_over_1d": m["2d"]["activation_bytes_per_rank"] / m["1d"]["activation_bytes_per_rank"],
        "comm_elements_2d_over_1d": m["2d"]["comm_elements_per_step"] / m["1d"]["comm_elements_per_step"],
        "step_time_1d_over_2d_allgather": m["1d"]["step_ms_median"] / m["2d_allgather"]["step_ms_median"],
        "max_batch_2d_over_1d": m["2d"]["max_batch_measured"] / max(1, m["1d"]["max_batch_measured"]),
    }
    return out


def print_table(name: str, summary: dict) -> None:
    print(f"\n{name}: {summary['config']}  cap {summary['cap_bytes'] >> 20} MiB/rank")
    header = f"{'mode':13} {'step ms':>9} {'params/rank':>12} {'act/rank':>10} {'act pred':>10} {'comm el/step':>13} {'formula':>11} {'max batch':>9} {'pred':>5}"
    print(header)
    for mode, row in summary["modes"].items():
        print(f"{mode:13} {row['step_ms_median']:9.1f} {row['param_bytes_per_rank']:12d} {row['activation_bytes_per_rank']:10d} "
              f"{row['activation_bytes_predicted']:10d} {row['comm_elements_per_step']:13.0f} {row['comm_elements_formula']:11.0f} "
              f"{row['max_batch_measured']:9d} {row['max_batch_predicted']:5d}")
    for label, row in summary.get("at_max_batch", {}).items():
        print(f"at its max batch {row['batch']:4d}: {label:13} {row['step_ms_median']:9.1f} ms/step {row['samples_per_s']:8.1f} samples/s")
    print("ratios:", {k: round(v, 3) for k, v in summary["ratios"].items()})


def launch_all(sizes: dict, batches: dict[str, int], repeats: int, steps: int) -> list[dict]:
    """``repeats`` 4-rank launches, each running every label once (order rotated per launch)."""
    launches = []
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            out_file = os.path.join(tmp, "result.json")
            mp.spawn(rank_body, args=(4, os.path.join(tmp, "init"), out_file, sizes, repeat, steps, batches), nprocs=4)
            launches.append(json.loads(Path(out_file).read_text()))
    return launches


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    results = {"world_size": 4, "q": Q, "degree_1d": DEGREE_1D, "repeats": args.repeats, "steps": args.steps,
               "machine": f"{os.cpu_count()} CPU cores, gloo, 1 thread per rank", "configs": {}}
    started = time.time()
    for name in args.configs:
        sizes = CONFIGS[name]
        launches = launch_all(sizes, {label: sizes["batch_size"] for label in MODES}, args.repeats, args.steps)
        summary = summarise(name, sizes, launches)
        at_cap = {label: row["max_batch_measured"] for label, row in summary["modes"].items()
                  if label != "dense" and row["max_batch_measured"] > 0}
        capped = launch_all(sizes, at_cap, args.repeats, args.steps)
        summary["at_max_batch"] = {label: {"batch": batch, "step_ms_median": statistics.median(ms for run in capped for ms in run[label]["step_ms"]),
                                           "samples_per_s": batch / statistics.median(ms for run in capped for ms in run[label]["step_ms"]) * 1e3}
                                   for label, batch in at_cap.items()}
        if {"2d", "1d"} <= set(at_cap):
            rows = summary["at_max_batch"]
            summary["ratios"]["throughput_at_own_max_batch_2d_over_1d"] = rows["2d"]["samples_per_s"] / rows["1d"]["samples_per_s"]
            summary["ratios"]["throughput_at_own_max_batch_2d_allgather_over_1d"] = rows["2d_allgather"]["samples_per_s"] / rows["1d"]["samples_per_s"]
        results["configs"][name] = summary
        print_table(name, summary)
    results["wall_s"] = time.time() - started
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "tensor2d.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {HERE / 'results' / 'tensor2d.json'} in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
