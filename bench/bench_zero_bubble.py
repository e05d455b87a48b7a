"""Zero-bubble schedules against 1F1B and against torch's own, measured on two ranks.

Problem. ZB-H1 should beat 1F1B by moving the weight gradients (W) into the
bubbles; on uniform stages the ideal is ``(m + p - 1)(F + I + W) / (m (F + I +
W) + (p - 1)(F + I - W))``, 15/13 = 1.15 for p = 2, m = 4, F = I = W. Whether
a CPU gets there depends on what the split backward costs here: the
input-gradient pass and the weight pass against one fused backward.

Approach. ResNet-18 at 96x96, global batch 64, 4 micro-batches, two ranks
(one core each), synthetic data; 1F1B, ZB-H1, ZB-H2 and the automatic
schedule on AMPA's 2-stage cut, ZB-V and DualPipeV (ours and torch's) on
AMPA's 4-stage cut. AMPA balances the cut for 1F1B, so 1F1B, ZB-H1 and ZB-H2 also run
at the 2-stage cut the simulator finds fastest for each from the same profile
(``1f1b-best``, ``zbh1-best``, ``zbh2-best``: each schedule at its best). Runs are interleaved
per repeat (the order reversed every other repeat); throughput is samples
over the summed step times after ``WARMUP`` steps; ratios are taken within
a repeat and their median is reported. From the runs' own events:

* the ideal ZB-H1 / 1F1B ratio from the runs' measured times of their slower
  stage (the formulas above with ZB-H1's F, I and W against 1F1B's F and
  B), and the same with ZB-H1's I + W standing for B (the ideal if the
  split cost nothing);
* the split backward's cost: I + W of the ZB-H1 run against B of the 1F1B
  run, per stage;
* the simulator's step from the run's measured stage times, against the
  measured step (``scheduling.from_config.predict_from_measured``); both
  from the steps after the warm-up.

    .venv/bin/python bench/bench_zero_bubble.py [--repeats 3] [--size 96] [--microbatches 4] [--steps 10]

Writes ``bench/results/zero_bubble.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from workbench.core.config import RunConfig, merge_changes
from workbench.core.timeline import Timeline
from workbench.jobs import LaunchSpec, launch
from workbench.planning.partitioning.ampa import ampa
from workbench.profiling import profile
from workbench.runtime.events import load_measured_timeline, read_events
from workbench.scheduling.from_config import predict_from_measured
from workbench.scheduling.stagecosts import StageCosts

RESULTS = Path(__file__).resolve().parent / "results" / "zero_bubble.json"
WARMUP = 3
STAGES = 2


def model_fields(size: int, batch: int) -> dict:
    return {"model": {"name": "resnet18", "overrides": {"image_size": size, "num_classes": 10}},
            "data": {"kind": "synthetic"},
            "training": {"global_batch": batch, "optimizer": {"name": "sgd", "lr": 0.01}}}


def cuts(size: int, batch: int, m: int) -> dict:
    """AMPA's partitions into 2 and 4 stages, from a profile at the micro-batch size; and the 2-stage cut each of
    1F1B and ZB-H1 runs fastest on by the simulator from the same profile (each schedule at its best)."""
    from workbench.models import build_model

    model = build_model("resnet18", image_size=size, num_classes=10)
    costs = profile(model, batch=batch // m, progress=False)
    out: dict = {s: str(ampa(costs, s, num_microbatches=m, batch_size=batch).partition) for s in (2, 4)}
    out.update({f"best-{kind}": best_cut(costs, kind, m, batch // m) for kind in ("1f1b", "zbh1", "zbh2")})
    return out


def best_cut(costs, kind: str, m: int, microbatch: int) -> str:
    """The 2-stage cut whose simulated iteration of ``kind`` is the shortest (ties: the earlier cut)."""
    from workbench.core.partition import Partition
    from workbench.planning import load_cluster
    from workbench.scheduling import generators
    from workbench.scheduling.simulate import simulate
    from workbench.scheduling.stagecosts import StageCosts
    from workbench.scheduling.zero_bubble import zb_h1, zb_h2

    build = {"1f1b": generators.one_f_one_b, "zbh1": zb_h1, "zbh2": zb_h2}[kind]
    cluster, n = load_cluster("local-cpu"), costs.num_layers

    def iteration_ms(cut: int) -> float:
        part = Partition.parse(f"0-{cut - 1}|{cut}-{n - 1}")
        stage_costs = StageCosts.from_model(costs, part, microbatch)
        return simulate(build(STAGES, m), stage_costs, cluster).metrics["iteration_ms"]

    best = min(range(1, n), key=iteration_ms)
    return f"0-{best - 1}|{best}-{n - 1}"


def cases(m: int, part: dict) -> dict[str, str]:
    two, four = part[2], part[4]
    return {"1f1b": f"pp{STAGES}-1f1b-m{m}@{two}", "zbh1": f"pp{STAGES}-zbh1-m{m}@{two}",
            "1f1b-best": f"pp{STAGES}-1f1b-m{m}@{part['best-1f1b']}",
            "zbh1-best": f"pp{STAGES}-zbh1-m{m}@{part['best-zbh1']}",
            "zbh2-best": f"pp{STAGES}-zbh2-m{m}@{part['best-zbh2']}",
            "zbh2": f"pp{STAGES}-zbh2-m{m}@{two}", "zbauto": f"pp{STAGES}-zbauto-m{m}@{two}",
            "zbv": f"pp{STAGES}-zbv-m{m}@{four}", "torch-zbv": f"torchpp{STAGES}-zbv-m{m}@{four}",
            "dualpipev": f"pp{STAGES}-dualpipev-m{m}@{four}",
            "torch-dualpipev": f"torchpp{STAGES}-dualpipev-m{m}@{four}"}


def run(root: str, fields: dict, case: str, plan: str, steps: int) -> dict:
    config = merge_changes(fields, {"name": f"zb-{case}", "plan": plan, "training": {"steps": steps, "seed": 0},
                                    "events": {"stage_events": True, "heartbeat_s": 5.0}})
    job = launch(LaunchSpec(config=config, name=f"zb-{case}", run_root=root))
    state = job.wait(timeout=1200).state
    if state != "SUCCEEDED":
        raise RuntimeError(f"{case}: the run ended {state}; see {job.run_dir}")
    steps_ = [e for e in read_events(job.run_dir, 0) if e["kind"] == "step" and e["step"] > WARMUP]
    step_ms = statistics.median(e["step_ms"] for e in steps_)
    batch = fields["training"]["global_batch"]
    out = {"plan": plan, "samples_per_s": len(steps_) * batch / (sum(e["step_ms"] for e in steps_) / 1e3),
           "step_ms": step_ms, "load_avg_1m": os.getloadavg()[0]}
    if not plan.startswith("torchpp"):
        measured = load_measured_timeline(job.run_dir)  # the steps the throughput counts: after the warm-up
        timeline = Timeline(tuple(e for e in measured if (e.iteration or 0) >= WARMUP), measured.meta)
        out["stage_ms"] = stage_means(timeline)
        start = next(e for e in read_events(job.run_dir, 0) if e["kind"] == "start")
        used = StageCosts(**start["stage_costs"]) if start.get("stage_costs") else None  # zb-auto's own costs
        predicted = predict_from_measured(RunConfig.from_json(job.run_dir / "config.json"), timeline,
                                          schedule_costs=used)
        out["simulated_step_ms"] = predicted.metrics["iteration_ms"]
    return out


def stage_means(timeline) -> dict[str, dict[str, float]]:
    """Per stage, the mean duration of each compute op the run recorded (from iteration WARMUP on)."""
    samples: dict[tuple[int, str], list[float]] = {}
    for e in timeline.events:
        if e.op in ("F", "B", "I", "W") and e.iteration >= WARMUP:
            samples.setdefault((e.stage, e.op), []).append(e.end - e.start)
    out: dict[str, dict[str, float]] = {}
    for (stage, op), values in sorted(samples.items()):
        out.setdefault(str(stage), {})[op] = statistics.fmean(values)
    return out


def ideal_zb_over_1f1b(zb_ms: dict[str, dict[str, float]], whole_ms: dict[str, dict[str, float]] | None,
                       m: int) -> float:
    """The uniform-stage formulas with the slower stage's measured times: ZB-H1's F, I and W, and 1F1B's own F
    and B when ``whole_ms`` is given (else I + W stands for B: the ideal if splitting cost nothing)."""
    slow = max(zb_ms.values(), key=lambda t: t["F"] + t["I"] + t["W"])
    f, i, w = slow["F"], slow["I"], slow["W"]
    if whole_ms is None:
        one_f_one_b = (m + STAGES - 1) * (f + i + w)
    else:
        one_f_one_b = (m + STAGES - 1) * max(t["F"] + t["B"] for t in whole_ms.values())
    return one_f_one_b / (m * (f + i + w) + (STAGES - 1) * (f + i - w))


def interleaved(plans: dict[str, str], fields: dict, steps: int, repeats: int, prefix: str) -> list[dict[str, dict]]:
    """Every case of ``plans`` (name -> plan) run once per repeat, the order reversed every other repeat; per
    repeat, each case's :func:`run` record."""
    rows = []
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        for rep in range(repeats):
            row = {}
            for case, plan in (list(plans.items()) if rep % 2 == 0 else list(plans.items())[::-1]):
                row[case] = run(root, fields, case, plan, steps)
                sim = row[case].get("simulated_step_ms")
                print(f"  repeat {rep} {case:<16} {row[case]['samples_per_s']:8.1f} samples/s  step "
                      f"{row[case]['step_ms']:8.1f} ms" + (f"  simulated {sim:8.1f} ms" if sim else ""), flush=True)
            rows.append(row)
    return rows


