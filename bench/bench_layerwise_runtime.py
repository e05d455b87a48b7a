"""Per-layer plans run for real on 4 CPU ranks: predicted vs measured iteration time and memory.

A small GPT-2 (gpt2-tiny, 4 blocks of width 128, a 4096-token vocabulary,
sequences of 64, global batch 16, Adam) runs four mixed per-layer plans
under torchrun through the Layerwise runtime: two without a pipeline and
two as a 1F1B pipeline of two stages, mixing replicated (DDP), fully
sharded (FSDP), zero2, 2-way tensor-parallel and recomputed layers.

Each round profiles the model in one process, runs a plain ``dp4`` job as
the compute calibration and a ``dp4-fsdp`` job that fixes the layer-by-layer
runtime's per-call collective cost (:func:`~workbench.planning.costs.run_calibration.fit_call_ms`;
neither is one of the compared plans), and predicts each
plan with the per-layer cost model on the ``local`` cluster: the profile's
compute scaled by the calibration and by the cores' time sharing (with the
processes runnable at planning time as background), then
:func:`~workbench.planning.strategy.hybrid.cost_plan`. Measured: the median time
between steps on rank 0 after the warm-up steps, and the runtime's own
memory count (``memory.counted_bytes`` of each step event: parameters,
gathered parameters, gradients and optimizer state held by the rank, plus the
peak of the saved activations), its largest value on any rank after
warm-up against the planner's fullest device (and per pipeline stage).

Mixing wins: under a memory cap set just above (1%) a mixed plan's counted
memory, every uniform plan of the same 4-rank data-parallel mesh (DDP, zero2
and FSDP, each with and without recomputation) either exceeds the cap by the
measured count or runs slower. Two mixes: ``dp4-L[0=fsdp;1-4=ddp.rc;5=fsdp.rc]``
(the parameter-heavy embeddings and head fully sharded, the head recomputed;
the blocks, heavy in activations and light in parameters, replicated and
recomputed: chosen before measuring, by what each layer holds), and the same
with the first block not recomputed (chosen after the first ran level with
``dp4-zero2-rc``). The uniform DDP plans run in
the DDP runtime, which does not count memory: their count is bounded from
below by their parameters, gradients and Adam state (known exactly) plus the
saved activations the FSDP run measured at the same batch per rank.

Prints both tables, writes ``bench/results/layerwise_runtime.json``.
``--rounds N`` repeats the measurements (median over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "layerwise_runtime.json"
MODEL = "gpt2-tiny"
OVERRIDES = {"n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 4096}
BATCH, SEQ, STEPS, WARMUP = 16, 64, 9, 3
CALIBRATION = "dp4"
# one uniform plan of the layer-by-layer runtime, not among the compared plans: fixes its per-call collective cost
CALL_CALIBRATION = "dp4-fsdp"
PLANS = [
    "tp1d-2-dp2-L[0=fsdp;1-2=ddp.tp1d2;3-4=fsdp.rc;5=zero2]",
    "tp1d-2-dp2-m2-L[0=ddp;1=fsdp.tp1d2.rc;2-3=zero2;4=ddp.rc;5=fsdp]",
    "pp2-1f1b-m4-tp1d2-L[0=ddp;1=ddp.tp1d2;2=fsdp;3=zero2.rc;4=fsdp.tp1d2;5=ddp]",
    "pp2-1f1b-m4-tp1d2-L[0=fsdp;1-2=ddp.rc;3-4=ddp.tp1d2;5=fsdp]",
]
# mixed plans of the 4-rank data-parallel mesh, each compared with every uniform plan under a cap just above it:
# the first chosen before any measurement (every block recomputed); the second, chosen after the first ran level
# with dp4-zero2-rc, keeps the first block's activations instead of recomputing it
MIXES = ["dp4-L[0=fsdp;1-4=ddp.rc;5=fsdp.rc]", "dp4-L[0=fsdp;1=ddp;2-4=ddp.rc;5=fsdp.rc]"]
CAP_MARGIN = 1.01  # the cap: the mix's counted memory plus 1%
UNIFORM = ["dp4", "dp4-rc", "dp4-zero2", "dp4-zero2-rc", "dp4-fsdp", "dp4-fsdp-rc"]
TIME_TARGET, MEMORY_TARGET = 0.20, 0.15


# -- runs ---------------------------------------------------------------------------------------------------------

def _config(plan: str):
    from workbench.core.config import RunConfig

    return RunConfig.from_dict({"model": {"name": MODEL, "overrides": OVERRIDES}, "plan": plan,
                                "data": {"kind": "bytes-lm", "seq_len": SEQ},
                                "training": {"global_batch": BATCH, "steps": STEPS,
                                             "optimizer": {"name": "adam", "lr": 1e-3}},
                                "events": {"stage_events": True, "heartbeat_s": 5.0}})


def _run(plan: str, root: Path):
    from workbench.jobs import LaunchSpec, launch

    config = _config(plan)
    name = "lw-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in plan)[:50]
    job = launch(LaunchSpec(config=config, nproc_per_node=config.world_size, name=name, run_root=str(root)))
    state = job.wait(timeout=500).state
    if state != "SUCCEEDED":
        raise RuntimeError(f"{plan}: run in {job.run_dir} ended {state}")
    return job


def _iteration_ms(job) -> float:
    frame = job.metrics()
    t = sorted(frame[frame["rank"] == 0].set_index("step")["t"].items())
    return statistics.median((b - a) * 1e3 for (step, a), (_, b) in zip(t, t[1:]) if step >= WARMUP)


def _memory(run_dir: Path, world: int) -> dict[int, dict] | None:
    """Per rank, the step report with the largest count after warm-up (None when the runtime counts nothing)."""
    from workbench.runtime.events import read_events

    out = {}
    for rank in range(world):
        steps = [e["memory"] for e in read_events(run_dir, rank)
                 if e["kind"] == "step" and e["step"] > WARMUP and "memory" in e]
        if not steps:
            return None
        out[rank] = max(steps, key=lambda m: m["counted_bytes"])
    return out


def _stage_of(plan, rank: int) -> int:
    return rank // (plan.dp * plan.tp) if plan.pp > 1 else 0


def _profile():
    import torch

    from workbench.models import build_model
    from workbench.profiling import profile

    torch.set_num_threads(1)
    return profile(build_model(MODEL, **OVERRIDES), batch=BATCH // 2, repeats=5, cache=False, progress=False)


def _predict(costs, k: float, background: float, plan: str, call_ms: float | None = None):
    """The per-layer cost model's plan; ``call_ms``: the per-step cost of a collective (default: the cluster's)."""
    from dataclasses import replace

    from workbench.planning.costs.compute_scaling import scale_compute
    from workbench.planning.costs.clusters import load_cluster
    from workbench.planning.costs.estimate import cost_context
    from workbench.planning.strategy.hybrid import cost_plan

    ctx = cost_context(costs, load_cluster("local"), BATCH, world_size=4, background_load=background)
    spec = ctx.cluster if call_ms is None else replace(ctx.cluster, collective_call_ms=call_ms)
    return cost_plan(scale_compute(costs, k * ctx.compute_scale(4)), spec, BATCH, plan, optimizer="adam")


def _states_lower_bound(num_params: int) -> int:
    """Parameters, gradients and Adam's two moments in fp32: what any data-parallel replica holds at least."""
    return 4 * 4 * num_params


