"""Async pipeline vs 1F1B vs GPipe vs naive model parallelism, measured and simulated, on 4 CPU ranks.

Each case runs for real under torchrun (4 stages, 4 ranks, gloo), tiny GPT-2
on byte-LM data and the VGG-style model on digits: ``async`` (1F1B with no
flush, weight stashing), ``1f1b`` and ``gpipe`` (4 micro-batches, flush per
step) and ``naive`` (the same global batch as one micro-batch: plain model
parallelism, one stage busy at a time). Cases are interleaved within each
repeat (A B C D A B C D ...), and each repeat's throughput ratios are taken
between runs of that repeat; medians over repeats are reported with the
load average at the time.

Per run: throughput over the steps after ``WARMUP`` (samples / sum of step
times), the steady-state bubble from the measured events (1 - F/B time /
window, per rank, mean over ranks, window = from the first event of
iteration ``WARMUP`` to the last event), and the simulator's prediction of
both from the run's own measured per-stage times on the ``local-cpu`` links,
the 4 ranks sharing the machine's cores (processor sharing: measured times
turned back into solo times, then shared again by the simulator).
For ``async``, peak memory per stage (saved activations + stashed weight
versions, measured by the runtime) next to the memory model's prediction
from a profile at the micro-batch size.

Writes ``bench/results/async.json``.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from workbench.core.config import RunConfig, merge_changes
from workbench.core.partition import Partition
from workbench.core.plan import AsyncPipeline
from workbench.core.timeline import Timeline
from workbench.jobs import LaunchSpec, launch
from workbench.planning.costs.clusters import core_sharing, get_cluster
from workbench.runtime.events import read_events
from workbench.scheduling import generators, schedule_for
from workbench.scheduling.from_config import stage_costs_from_timeline
from workbench.scheduling.memory import memory_breakdown
from workbench.scheduling.simulate import simulate

REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
STEPS, WARMUP = 8, 2
MODELS = {
    "gpt2-tiny": {"model": "gpt2-tiny", "data": {"kind": "bytes-lm", "seq_len": 32},
                  "training": {"global_batch": 16, "optimizer": {"name": "adam", "lr": 0.003}}},
    "vgg-tiny": {"model": "vgg-tiny", "data": {"kind": "digits"},
                 "training": {"global_batch": 32, "optimizer": {"name": "sgd", "lr": 0.02, "momentum": 0.9}}},
}
CASES = {  # plans on 4 stages
    "async": {"plan": "async-1x4-m4-if4"},
    "1f1b": {"plan": "pp4-1f1b-m4"},
    "gpipe": {"plan": "pp4-gpipe-m4"},
    "naive": {"plan": "pp4-gpipe-m1"},
}


def schedule_of(config: RunConfig):
    """The whole run's schedule: the async stream, or the flushed pipeline once per step (one group)."""
    plan = config.plan
    if isinstance(plan.pipeline, AsyncPipeline):
        return schedule_for(plan, num_iterations=config.training.steps)
    return generators.gropipe(1, plan.pp, plan.microbatches, inner=plan.pipeline.kind,
                              num_iterations=config.training.steps)


def steady_bubble(timeline: Timeline, first_iteration: int) -> float:
    """Mean over ranks of 1 - F/B time / window, the window from iteration ``first_iteration``'s first event."""
    events = [e for e in timeline.events if e.iteration >= first_iteration]
    start, end = min(e.start for e in events), max(e.end for e in events)
    bubbles = []
    for rank in sorted({e.rank for e in events}):
        busy = sum(min(e.end, end) - max(e.start, start) for e in events if e.rank == rank and e.op in ("F", "B"))
        bubbles.append(1 - busy / (end - start))
    return statistics.mean(bubbles)


def throughput(run_dir: Path, config: RunConfig) -> float:
    steps = [e for e in read_events(run_dir, 0) if e["kind"] == "step" and e["step"] > WARMUP]
    return len(steps) * config.training.global_batch / (sum(e["step_ms"] for e in steps) / 1e3)


def predicted_memory(config: RunConfig) -> list[dict[str, int]]:
    """The memory model's per-stage peak for the run's schedule, activations and weights from a profile."""
    from workbench.models import build_model, sample_batch
    from workbench.profiling import profile
    from workbench.scheduling.stagecosts import StageCosts

    model = build_model(config.model.name, seed=config.training.seed, **config.model.overrides)
    microbatch = config.training.global_batch // config.plan.microbatches
    if config.data.kind == "bytes-lm":
        from workbench.models.data import bytes_lm_batches

        batch = next(bytes_lm_batches(microbatch, config.data.seq_len, seed=0))
    else:
        batch = sample_batch(model, microbatch, seed=0)
    costs = profile(copy.deepcopy(model), batch, device="cpu", progress=False, cache=False)
    optimizer = "adam" if config.training.optimizer.name == "adam" else "sgd-momentum"
    stage_costs = StageCosts.from_model(costs, Partition.uniform(len(model), config.plan.pp), microbatch,
                                        optimizer=optimizer)
    return memory_breakdown(schedule_of(config), stage_costs)


