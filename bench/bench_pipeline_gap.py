"""Why a 2-stage 1F1B pipeline falls short of its ideal over naive model parallelism, on two ranks.

Naive model parallelism (the whole global batch as one micro-batch, one
stage busy at a time), 1F1B and the asynchronous pipeline (both with ``M``
micro-batches) run ResNet-18 on two uncontended ranks (one per core), at
32x32, 64x64 and 96x96 inputs, global batch 64, synthetic data, interleaved per
repeat (naive, 1f1b, async, then 1f1b and async again on the partition
AMPA picks from the profile at the micro-batch size; the others use the
default partition, uniform in layers). With ``S`` stages the ideal
1F1B / naive throughput ratio is ``S M / (M + S - 1)`` (1.6 for S=2, M=4).
The gap to it is taken apart into:

* **micro-batch efficiency**: ``M`` micro-batches of ``b / M`` samples
  against one of ``b``, forward + backward summed over the layers, from the
  profiler at both sizes (``> 1``: small micro-batches cost more per sample);
* **stage imbalance**: the slower stage against the mean of the two, from
  the profile at the micro-batch size and the partition the run used (the
  pipeline runs at its slowest stage; naive parallelism pays the sum), and
  the micro-batch efficiency of each stage on its own (a stage of
  weight-heavy layers loses more in small micro-batches than one of
  activation-heavy layers, so the cut balanced at one size is not at the
  other);
* **stage passes**: each stage of the partition run alone in one process,
  forward and backward of the whole batch and of the ``M`` micro-batches
  one after the other, as its rank runs them. The profile times each layer
  alone, its weights hot in the cache; a stage pass streams the stage's
  weights once per micro-batch, which the profile does not see. The ideal
  these give is the whole batch's passes summed over the stages (naive
  parallelism) over ``(M + S - 1) / M`` times the slowest stage's
  micro-batch passes;
* **concurrency**: the compute the ranks measured (forward, backward and
  step, both ranks) against the profile's time for the same work, measured
  alone: naive parallelism computes on one rank at a time, a pipeline on
  both at once, and two processes computing at once on this machine's two
  vCPUs share more than the cores (memory bandwidth, caches);
* **communication**: the time each rank spends in its sends and receives
  per step (a blocking receive includes waiting for the peer), from the
  measured events;
* **runtime overhead**: the time between a rank's recorded actions within an
  iteration that is neither compute nor communication, per step, from the
  measured events; the time between iterations (optimizer step, loss
  reduction, next batch, waiting for the other rank) is reported apart.

The simulator, given the profile at each run's micro-batch size and the
partition used, predicts the ratio; the target is within 10% of the
measured one. Throughput is samples over the summed step times after
``WARMUP`` steps; medians over repeats, ratios taken within a repeat.

    .venv/bin/python bench/bench_pipeline_gap.py [--repeats 3] [--sizes 32,64,96] [--microbatches 4]

Writes ``bench/results/pipeline_gap.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from workbench.core.config import RunConfig, merge_changes
from workbench.core.partition import Partition
from workbench.core.timeline import Timeline
from workbench.jobs import LaunchSpec, launch
from workbench.planning.partitioning.ampa import ampa
from workbench.planning.costs.clusters import core_sharing, get_cluster
from workbench.runtime.events import load_measured_timeline, read_events
from workbench.scheduling import generators, schedule_for
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts

RESULTS = Path(__file__).resolve().parent / "results" / "pipeline_gap.json"
STEPS, WARMUP = 10, 3
GLOBAL_BATCH = 64
STAGES = 2
COMPUTE = ("F", "B", "STEP", "STASH", "RESTORE")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "AR")


def model_fields(size: int) -> dict:
    return {"model": {"name": "resnet18", "overrides": {"image_size": size, "num_classes": 10}},
            "data": {"kind": "synthetic"},
            "training": {"global_batch": GLOBAL_BATCH, "optimizer": {"name": "sgd", "lr": 0.01}}}


def cases(m: int, balanced: Partition) -> dict[str, str]:
    """The runs: naive, 1F1B and async on the default (uniform) partition, and the last two on AMPA's."""
    return {"naive": f"pp{STAGES}-1f1b-m1", "1f1b": f"pp{STAGES}-1f1b-m{m}", "async": f"async-1x{STAGES}-m{m}",
            "1f1b-ampa": f"pp{STAGES}-1f1b-m{m}@{balanced}", "async-ampa": f"async-1x{STAGES}-m{m}@{balanced}"}