def one_round(rep: int, root: Path, plans: list[str]) -> dict:
    from bench_planner import runnable_now

    from workbench.core.plan import ParallelPlan
    from workbench.planning import calibrate_from_run
    from workbench.planning.costs.run_calibration import fit_call_ms

    costs = _profile()
    background = runnable_now()
    cal_job = _run(CALIBRATION, root)
    k = calibrate_from_run(costs, cal_job.run_dir, cluster="local", background_load=background,
                           warmup=WARMUP).compute_scale
    cal_ms = _iteration_ms(cal_job)
    print(f"round {rep}: background {background:.2f}, compute calibrated x{k:.3f} from {CALIBRATION} "
          f"({cal_ms:.1f} ms)", flush=True)
    call_job = _run(CALL_CALIBRATION, root)
    call_measured = _iteration_ms(call_job)
    call_ms = fit_call_ms(lambda x: _predict(costs, k, background, CALL_CALIBRATION, x).iteration_ms, call_measured)
    print(f"  per-call cost of the layer-by-layer runtime's collectives: {call_ms:.2f} ms a step, from "
          f"{CALL_CALIBRATION} ({call_measured:.1f} ms)", flush=True)
    rows = {}
    for name in plans:
        plan = ParallelPlan.parse(name)
        predicted = _predict(costs, k, background, name, call_ms)
        compute_only = _predict(costs, k, background, name)
        job = call_job if name == CALL_CALIBRATION else _run(name, root)
        measured = _memory(job.run_dir, plan.world_size)
        b = predicted.breakdown()
        row = {"predicted_ms": predicted.iteration_ms, "measured_ms": _iteration_ms(job),
               "predicted_compute_only_ms": compute_only.iteration_ms,
               "predicted_memory_bytes": predicted.memory_bytes,
               "predicted_stage_memory_bytes": [g * 2**30 for g in b["stage_memory_gib"]],
               "run_dir": str(job.run_dir)}
        if measured is not None:
            row["measured_memory_bytes"] = max(m["counted_bytes"] for m in measured.values())
            stages: dict[int, int] = {}
            for rank, m in measured.items():
                s = _stage_of(plan, rank)
                stages[s] = max(stages.get(s, 0), m["counted_bytes"])
            row["measured_stage_memory_bytes"] = [stages[s] for s in sorted(stages)]
            row["measured_parts"] = {key: max(m[key] for m in measured.values())
                                     for key in ("params_bytes", "unsharded_params_bytes", "grads_bytes",
                                                 "optimizer_bytes", "activations_peak_bytes")}
        rows[name] = row
        print(f"  {name:75s} predicted {row['predicted_ms']:7.1f} ms measured {row['measured_ms']:7.1f} ms; "
              f"memory predicted {row['predicted_memory_bytes'] / 2**20:6.2f} MiB measured "
              f"{row.get('measured_memory_bytes', float('nan')) / 2**20:6.2f} MiB", flush=True)
    return {"background": background, "compute_scale": k, "calibration_ms": cal_ms, "call_ms": call_ms,
            "call_calibration_ms": call_measured, "rows": rows}