def ratio(rows: list[dict[str, dict]], a: str, b: str) -> dict:
    """Case ``a``'s samples/s over case ``b``'s within each repeat: the median and every repeat's."""
    values = [r[a]["samples_per_s"] / r[b]["samples_per_s"] for r in rows]
    return {"median": statistics.median(values), "runs": values}


def summarise(rows: list[dict[str, dict]], m: int) -> dict:
    """Every ratio (all cases ran), the ideal ZB-H1 / 1F1B from the stage passes, the split backward's cost and
    the simulator's step over the measured one."""
    out = {**partial_summary(rows),
           "ideal_zbh1_over_1f1b_free_split": statistics.median(ideal_zb_over_1f1b(r["zbh1"]["stage_ms"], None, m)
                                                                 for r in rows),
           "ideal_zbh1_over_1f1b": statistics.median(ideal_zb_over_1f1b(r["zbh1"]["stage_ms"], r["1f1b"]["stage_ms"], m)
                                                     for r in rows)}
    split = []
    for r in rows:
        for stage, times in r["zbh1"]["stage_ms"].items():
            whole = r["1f1b"]["stage_ms"].get(stage, {}).get("B")
            if whole:
                split.append((times["I"] + times["W"]) / whole)
    out["split_backward_over_fused"] = {"median": statistics.median(split), "runs": split}
    out["simulated_over_measured"] = {case: statistics.median(r[case]["simulated_step_ms"] / r[case]["step_ms"]
                                                              for r in rows)
                                      for case in rows[0] if "simulated_step_ms" in rows[0][case]}
    return out


