"""Predictions that follow the micro-batch size: the planner's ranking of five plans against real runs.

The case (the issue's): ``vgg-tiny`` with ``fc_width=4096`` (two 4096-wide
fully connected layers: weight-bound at small micro-batches), global batch
64, on the ``local`` cluster (gloo processes time-sharing this machine's
cores). Five plans: one rank alone (``dp1``), ``dp4``, and GroPipe on 2
groups of 2 stages with 2 or 4 micro-batches a step and a delayed (d1) or
immediate (d0) gradient all-reduce. Their micro-batches run from 8 samples
(GroPipe m4: 64 / 2 groups / 4) to 64 (one rank). One more plan is measured
beside them (``EXTRA``): the one the full search at ``--world-size 4`` ranks
first on this machine, to check its note on fewer ranks.

Each round first runs the full search on a fresh profile (what ``workbench
plan vgg-tiny --model-arg fc_width=4096 --cluster local --batch 64
--world-size 4`` prints: its top plans and notes). Then, for each plan in
turn (the order alternating between rounds), it takes the processes runnable
besides the benchmark (``/proc/loadavg``: other work on the shared cores),
profiles the model again as ``workbench plan`` does by default (fresh cache:
the profile is this moment's; the planned micro-batch range, fitted per
layer), predicts the plan with that background (``SearchOptions(
background_load=...)``; and without, as the CLI's default), writes the plan's
run config (its partition as planned) and trains it for real with ``python
-m workbench.cli run CONFIG.toml`` (``STEPS`` steps, synthetic data). A run's
throughput is the global batch over the median gap between rank 0's step
events after ``WARMUP`` steps. Medians over the rounds are compared: each
prediction's error, the predicted and the measured order.

``--predict-only``: the planner's side only (no runs). ``--rounds N``
(default ``BENCH_REPEATS`` or 3). Writes ``bench/results/microbatch_costs.json``
with every run's directory (kept under ``runs/bench-microbatch-costs``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_planner import runnable_now  # the other work sharing the cores now (this script's folder is on the path)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "microbatch_costs.json"
MODEL, OVERRIDES, BATCH, CLUSTER = "vgg-tiny", {"fc_width": 4096}, 64, "local"
PLANS = {  # name -> world size planned for
    "dp1": 1,
    "gropipe-2x2-1f1b-m2-d1": 4,
    "gropipe-2x2-1f1b-m2-d0": 4,
    "dp4": 4,
    "gropipe-2x2-1f1b-m4-d1": 4,
}
EXTRA = {"async-1x2-m1": 2}  # the search's first plan on this machine (2 ranks), measured beside the five
ALL = {**PLANS, **EXTRA}
STEPS, WARMUP = 14, 4
# the runs train with the config's default optimizer (SGD without momentum, [training.optimizer]): the plans are
# costed for it (its step's memory traffic and state), as `workbench plan --optimizer sgd` costs them
OPTIMIZER = "sgd"


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def _costs(cache_dir: Path):
    """This moment's profile, as ``workbench plan`` takes it for a zoo model (default options), in a fresh cache."""
    from workbench.cli.plan_commands import _model_costs
    from workbench.planning import load_cluster

    os.environ["WORKBENCH_CACHE_DIR"] = str(cache_dir)
    started = time.perf_counter()
    costs, _, notes, *_ = _model_costs(MODEL, load_cluster(CLUSTER), None, [f"{k}={v}" for k, v in OVERRIDES.items()],
                                      global_batch=BATCH, world_size=4)
    return costs, notes, round(time.perf_counter() - started, 2)


def predict_one(name: str, costs, background: float) -> dict:
    """One plan's prediction with no background (the CLI's default) and with ``background`` runnable
    processes, and its run config (the partition as planned)."""
    from workbench.planning import Budget, SearchOptions, Workload, plan

    row = {}
    for key, load in (("quiet", 0.0), ("loaded", background)):
        found = plan(Workload(costs, BATCH, optimizer=OPTIMIZER), CLUSTER, Budget(world_size=ALL[name]),
                     SearchOptions(strategies=[name], background_load=load))[name]
        row[key] = found.estimate.throughput
    config = found.to_config(name=f"mbc-{name}", model={"overrides": OVERRIDES}, data={"kind": "synthetic"},
                             training={"steps": STEPS})
    row.update(partition=str(found.estimate.partition) if found.estimate.partition else None,
               config=config.to_toml(defaults=False), background=background)
    return row


def predict(background: float, cache_dir: Path) -> dict:
    """Every plan's prediction from one profile, and the full search at 4 devices (its top plans and notes)."""
    from workbench.planning import Budget, SearchOptions, Workload, plan

    costs, notes, seconds = _costs(cache_dir)
    out: dict = {"background": background, "profile_s": seconds, "profiled_sizes": list(costs.profiled_sizes),
                 "fit_total_ms": _fit_totals(costs),
                 "plans": {name: predict_one(name, costs, background) for name in PLANS}}
    search = plan(Workload(costs, BATCH, optimizer=OPTIMIZER), CLUSTER, Budget(world_size=4), SearchOptions(top=5))
    out["search_top"] = [(p.name, round(p.estimate.throughput, 1)) for p in search.plans]
    out["search_notes"] = notes + list(search.notes)
    out["fewer_ranks"] = search.fewer_ranks
    return out


def _fit_totals(costs) -> dict[int, float]:
    """The whole model's fitted forward + backward ms for one micro-batch of each size the five plans run."""
    return {b: round(sum(sum(t) for t in costs.batch_fit.times_ms(b)), 2) for b in (1, 4, 8, 16, 64)}