def _median_rows(rounds: list[dict], names: list[str]) -> dict:
    out = {}
    for name in names:
        rows = [r["rows"][name] for r in rounds]
        row = {key: statistics.median(r[key] for r in rows)
               for key in ("predicted_ms", "measured_ms", "predicted_memory_bytes", "predicted_compute_only_ms")}
        row["measured_ms_rounds"] = [r["measured_ms"] for r in rows]
        row["predicted_stage_memory_bytes"] = rows[0]["predicted_stage_memory_bytes"]
        if "measured_memory_bytes" in rows[0]:
            row["measured_memory_bytes"] = statistics.median(r["measured_memory_bytes"] for r in rows)
            row["measured_stage_memory_bytes"] = rows[-1]["measured_stage_memory_bytes"]
            row["measured_parts"] = rows[-1]["measured_parts"]
            row["memory_error"] = row["predicted_memory_bytes"] / row["measured_memory_bytes"] - 1
        row["time_error"] = row["predicted_ms"] / row["measured_ms"] - 1
        out[name] = row
    return out


def mixing_wins(table: dict, num_params: int, mixed_name: str) -> dict:
    """The cap just above the mixed plan's count; each uniform plan: over the cap, or slower, or neither."""
    mixed = table[mixed_name]
    cap = mixed["measured_memory_bytes"] * CAP_MARGIN
    activations = table["dp4-fsdp"]["measured_parts"]["activations_peak_bytes"]  # same batch per rank
    verdicts = {}
    for name in UNIFORM:
        row = table[name]
        if "measured_memory_bytes" in row:
            memory, how = row["measured_memory_bytes"], "counted"
        else:
            memory = _states_lower_bound(num_params) + (0 if name.endswith("-rc") else activations)
            how = "lower bound"
        over, slower = memory > cap, row["measured_ms"] > mixed["measured_ms"]
        verdicts[name] = {"memory_bytes": memory, "memory": how, "over_cap": over, "slower": slower,
                          "measured_ms": row["measured_ms"], "beaten": over or slower}
    return {"mixed": mixed_name, "cap_bytes": cap, "mixed_ms": mixed["measured_ms"],
            "mixed_ms_rounds": mixed["measured_ms_rounds"],
            "mixed_memory_bytes": mixed["measured_memory_bytes"], "uniform": verdicts,
            "mixing_wins": all(v["beaten"] for v in verdicts.values())}