def partial_summary(rows: list[dict[str, dict]]) -> dict:
    """The ratios whose two cases ran (``--only``)."""
    pairs = {"zbh1_over_1f1b": ("zbh1", "1f1b"), "zbh2_over_zbh1": ("zbh2", "zbh1"),
             "zbh1_over_1f1b_each_at_its_best_cut": ("zbh1-best", "1f1b-best"),
             "zbh2_over_zbh1_each_at_its_best_cut": ("zbh2-best", "zbh1-best"),
             "zbauto_over_zbh1": ("zbauto", "zbh1"), "zbv_ours_over_torch": ("zbv", "torch-zbv"),
             "dualpipev_ours_over_torch": ("dualpipev", "torch-dualpipev")}
    return {key: ratio(rows, a, b) for key, (a, b) in pairs.items() if a in rows[0] and b in rows[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", default="", help="comma-separated case names (default: all); the summary then "
                        "has the ratios whose two cases ran")
    args = parser.parse_args()
    m = args.microbatches
    part = cuts(args.size, args.batch, m)
    plans = cases(m, part)
    if args.only:
        plans = {k: v for k, v in plans.items() if k in args.only.split(",")}
    print(f"resnet18 {args.size}x{args.size}, batch {args.batch}, m={m}; AMPA's cuts and each schedule's best "
          f"simulated 2-stage cut: {part}", flush=True)
    rows = interleaved(plans, model_fields(args.size, args.batch), args.steps, args.repeats, "bench-zb-")
    summary = summarise(rows, m) if len(plans) == len(cases(m, part)) else partial_summary(rows)
    for key, value in summary.items():
        print(f"{key}: {json.dumps(value)}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"size": args.size, "batch": args.batch, "microbatches": m, "partitions": part,
                                   "repeats": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