def _run(name: str, toml: str, root: Path) -> tuple[float, str]:
    """Train one config with ``workbench run``; (samples/s, run directory)."""
    from workbench.jobs import attach

    path = root / f"{name}.toml"
    path.write_text(toml)
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(path), "--run-root", str(root)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"{name}: workbench run exited {proc.returncode}\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-2000:]}")
    run_dir = lines[-1].strip()
    frame = attach(run_dir).metrics()
    t = sorted(frame[frame["rank"] == 0].set_index("step")["t"].items())
    gaps = [b - a for (step, a), (_, b) in zip(t, t[1:]) if step >= WARMUP]
    return BATCH / statistics.median(gaps), run_dir


def measure(rounds: int) -> tuple[list[dict], dict[str, list]]:
    """Each round: the full search on this moment's profile, then each plan (order alternating) profiled again
    just before it runs, predicted with the processes runnable then as background, and trained."""
    root = ROOT / "runs" / "bench-microbatch-costs" / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    searches, runs = [], {name: [] for name in ALL}
    for r in range(rounds):
        search = predict(runnable_now(), root / f"profiles-{r}")
        searches.append(search)
        _print_prediction(r, search)
        order = list(ALL) if r % 2 == 0 else list(ALL)[::-1]  # alternate the order between rounds
        for name in order:
            background = runnable_now()
            costs, _, seconds = _costs(root / f"profiles-{r}-{name}")
            row = predict_one(name, costs, background)
            rate, run_dir = _run(name, row.pop("config"), root)
            row.update(samples_s=rate, run_dir=run_dir, profile_s=seconds, fit_total_ms=_fit_totals(costs),
                       runnable_after=runnable_now(10))
            runs[name].append(row)
            print(f"round {r} {name:<26} measured {rate:7.1f} samples/s, predicted {row['loaded']:7.1f} "
                  f"({row['quiet']:7.1f} quiet); runnable {background:.0f} before, {row['runnable_after']:.0f} after",
                  flush=True)
    return searches, runs


def _print_prediction(r: int, p: dict) -> None:
    print(f"round {r}: profiled at {p['profiled_sizes']} in {p['profile_s']} s; background {p['background']:.0f}; "
          f"fitted ms a micro-batch: {p['fit_total_ms']}")
    for name, row in p["plans"].items():
        print(f"  predicted {name:<26} {row['quiet']:7.1f} samples/s quiet, {row['loaded']:7.1f} with the "
              f"background  (partition {row['partition']})")
    print("  search at --world-size 4, top 5:", ", ".join(f"{n} {t}" for n, t in p["search_top"]))
    print("\n".join(f"  note: {n}" for n in p["search_notes"]), flush=True)
    for row in p["plans"].values():
        row.pop("config")


def _order(values: dict[str, float]) -> list[str]:
    return sorted(values, key=values.get, reverse=True)


def report(result: dict) -> None:
    measured = {n: statistics.median(r["samples_s"] for r in runs) for n, runs in result["runs"].items()}
    predicted = {n: statistics.median(r["loaded"] for r in runs) for n, runs in result["runs"].items()}
    quiet = {n: statistics.median(r["quiet"] for r in runs) for n, runs in result["runs"].items()}
    print(f"\n{'plan':<26} {'measured':>9} {'rounds':>22} {'predicted':>10} {'error':>7} {'quiet':>7} {'error':>7}")
    for name in measured:
        rounds = ", ".join(f"{r['samples_s']:.1f}" for r in result["runs"][name])
        print(f"{name:<26} {measured[name]:9.1f} {rounds:>22} {predicted[name]:10.1f} "
              f"{predicted[name] / measured[name] - 1:+7.1%} {quiet[name]:7.1f} {quiet[name] / measured[name] - 1:+7.1%}")
    result.update(measured_samples_s=measured, predicted_samples_s=predicted, predicted_quiet_samples_s=quiet,
                  errors={n: predicted[n] / measured[n] - 1 for n in measured})
    five = lambda values: {n: values[n] for n in PLANS}  # noqa: E731 (the orders compared are the five's)
    result.update(measured_order=_order(five(measured)), predicted_order=_order(five(predicted)),
                  quiet_order=_order(five(quiet)))
    result["order_matches"] = result["measured_order"] == result["predicted_order"]
    result["within_20pct"] = sum(abs(result["errors"][n]) <= 0.2 for n in PLANS)
    print(f"measured order:  {' > '.join(result['measured_order'])}")
    print(f"predicted order: {' > '.join(result['predicted_order'])}  (same: {result['order_matches']})")
    print(f"quiet order:     {' > '.join(result['quiet_order'])}")
    print(f"within 20%: {result['within_20pct']} of {len(PLANS)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_REPEATS", "3")))
    parser.add_argument("--predict-only", action="store_true")
    args = parser.parse_args()
    import tempfile

    import torch

    torch.set_num_threads(1)
    result = {"model": MODEL, "overrides": OVERRIDES, "global_batch": BATCH, "cluster": CLUSTER,
              "date": time.strftime("%Y-%m-%d %H:%M"), "steps": STEPS, "warmup": WARMUP}
    if args.predict_only:
        with tempfile.TemporaryDirectory() as tmp:
            _print_prediction(0, predict(runnable_now(), Path(tmp)))
        return 0
    result["searches"], result["runs"] = measure(args.rounds)
    report(result)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