def throughput(run_dir: Path) -> float:
    steps = [e for e in read_events(run_dir, 0) if e["kind"] == "step" and e["step"] > WARMUP]
    return len(steps) * GLOBAL_BATCH / (sum(e["step_ms"] for e in steps) / 1e3)


def per_step_breakdown(timeline: Timeline, steps: int) -> dict[str, float]:
    """Mean over ranks, in ms per step, of compute, communication, and the time covered by no event.

    From iteration ``WARMUP`` on. Uncovered time before a rank's first action
    of a new iteration, or after its optimizer step (``STEP``, the last action
    of an async training step, whose stream mixes iterations), is the step
    boundary: the optimizer step where it is not an event, the loss
    reduction, the next batch, the events written, and waiting for the other
    rank there (naive parallelism's idle rank waits there). Every other
    uncovered time between two actions is the runtime's own overhead.
    """
    out = {"compute_ms": [], "comm_ms": [], "overhead_ms": [], "boundary_ms": []}
    for rank in timeline.ranks:
        events = sorted((e for e in timeline.on_rank(rank) if e.iteration >= WARMUP), key=lambda e: e.start)
        if not events:
            continue
        overhead = boundary = 0.0
        reach, after_step, newest = events[0].start, False, events[0].iteration
        for e in events:
            if e.start > reach:
                if after_step or e.iteration > newest:
                    boundary += e.start - reach
                else:
                    overhead += e.start - reach
            reach, after_step, newest = max(reach, e.end), e.op == "STEP", max(newest, e.iteration)
        out["compute_ms"].append(sum(e.duration for e in events if e.op in COMPUTE) / steps)
        out["comm_ms"].append(sum(e.duration for e in events if e.op in COMM) / steps)
        out["overhead_ms"].append(overhead / steps)
        out["boundary_ms"].append(boundary / steps)
    return {k: statistics.mean(v) for k, v in out.items()}


def run_case(root: str, size: int, case: str, plan: str) -> dict:
    fields = merge_changes(model_fields(size), {"name": f"gap-{size}-{case}", "plan": plan,
                                                "training": {"steps": STEPS, "seed": 0}})
    job = launch(LaunchSpec(config=fields, name=f"gap-{size}-{case}", run_root=root))
    state = job.wait(timeout=900).state
    if state != "SUCCEEDED":
        raise RuntimeError(f"{size} {case}: the run ended {state}; see {job.run_dir}")
    start = next(e for e in read_events(job.run_dir, 0) if e["kind"] == "start")
    timeline = load_measured_timeline(job.run_dir)
    return {"samples_per_s": throughput(job.run_dir), "partition": start["partition"],
            "load_avg_1m": os.getloadavg()[0], **per_step_breakdown(timeline, STEPS - WARMUP),
            "run_dir": str(job.run_dir)}


def profile_at(size: int, batch: int):
    from workbench.models import build_model, sample_batch
    from workbench.profiling import profile

    fields = model_fields(size)["model"]
    model = build_model(fields["name"], seed=0, **fields["overrides"])
    return profile(copy.deepcopy(model), sample_batch(model, batch, seed=0), device="cpu", progress=False,
                   cache=False, repeats=5)