def _mib(x: float) -> str:
    return f"{x / 2**20:.2f}"


def markdown(result: dict) -> str:
    lines = ["| plan | predicted ms | measured ms | time error | without the call cost | planner MiB (per stage) "
             "| counted MiB (per stage) | memory error |", "|---|---|---|---|---|---|---|---|"]
    for name, row in result["plans"].items():
        lines.append(f"| `{name}` | {row['predicted_ms']:.1f} | {row['measured_ms']:.1f} | "
                     f"{row['time_error'] * 100:+.0f}% | "
                     f"{(row['predicted_compute_only_ms'] / row['measured_ms'] - 1) * 100:+.0f}% | "
                     f"{_mib(row['predicted_memory_bytes'])} "
                     f"({', '.join(_mib(x) for x in row['predicted_stage_memory_bytes'])}) | "
                     f"{_mib(row['measured_memory_bytes'])} "
                     f"({', '.join(_mib(x) for x in row['measured_stage_memory_bytes'])}) | "
                     f"{row['memory_error'] * 100:+.0f}% |")
    for win in result["mixing"]:
        lines += ["", f"Cap {_mib(win['cap_bytes'])} MiB per rank; mixed `{win['mixed']}`: "
                      f"{win['mixed_ms']:.1f} ms, {_mib(win['mixed_memory_bytes'])} MiB counted.", "",
                  "| uniform plan | measured ms | MiB | over the cap | slower |", "|---|---|---|---|---|"]
        for name, v in win["uniform"].items():
            lines.append(f"| `{name}` | {v['measured_ms']:.1f} | {_mib(v['memory_bytes'])} ({v['memory']}) | "
                         f"{'yes' if v['over_cap'] else 'no'} | {'yes' if v['slower'] else 'no'} |")
        lines.append(f"\nMixing wins: {'yes' if win['mixing_wins'] else 'no'}.")
    return "\n".join(lines)


def main(rounds: int) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(HERE))
    from workbench.models import build_model

    num_params = sum(p.numel() for p in build_model(MODEL, **OVERRIDES).parameters())
    root = HERE.parent / "runs" / "bench-layerwise-runtime" / time.strftime("%Y%m%d-%H%M%S")
    names = PLANS + MIXES + UNIFORM
    per_round = [one_round(rep, root, names) for rep in range(rounds)]
    table = _median_rows(per_round, names)
    result = {"model": MODEL, "overrides": OVERRIDES, "global_batch": BATCH, "seq_len": SEQ, "steps": STEPS,
              "warmup": WARMUP, "rounds": per_round, "load_avg_1m": os.getloadavg()[0],
              "plans": {n: table[n] for n in PLANS}, "mixing": [mixing_wins(table, num_params, m) for m in MIXES],
              "others": {n: table[n] for n in MIXES + UNIFORM}}
    hits = {n: (abs(r["time_error"]) <= TIME_TARGET, abs(r["memory_error"]) <= MEMORY_TARGET)
            for n, r in result["plans"].items()}
    result["targets"] = {"time": TIME_TARGET, "memory": MEMORY_TARGET, "met": hits}
    print(markdown(result))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    main(parser.parse_args().rounds)
