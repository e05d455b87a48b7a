"""Runtime throughput against its peers, in paired launches on this machine.

Two questions, each answered as a ratio of samples per second measured in
the same session, in interleaved launches (A, B, A, B, ...) so the drift of
a shared machine hits both sides, median over ``--reps`` pairs:

1. our interpreter running 1F1B vs ``torch.distributed.pipelining``'s
   ``Schedule1F1B`` on the same model and partition (AMPA's cut, found
   here on a profile; ``--partition uniform`` for the plan's default), on
   2 and 4 CPU ranks (ratio >= 1.0 means ours is at least as fast);
2. GroPipe (2 groups x 2 stages, delay 0 and 1) vs torch DDP on 4 ranks,
   on the small VGG with big FC layers, on the same VGG with 4096-wide FC
   layers (communication-heavy) and on ResNet-18 (32x32 inputs),
   and GroPipe delay 1 vs delay 0 (what hiding the all-reduce buys).

Every side runs at its own best setting for the same global batch: our
pipelines and GroPipe with fused weight-gradient accumulation
(``training.fused_weight_grads``; one more comparison measures what it
brings against autograd's accumulation), DDP without gradient accumulation (one micro-batch: the whole replica batch
fits in memory here), and each pipeline (ours, torch's, GroPipe) at the
micro-batch count among ``--microbatches`` that gave it the most samples/s
in a sweep of single launches before the paired ones (the sweep is printed
and kept in the results).

Every run is a real ``torchrun`` launch of ``workbench.runtime.entry``;
throughput is the median over the steps after ``--warmup`` of the
``samples_per_s`` the ranks report (start-up is excluded). Stage events are
off on both sides. Prints a table and merges its rows (by comparison name)
into ``bench/results/runtime.json``.

    .venv/bin/python bench/bench_runtime.py [--reps 3] [--steps 8] [--quick] [--only TEXT] [--partition ampa]
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

from workbench.core.config import RunConfig, merge_changes
from workbench.runtime.events import read_events

RESULTS = Path(__file__).resolve().parent / "results" / "runtime.json"

VGG = {"model": "vgg-tiny", "training": {"global_batch": 64}, "data": {"kind": "digits"}}
# the same network with 4096-wide fully connected layers (~25 M parameters, ~100 MB of gradients per
# step): the communication-heavy regime of VGG-16, whose classifier holds 120 M of its 138 M parameters
VGG_WIDE = {**VGG, "model": {"name": "vgg-tiny", "overrides": {"fc_width": 4096}}}
RESNET = {"model": {"name": "resnet18", "overrides": {"image_size": 32, "num_classes": 10}},
          "training": {"global_batch": 32}, "data": {"kind": "synthetic"}}


def fused(fields: dict) -> dict:
    """Our pipelines at their best: linear layers accumulate weight gradients inside their products."""
    return merge_changes(fields, {"training": {"fused_weight_grads": True}})


def partition_for(fields: dict, stages: int, how: str) -> str:
    """The cut both sides of a pipeline comparison run at, as a plan's partition text: AMPA's on a one-thread
    profile of the model at the micro-batch size of two micro-batches (printed), or the uniform cut."""
    if how == "uniform":
        return "uniform"
    import torch

    from workbench.runtime.batches import global_batches, run_model, split_rounds
    from workbench.runtime.entry import resolve_partition

    torch.set_num_threads(1)
    config = RunConfig.from_dict({**fields, "plan": f"pp{stages}-1f1b-m2@ampa"})
    model = run_model(config)
    example = split_rounds(next(global_batches(config, model, 0)), config, 0)[0].inputs[0]
    cut = str(resolve_partition(config, model, example, "cpu"))
    print(f"  AMPA's {stages}-stage cut of {config.model.name}: {cut}", flush=True)
    return cut


def throughput(fields: dict, steps: int, warmup: int) -> float:
    """Median samples/s of one torchrun launch (steps after the warm-up)."""
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        run_dir = Path(tmp)
        config = RunConfig.from_dict(merge_changes(fields, {
            "training": {"steps": steps, "seed": 0}, "run": {"dir": str(run_dir)},
            "events": {"stage_events": False, "heartbeat_s": 30.0}}))
        config.save_json(run_dir / "config.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={config.world_size}", "-m", "workbench.runtime.entry",
               "--config", str(run_dir / "config.json")]
        proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"launch {fields} failed:\n{proc.stderr[-2000:]}")
        rates = [e["samples_per_s"] for e in read_events(run_dir, 0) if e["kind"] == "step"][warmup:]
        return statistics.median(rates)


def sweep_throughputs(fields_list: list[dict], steps: int, warmup: int) -> tuple[list[float], list[dict]]:
    """Median samples/s of each of several runs trained one after another in ONE torchrun launch (the entry's
    sweep: the runs share the processes, so the launch's start-up is paid once), and rank 0's start event of
    each. The runs must agree on the world size and device."""
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        paths, configs = [], []
        for index, fields in enumerate(fields_list):
            run_dir = Path(tmp) / f"run{index}"
            run_dir.mkdir()
            config = RunConfig.from_dict(merge_changes(fields, {
                "training": {"steps": steps, "seed": 0}, "run": {"dir": str(run_dir)},
                "events": {"stage_events": False, "heartbeat_s": 30.0}}))
            config.save_json(run_dir / "config.json")
            paths.append(run_dir)
            configs.append(config)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={configs[0].world_size}", "-m", "workbench.runtime.entry"]
        for run_dir in paths:
            cmd += ["--config", str(run_dir / "config.json")]
        proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                              timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"the sweep of {[c.plan.name for c in configs]} failed:\n{proc.stderr[-2000:]}")
        rates, starts = [], []
        for run_dir in paths:
            events = read_events(run_dir, 0)
            rates.append(statistics.median([e["samples_per_s"] for e in events if e["kind"] == "step"][warmup:]))
            starts.append(next((e for e in events if e["kind"] == "start"), {}))
        return rates, starts


def paired(name: str, a: dict, b: dict, reps: int, steps: int, warmup: int) -> dict:
    """Interleaved launches of A and B; ratio = median(A) / median(B)."""
    rates_a, rates_b = [], []
    for _ in range(reps):
        rates_a.append(throughput(a, steps, warmup))
        rates_b.append(throughput(b, steps, warmup))
    row = {"comparison": name, "a_samples_per_s": statistics.median(rates_a),
           "b_samples_per_s": statistics.median(rates_b), "a_runs": rates_a, "b_runs": rates_b}
    row["ratio"] = row["a_samples_per_s"] / row["b_samples_per_s"]
    print(f"{name:<44} {row['a_samples_per_s']:>9.1f} {row['b_samples_per_s']:>9.1f} {row['ratio']:>7.3f}",
          flush=True)
    return row


def best_setting(label: str, fields: dict, plans: dict[int, str], steps: int, warmup: int,
                 sweeps: dict[str, dict[int, float]]) -> dict:
    """``fields`` with the plan (one per micro-batch count) that ran fastest in one launch each."""
    if label not in sweeps:
        sweeps[label] = {}
        for m, plan in plans.items():
            try:
                sweeps[label][m] = throughput({**fields, "plan": plan}, steps, warmup)
            except RuntimeError as exc:  # a count the schedule refuses (torch's 1F1B wants m >= stages)
                print(f"  sweep {label}: m{m} did not run: {str(exc).splitlines()[-1][:160]}", flush=True)
        rates = ", ".join(f"m{m} {r:.1f}" for m, r in sweeps[label].items())
        print(f"  sweep {label}: {rates} samples/s", flush=True)
    if not sweeps[label]:
        raise RuntimeError(f"{label}: no micro-batch count ran")
    best = max(sweeps[label], key=sweeps[label].get)
    return {**fields, "plan": plans[best]}



def compare_at_best(comparisons: list[tuple], args, sweeps: dict[str, dict[int, float]]) -> list[dict]:
    """Each comparison ``(name, label_a, fields_a, plans_a, label_b, fields_b, plans_b)`` whose name contains
    ``args.only``: both sides at the setting their own sweep found fastest, then measured in interleaved rounds."""
    print(f"{'comparison (A vs B)':<44} {'A smp/s':>9} {'B smp/s':>9} {'A/B':>7}", flush=True)
    rows = []
    for name, label_a, fields_a, plans_a, label_b, fields_b, plans_b in comparisons:
        if args.only not in name:
            continue
        a = best_setting(label_a, fields_a, plans_a, args.steps, args.warmup, sweeps)
        b = best_setting(label_b, fields_b, plans_b, args.steps, args.warmup, sweeps)
        row = paired(name, a, b, args.reps, args.steps, args.warmup)
        row.update(a_plan=a["plan"], b_plan=b["plan"], a_sweep=sweeps[label_a], b_sweep=sweeps[label_b])
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="paired launches per comparison (median)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="only the 2-rank pipeline and VGG comparisons")
    parser.add_argument("--only", default="", help="run only the comparisons whose name contains this text")
    parser.add_argument("--microbatches", default="2,4,8", help="micro-batch counts each pipeline is swept over")
    parser.add_argument("--partition", default="ampa", choices=("ampa", "uniform"),
                        help="the cut both pipelines of a 1F1B comparison run at: AMPA's on a profile taken here "
                             "(faster for both), or the plan's default uniform cut")
    args = parser.parse_args()
    counts = [int(m) for m in args.microbatches.split(",")]
    sweeps: dict[str, dict[int, float]] = {}
    comparisons = []  # (name, A's label, A's fields, A's plans, B's label, B's fields, B's plans)
    for ranks in (2, 4) if not args.quick else (2,):
        cut = partition_for(VGG, ranks, args.partition)
        comparisons.append((f"1f1b ours vs torch Schedule1F1B, {ranks} ranks",
                            f"ours pp{ranks}", fused(VGG), {m: f"pp{ranks}-1f1b-m{m}@{cut}" for m in counts},
                            f"torch pp{ranks}", VGG, {m: f"torchpp{ranks}-1f1b-m{m}@{cut}" for m in counts}))
    cut = partition_for(VGG, 2, args.partition)
    comparisons.append(("1f1b ours, fused vs autograd weight gradients, 2 ranks",
                        "ours pp2", fused(VGG), {m: f"pp2-1f1b-m{m}@{cut}" for m in counts},
                        "ours pp2 autograd", VGG, {m: f"pp2-1f1b-m{m}@{cut}" for m in counts}))
    models = [("vgg-tiny", VGG)] + ([] if args.quick else [("vgg-fc4096", VGG_WIDE), ("resnet18", RESNET)])
    for model_name, model in models:
        ddp = (f"ddp x4 {model_name}", model, {1: "dp4"})  # no accumulation: the replica batch fits
        gro = {d: (f"gropipe d{d} {model_name}", fused(model), {m: f"gropipe-2x2-1f1b-m{m}-d{d}" for m in counts})
               for d in (0, 1)}
        for delay in (0, 1):
            comparisons.append((f"gropipe 2x2 delay {delay} vs ddp x4, {model_name}", *gro[delay], *ddp))
        comparisons.append((f"gropipe 2x2 delay 1 vs delay 0, {model_name}", *gro[1], *gro[0]))
        comparisons.append((f"gropipe 2x2 delay 1, fused vs autograd weight gradients, {model_name}", *gro[1],
                            f"gropipe d1 {model_name} autograd", model,
                            {m: f"gropipe-2x2-1f1b-m{m}-d1" for m in counts}))
    rows = compare_at_best(comparisons, args, sweeps)
    previous = json.loads(RESULTS.read_text())["rows"] if RESULTS.is_file() else []
    ran = {row["comparison"] for row in rows}
    merged = [row for row in previous if row["comparison"] not in ran] + rows
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"topic": "runtime", "time": time.time(), "reps": args.reps, "steps": args.steps,
                                   "warmup": args.warmup, "rows": merged}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