def stage_passes(size: int, partition: Partition, microbatch: int, repeats: int = 3) -> dict[str, list[float]]:
    """Each stage of ``partition`` alone in this process, forward and backward of the whole batch and of
    ``GLOBAL_BATCH // microbatch`` micro-batches one after the other, as a pipeline rank runs them (ms, best of
    ``repeats``). Unlike the profile, which times each layer on its own with its weights hot in the cache, a
    stage pass streams all of the stage's weights once per micro-batch."""
    import time

    import torch

    from workbench.models import build_model, sample_batch

    fields = model_fields(size)["model"]
    model = build_model(fields["name"], seed=0, **fields["overrides"])
    inputs, _ = sample_batch(model, GLOBAL_BATCH, seed=0)
    out: dict[str, list[float]] = {"whole_batch_ms": [], "microbatches_ms": []}
    for first, last in partition.bounds:
        with torch.no_grad():
            x = model.stage(0, first - 1)(inputs) if first > 0 else inputs
        stage = model.stage(first, last)
        for key, pieces in (("whole_batch_ms", [x]), ("microbatches_ms", list(x.split(microbatch)))):
            best = float("inf")
            for _ in range(repeats + 1):  # the first pass warms up
                started = time.perf_counter()
                for piece in pieces:
                    piece = piece.detach().requires_grad_(first > 0)
                    stage(piece).float().sum().backward()
                best = min(best, time.perf_counter() - started)
            out[key].append(best * 1e3)
        stage.zero_grad(set_to_none=True)
    return out