def run_case(root: str, model: str, case: str) -> dict:
    fields = merge_changes({**MODELS[model], **CASES[case], "name": f"{model}-{case}"},
                           {"training": {"steps": STEPS, "seed": 0}})
    job = launch(LaunchSpec(config=fields, name=f"{model}-{case}", run_root=root))
    state = job.wait(timeout=600).state
    if state != "SUCCEEDED":
        raise RuntimeError(f"{model} {case}: run ended {state}; see {job.run_dir}")
    config = RunConfig.from_json(job.run_dir / "config.json")
    measured = job.timeline()
    cluster = get_cluster("local-cpu")
    sharing = core_sharing(cluster)  # the 4 ranks share the machine's cores
    costs = stage_costs_from_timeline(measured, config.plan.pp, sharing)
    predicted = simulate(schedule_of(config), costs, cluster, sharing=sharing)
    measured_step_ms = config.training.global_batch / throughput(job.run_dir, config) * 1e3
    row = {"samples_per_s": throughput(job.run_dir, config), "step_ms": measured_step_ms,
           "predicted_step_ms": predicted.metrics["iteration_ms"],
           "bubble": steady_bubble(measured, WARMUP), "predicted_bubble": steady_bubble(predicted.timeline, WARMUP),
           "load_avg_1m": os.getloadavg()[0], "run_dir": str(job.run_dir)}
    if case == "async":
        reports = [json.loads((job.run_dir / "memory" / f"rank{r}.json").read_text()) for r in range(4)]
        model_rows = predicted_memory(config)
        row["memory"] = [{"stage": r["stage"], "measured_activations": r["activations"],
                          "measured_stashed": r["stashed_weights"], "measured_versions": r["versions"],
                          "predicted_activations": p["activations"], "predicted_stashed": p["stashed_weights"]}
                         for r, p in zip(reports, model_rows)]
    return row


def main() -> int:
    root = tempfile.mkdtemp(prefix="bench-async-")
    runs: dict[str, dict[str, list[dict]]] = {m: {c: [] for c in CASES} for m in MODELS}
    for rep in range(REPEATS):
        for model in MODELS:
            for case in CASES:
                row = run_case(root, model, case)
                runs[model][case].append(row)
                print(f"rep {rep} {model:<9} {case:<6} {row['samples_per_s']:8.1f} samples/s  bubble "
                      f"{row['bubble']:.3f} (sim {row['predicted_bubble']:.3f})  step {row['step_ms']:.1f} ms "
                      f"(sim {row['predicted_step_ms']:.1f})  load {row['load_avg_1m']:.1f}", flush=True)
    result = {"repeats": REPEATS, "steps": STEPS, "warmup": WARMUP, "models": {}}
    for model, cases in runs.items():
        summary = {}
        for case, rows in cases.items():
            summary[case] = {key: statistics.median(r[key] for r in rows) for key in
                             ("samples_per_s", "step_ms", "predicted_step_ms", "bubble", "predicted_bubble",
                              "load_avg_1m")}
        for peer in ("1f1b", "gpipe", "naive"):
            summary[f"async_over_{peer}"] = statistics.median(
                a["samples_per_s"] / b["samples_per_s"] for a, b in zip(cases["async"], cases[peer]))
        summary["async_memory"] = cases["async"][-1]["memory"]
        summary["runs"] = cases
        result["models"][model] = summary
        print(f"\n{model}: async / 1f1b {summary['async_over_1f1b']:.2f}, async / gpipe "
              f"{summary['async_over_gpipe']:.2f}, async / naive {summary['async_over_naive']:.2f}")
        for row in summary["async_memory"]:
            print(f"  stage {row['stage']}: activations {row['measured_activations'] / 1e3:.1f} kB (model "
                  f"{row['predicted_activations'] / 1e3:.1f}), stashed {row['measured_stashed'] / 1e3:.1f} kB (model "
                  f"{row['predicted_stashed'] / 1e3:.1f}), versions {row['measured_versions']}")
    out = Path(__file__).resolve().parent / "results" / "async.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