def predicted_step_ms(costs, partition: Partition, microbatches: int, kind: str) -> float:
    """The simulator's step time for ``kind`` (1f1b or async) at ``microbatches`` from the profile."""
    cluster = get_cluster("local-cpu")
    stage_costs = StageCosts.from_model(costs, partition, GLOBAL_BATCH // microbatches, optimizer="sgd")
    if kind == "async":
        from workbench.core.plan import ParallelPlan

        schedule = schedule_for(ParallelPlan.parse(f"async-1x{STAGES}-m{microbatches}"), num_iterations=STEPS)
    else:
        schedule = generators.gropipe(1, STAGES, microbatches, inner="1f1b", num_iterations=STEPS)
    result = simulate(schedule, stage_costs, cluster, sharing=core_sharing(cluster))
    return result.metrics["makespan_ms"] / STEPS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="32,64,96")
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    m = args.microbatches
    root = tempfile.mkdtemp(prefix="bench-gap-")
    result = {"steps": STEPS, "warmup": WARMUP, "global_batch": GLOBAL_BATCH, "stages": STAGES, "microbatches": m,
              "repeats": args.repeats, "sizes": {}}
    ideal = STAGES * m / (m + STAGES - 1)
    for size in (int(s) for s in args.sizes.split(",")):
        whole, small = profile_at(size, GLOBAL_BATCH), profile_at(size, GLOBAL_BATCH // m)
        balanced = ampa(small, STAGES, num_microbatches=m, batch_size=GLOBAL_BATCH, optimizer="sgd").partition
        plans = cases(m, balanced)
        runs = {case: [] for case in plans}
        for rep in range(args.repeats):
            for case, plan in plans.items():
                row = run_case(root, size, case, plan)
                runs[case].append(row)
                print(f"{size}x{size} rep {rep} {case:<10} {row['samples_per_s']:7.1f} samples/s  compute "
                      f"{row['compute_ms']:6.1f}  comm {row['comm_ms']:6.1f}  overhead {row['overhead_ms']:5.1f}  boundary "
                      f"{row['boundary_ms']:6.1f} ms/step  "
                      f"load {row['load_avg_1m']:.1f}", flush=True)
        cost = {1: sum(l.forward_ms + l.backward_ms for l in whole.layers),
                m: sum(l.forward_ms + l.backward_ms for l in small.layers)}
        mb_efficiency = m * cost[m] / cost[1]
        summary = {case: {k: statistics.median(r[k] for r in rows) for k in
                          ("samples_per_s", "compute_ms", "comm_ms", "overhead_ms", "boundary_ms", "load_avg_1m")}
                   for case, rows in runs.items()}
        for case in plans:  # measured compute (both ranks) against the profile's solo time for the same work
            solo = cost[1] if case == "naive" else m * cost[m]
            summary[case]["compute_over_profile"] = STAGES * summary[case]["compute_ms"] / solo
        summary["naive"]["predicted_step_ms"] = predicted_step_ms(whole, Partition.parse(runs["naive"][0]["partition"]),
                                                                  1, "1f1b")
        passes = {}
        for case in plans:
            if case == "naive":
                continue
            partition = Partition.parse(runs[case][0]["partition"])
            if str(partition) not in passes:
                passes[str(partition)] = stage_passes(size, partition, GLOBAL_BATCH // m)
            measured_passes = passes[str(partition)]
            stage_ms = partition.stage_sums([l.forward_ms + l.backward_ms for l in small.layers])
            whole_stage_ms = partition.stage_sums([l.forward_ms + l.backward_ms for l in whole.layers])
            imbalance = max(stage_ms) / statistics.mean(stage_ms)
            row = summary[case]
            row.update(partition=str(partition), stage_ms=stage_ms, imbalance=imbalance,
                       stage_microbatch_efficiency=[m * a / b for a, b in zip(stage_ms, whole_stage_ms)],
                       stage_passes=measured_passes,
                       stage_pass_efficiency=[a / b for a, b in zip(measured_passes["microbatches_ms"],
                                                                    measured_passes["whole_batch_ms"])],
                       ideal_from_stage_passes=sum(measured_passes["whole_batch_ms"])
                       / ((m + STAGES - 1) / m * max(measured_passes["microbatches_ms"])),
                       ideal_after_efficiency_and_imbalance=ideal / mb_efficiency / imbalance,
                       predicted_step_ms=predicted_step_ms(small, partition, m, case.split("-")[0]))
            row["over_naive"] = statistics.median(a["samples_per_s"] / b["samples_per_s"]
                                                  for a, b in zip(runs[case], runs["naive"]))
            row["predicted_over_naive"] = summary["naive"]["predicted_step_ms"] / row["predicted_step_ms"]
        for part in ("", "-ampa"):
            summary[f"async_over_1f1b{part}"] = statistics.median(
                a["samples_per_s"] / b["samples_per_s"] for a, b in zip(runs[f"async{part}"], runs[f"1f1b{part}"]))
        summary.update(ideal=ideal, microbatch_efficiency=mb_efficiency, ampa_partition=str(balanced),
                       profile_ms={"whole_batch": cost[1], "microbatch": cost[m]}, runs=runs)
        result["sizes"][str(size)] = summary
        print(f"\n{size}x{size}: ideal 1f1b / naive {ideal:.2f}; micro-batch efficiency x{mb_efficiency:.2f} "
              f"(profile: {cost[1]:.1f} ms for {GLOBAL_BATCH} samples, {cost[m]:.1f} ms for {GLOBAL_BATCH // m})")
        for case in plans:
            if case == "naive":
                continue
            r = summary[case]
            step_ms = GLOBAL_BATCH / r["samples_per_s"] * 1e3
            print(f"  {case:<10} step {step_ms:.0f} ms, simulated {r['predicted_step_ms']:.0f} "
                  f"(x{r['predicted_step_ms'] / step_ms:.2f}); "
                  f"/ naive measured {r['over_naive']:.2f}, simulated {r['predicted_over_naive']:.2f}; "
                  f"compute x{r['compute_over_profile']:.2f} of the profile (naive x"
                  f"{summary['naive']['compute_over_profile']:.2f}); "
                  f"partition {r['partition']} imbalance x{r['imbalance']:.2f}, micro-batch efficiency by stage "
                  + " / ".join(f"x{e:.2f}" for e in r["stage_microbatch_efficiency"])
                  + f" -> ideal after efficiency and imbalance {r['ideal_after_efficiency_and_imbalance']:.2f}; "
                  + "stage passes: micro-batches / whole batch "
                  + " / ".join(f"x{e:.2f}" for e in r["stage_pass_efficiency"])
                  + f" -> ideal {r['ideal_from_stage_passes']:.2f}")
        print(f"  async / 1f1b: {summary['async_over_1f1b']:.2f} (uniform), {summary['async_over_1f1b-ampa']:.2f} "
              f"(AMPA)\n", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
