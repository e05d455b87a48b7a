"""The planner against measurement: overlap slowdown, predicted vs measured strategies, projections, search speed.

Four parts, each printed and written to ``bench/results/planner.json``:

1. ``--overlap-probe`` (run under torchrun with 4 ranks, started by part 1 of
   ``main``): ranks 0 and 1 all-reduce 8 MB while ranks 2 and 3 multiply
   through a weight-bound fully connected layer, against each alone; the overlap slowdown is how much slower each
   runs while the other does (median of repeats). The same run times the small
   collectives a 2 x 2 tensor grid issues (a row and a column broadcast per
   step, all four ranks busy): what the ``local`` presets charge for each
   step of a collective (a 2-rank broadcast is one step);
   and how fast each of two processes computing at once runs against one
   alone (the cores' parallel efficiency; 1.0 means a core counts whole).
2. Strategies on this machine, 4 CPU ranks: each round profiles the model
   in one process, runs seven calibration runs (``pp4-gpipe-m4`` and
   ``pp4-gpipe-m16`` for the scheduled runtimes, at two micro-batch sizes,
   ``async-1x4-m8``, and the 2D and 1D tensor grids at half and twice the
   compared batch; none among those compared), and
   scales the profile's compute to what their ranks measured
   (:mod:`workbench.planning.costs.run_calibration`); the planner then predicts
   every strategy on the ``local`` cluster with the processes runnable at
   planning time (sampled from /proc/loadavg, not the lagging load average)
   as background work, and each runs for real under torchrun (interleaved
   rounds, median of the steady iterations). Printed: predicted (and
   uncalibrated: from the profile alone, whose own micro-batch passes,
   ``profile(..., microbatch_passes=True)``, give the compute model that the
   calibration runs fit otherwise) vs measured times, each strategy's spread over the rounds,
   and the Kendall tau of the orderings for the issue's six strategies and
   for all ten.
3. The 8 x V100 PCIe preset with costs projected from FLOPs: GroPipe's best
   predicted gain over data parallelism for VGG-16 and ResNet-50, next to
   the GroPipe paper's figures, at the preset's all-reduce bandwidth and
   overlap slowdown, and at lower bandwidths and no slowdown (the gain
   depends on how much data-parallel communication is left exposed).
4. Search speed: every strategy for 64 devices and a 48-layer transformer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PAPER_GAIN = {"vgg16": 0.79, "resnet50": 0.42}  # GroPipe paper, 8 x V100 PCIe, over data parallel


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two paired lists (ties count as neither concordant nor discordant)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"kendall_tau needs two paired lists of >= 2 values, got {len(a)} and {len(b)}")
    score = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            x, y = a[i] - a[j], b[i] - b[j]
            score += (x * y > 0) - (x * y < 0)
    return score / (len(a) * (len(a) - 1) / 2)


# -- 1. overlap probe (torchrun worker) ------------------------------------------------------------------------
def _probe_worker(out: str, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])
    dist.new_group([2, 3])
    buf = torch.ones(2 * 2**20)  # 8 MB of float32 gradients
    # a weight-bound fully connected layer (8 rows through a 16 MB weight), like the FC layers the pipelines run
    x, w = torch.randn(8, 2048), torch.randn(2048, 2048)
    n_ar = 20
    clock = torch.zeros(1, dtype=torch.float64)

    def communicate() -> float:
        start = time.perf_counter()
        for _ in range(n_ar):
            dist.all_reduce(buf, group=pair)
        clock[0] = time.time()
        return (time.perf_counter() - start) / n_ar

    def compute(window_s: float) -> list[tuple[float, float]]:
        ends, stop = [], time.time() + window_s
        while time.time() < stop:
            t = time.time()
            x @ w
            ends.append((t, time.time()))
        return ends

    def rate(ends: list[tuple[float, float]], until: float) -> float:
        done = [e - s for s, e in ends if e <= until]
        return statistics.median(done)

    comm_alone, comm_with, mm_alone, mm_with = [], [], [], []
    for _ in range(repeats):
        dist.barrier()
        if rank < 2:
            comm_alone.append(communicate())
        dist.barrier()
        if rank >= 2:
            ends = compute(0.3)
            mm_alone.append(rate(ends, float("inf")))
        dist.barrier()
        if rank < 2:
            comm_with.append(communicate())
        else:
            ends = compute(n_ar * 0.05)
        dist.broadcast(clock, src=0)
        if rank >= 2:
            mm_with.append(rate(ends, clock.item()))
        dist.barrier()
    calls = _call_cost(rank, repeats)
    busy_calls = _call_cost(rank, repeats, steps=60, rows_a=512, block_elems=32768)
    one, two = _core_scaling(rank, repeats)
    stepping = _oversubscription(rank, repeats)
    rows = [comm_alone, comm_with, mm_alone, mm_with, calls, one, two, busy_calls]
    mine = torch.tensor([statistics.median(r) if r else 0.0 for r in rows], dtype=torch.float64)
    gathered = [torch.zeros(len(rows), dtype=torch.float64) for _ in range(4)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        comm = gathered[0].tolist()
        mm = gathered[2].tolist()
        result = {"allreduce_8mb_ms_alone": comm[0] * 1e3, "allreduce_8mb_ms_with_compute": comm[1] * 1e3,
                  "matmul_ms_alone": mm[2] * 1e3, "matmul_ms_with_allreduce": mm[3] * 1e3,
                  "comm_slowdown": comm[1] / comm[0], "compute_slowdown": mm[3] / mm[2],
                  "collective_call_ms": max(g[4] for g in gathered).item() * 1e3,
                  "collective_call_ms_busy": max(g[7] for g in gathered).item() * 1e3,
                  "op_ms_one_process": gathered[2][5].item() * 1e3, "op_ms_two_processes": gathered[2][6].item() * 1e3}
        # two processes on the two cores each run this much of their speed alone: the cores' parallel efficiency
        result["core_efficiency"] = result["op_ms_one_process"] / result["op_ms_two_processes"]
        result["overlap_slowdown"] = (result["comm_slowdown"] * result["compute_slowdown"]) ** 0.5
        result["block_step_ms_by_processes"] = [statistics.median(v) * 1e3 for v in stepping]
        result["oversubscription_penalty"] = oversubscription_penalty(result["block_step_ms_by_processes"])
        Path(out).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


def _call_cost(rank: int, repeats: int, steps: int = 100, rows_a: int = 64, block_elems: int = 4096) -> list[float]:
    """Seconds one small collective costs a rank of a 2 x 2 grid, the way SUMMA issues them.

    Every rank multiplies a ``rows_a`` x 128 block by a 128 x 128 one, then
    broadcasts ``block_elems`` floats (16 KiB by default) along its row and
    then along its column; the loop is timed with and without the
    broadcasts, and the difference is split over the calls. On ranks that
    time-share cores this is far above the link's latency: each call waits
    until every member of its group has been scheduled. With more compute
    between calls (``rows_a`` = 512: about what a rank of the 2D GPT-2 tiny
    step does between two of its collectives) the four ranks stay runnable,
    and a call waits longer for its peers to be scheduled.
    """
    import torch
    import torch.distributed as dist

    rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    cols = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    row, col = rows[rank // 2], cols[rank % 2]
    block, a, b = torch.ones(block_elems), torch.randn(rows_a, 128), torch.randn(128, 128)

    def loop(talk: bool) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            a @ b
            if talk:
                dist.broadcast(block, src=(rank // 2) * 2, group=row)
                dist.broadcast(block, src=rank % 2, group=col)
        return time.perf_counter() - start

    out = []
    for _ in range(repeats):
        alone = loop(False)
        out.append(max(0.0, loop(True) - alone) / (2 * steps))
    return out


def _core_scaling(rank: int, repeats: int, window_s: float = 0.4) -> tuple[list[float], list[float]]:
    """Seconds per operation of rank 2 computing alone, and with rank 3 computing beside it (ranks 0, 1 idle).

    The operation alternates a compute-bound product (512 x 512 blocks) and a
    weight-bound one (8 rows through a 16 MB weight), the two kinds of layer
    the models here run. Two logical cores that share one physical core, or
    one memory bus, give each of two busy processes less than its speed alone.
    """
    import torch
    import torch.distributed as dist

    a, b = torch.randn(512, 512), torch.randn(512, 512)
    x, w = torch.randn(8, 2048), torch.randn(2048, 2048)

    def run() -> float:
        times, stop = [], time.perf_counter() + window_s
        while time.perf_counter() < stop:
            t = time.perf_counter()
            a @ b
            x @ w
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    one, two = [], []
    for _ in range(repeats):
        dist.barrier()
        if rank == 2:
            one.append(run())
        dist.barrier()
        if rank >= 2:
            t = run()
            if rank == 2:
                two.append(t)
        dist.barrier()
    return one, two


def _oversubscription(rank: int, repeats: int, window_s: float = 0.6) -> list[list[float]]:
    """Rank 0's seconds per transformer-block step with 1, 2, 3 and 4 of the ranks stepping at once.

    Each rank trains its own small transformer layer (hidden 128, 4 heads,
    batch 4 x 64 tokens: a GPT-2 tiny block at a pipeline's micro-batch).
    Processor sharing predicts ``max(1, k / cores)`` times the time alone;
    what comes on top when more processes are runnable than there are cores
    (each switch refilling caches) is the oversubscription penalty.
    """
    import torch
    import torch.distributed as dist

    torch.manual_seed(rank)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
    x = torch.randn(4, 64, 128)

    def run() -> float:
        times, stop = [], time.perf_counter() + window_s
        while time.perf_counter() < stop:
            t = time.perf_counter()
            layer(x).sum().backward()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    run()  # warm up
    out: list[list[float]] = [[] for _ in range(4)]
    for _ in range(repeats):
        for k in range(1, 5):
            dist.barrier()
            if rank < k:
                t = run()
                if rank == 0:
                    out[k - 1].append(t)
            dist.barrier()
    return out


def oversubscription_penalty(per_k_ms: list[float], cores: int = 2) -> float:
    """How much slower than processor sharing's ``k / cores`` the probe's processes ran, beyond the cores.

    0 means processor sharing (:func:`workbench.scheduling.sharing.sharing_slowdown`,
    which has no such term) explains the probe; the planner would need a
    penalty term only if this came out clearly above 0.

    ``per_k_ms[k - 1]``: one process's step time with ``k`` processes
    stepping; each k beyond the cores gives ``(t_k / t_1) / (k / cores) - 1``
    over ``min(1, (k - cores) / cores)``; the mean of those.
    """
    fits = []
    for k in range(cores + 1, len(per_k_ms) + 1):
        excess = min(1.0, (k - cores) / cores)
        fits.append(((per_k_ms[k - 1] / per_k_ms[0]) / (k / cores) - 1.0) / excess)
    return max(0.0, statistics.fmean(fits)) if fits else 0.0


def overlap_probe(repeats: int = 7) -> dict:
    import subprocess
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="overlap-probe-")) / "probe.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                    __file__, "--overlap-probe", str(out), "--repeats", str(repeats)], check=True, env=env,
                   timeout=300, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    result["load_avg_1m"] = os.getloadavg()[0]
    return result


# -- 2. predicted vs measured on 4 CPU ranks -------------------------------------------------------------------
MODEL, OVERRIDES, BATCH, SEQ = "gpt2-tiny", {"n_embd": 128, "n_layer": 4, "n_head": 4}, 16, 64
# the six strategies, then four that differ from them in the work they do (one micro-batch of the whole
# batch, recomputation, 1D tensor parallelism), so that the ordering is tested beyond the run-to-run noise
MEASURED = ["dp4", "pp4-1f1b-m4", "gropipe-2x2-1f1b-m4-d0", "gropipe-2x2-1f1b-m4-d1", "async-2x2-m4",
            "tp2d-2x2-dp1"]
EXTRA = ["pp4-1f1b-m1", "gropipe-2x2-1f1b-m8-d0", "dp4-rc", "tp1d-4-dp1"]
# runs each round calibrates compute from (planning.costs.run_calibration), as (strategy, global batch); not among those
# compared. Two scheduled pipelines at micro-batches of 4 and 1 samples fit the runtime's per-micro-batch cost; the
# async one has the compared async pipeline's micro-batch (2 samples) on four stages of one pipeline; the tensor
# runtimes run the compared grids at half and twice the compared batch (their per-call cost is fitted from the two).
CALIBRATIONS = (("pp4-gpipe-m4", BATCH), ("pp4-gpipe-m16", BATCH), ("async-1x4-m8", BATCH),
                ("tp2d-2x2-dp1", BATCH // 2), ("tp2d-2x2-dp1", BATCH * 2),
                ("tp1d-4-dp1", BATCH // 2), ("tp1d-4-dp1", BATCH * 2))
STEPS, WARMUP = 9, 3


def _profile():
    import torch

    from workbench.models.zoo import build_model
    from workbench.profiling import profile

    torch.set_num_threads(1)
    return profile(build_model(MODEL, **OVERRIDES), batch=BATCH, repeats=5, cache=False, progress=False,
                   microbatch_passes=True)


def _measured_iteration_ms(job, warmup: int = WARMUP) -> float:
    """Median time between consecutive steps on rank 0, after ``warmup`` steps."""
    frame = job.metrics()
    t = sorted(frame[frame["rank"] == 0].set_index("step")["t"].items())
    gaps = [(b - a) * 1e3 for (_, a), (_, b) in zip(t, t[1:]) if _ >= warmup]
    return statistics.median(gaps)


def runnable_now(samples: int = 20, interval_s: float = 0.05) -> float:
    """Processes runnable besides this one right now: median of /proc/loadavg's running count.

    The 1-minute load average lags by a minute, so right after a benchmark's
    own runs it still counts them as background.
    """
    path = Path("/proc/loadavg")
    if not path.is_file():
        return os.getloadavg()[0]
    counts = []
    for _ in range(samples):
        counts.append(int(path.read_text().split()[3].split("/")[0]) - 1)
        time.sleep(interval_s)
    return float(max(0, statistics.median(counts)))


def _run(plan_, name: str, root: Path):
    from workbench.jobs import LaunchSpec, launch

    config = plan_.to_config(training={"steps": STEPS}, model={"overrides": OVERRIDES},
                             data={"kind": "bytes-lm", "seq_len": SEQ})
    job = launch(LaunchSpec(config=config.to_dict(), name=name, run_root=root))
    state = job.wait(timeout=400).state
    if state != "SUCCEEDED":
        raise RuntimeError(f"{name}: run in {job.run_dir} ended {state}")
    return job


def measured_vs_predicted(repeats: int) -> dict:
    from workbench.models.zoo import get_entry
    from workbench.planning import Budget, SearchOptions, Workload, calibrate_from_run, plan, transformer_shape

    shape = transformer_shape({**get_entry(MODEL).config(OVERRIDES), "seq_len": SEQ}, BATCH)
    root = Path(__file__).resolve().parents[1] / "runs" / "bench-planner" / time.strftime("%Y%m%d-%H%M%S")
    names = MEASURED + EXTRA
    rows: dict[str, list[dict]] = {name: [] for name in names}
    calibrations = []
    for rep in range(repeats):
        costs = _profile()  # this round's machine speed
        profile_path = costs.save(Path(root) / f"profile-rep{rep}.json")
        background = runnable_now()  # the other work sharing the cores now
        cals = []
        for name, batch in CALIBRATIONS:
            cal_plan = plan(Workload(costs, batch, shape=shape), "local", Budget(world_size=4),
                            SearchOptions(strategies=[name]))[name]
            cal_job = _run(cal_plan, f"{name}-b{batch}", root)
            cal = calibrate_from_run(costs, cal_job.run_dir, cluster="local", background_load=background,
                                     warmup=WARMUP, shape=shape)
            cals.append(cal)
            print(f"rep {rep}: background {background:.2f}; {cal.family} compute calibrated x{cal.compute_scale:.3f} "
                  f"from {name} at batch {batch} ({cal.events} events)", flush=True)
        calibrations.append([c.to_dict() for c in cals])
        raw = plan(Workload(costs, BATCH, shape=shape), "local", Budget(world_size=4),
                   SearchOptions(strategies=names, background_load=background))
        predicted = plan(Workload(costs, BATCH, shape=shape), "local", Budget(world_size=4),
                         SearchOptions(strategies=names, background_load=background, calibration=cals))
        for name in names:
            load = os.getloadavg()[0]
            job = _run(predicted[name], name, root)
            measured = _measured_iteration_ms(job)
            row = {"measured_ms": measured, "predicted_ms": predicted[name].estimate.iteration_ms,
                   "uncalibrated_ms": raw[name].estimate.iteration_ms, "load_avg_1m": load,
                   "background_load": background, "compute_scale": [c.compute_scale for c in cals],
                   "run_dir": str(job.run_dir),
                   "profile": str(profile_path)}
            rows[name].append(row)
            print(f"rep {rep} {name:<24} measured {measured:8.1f} ms  predicted {row['predicted_ms']:8.1f} ms  "
                  f"(uncalibrated {row['uncalibrated_ms']:8.1f})  load {load:.2f}", flush=True)
    out: dict = {"model": MODEL, "overrides": OVERRIDES, "global_batch": BATCH, "seq_len": SEQ, "repeats": repeats,
                 "calibration_strategies": [f"{n}-b{b}" for n, b in CALIBRATIONS], "calibrations": calibrations, "issue_strategies": MEASURED,
                 "strategies": {name: {"runs": runs} for name, runs in rows.items()}}
    return summarize(out)


def summarize(out: dict) -> dict:
    """Medians per strategy, the Kendall tau of the two orderings (the issue's six, and all), printed as a table."""
    for r in out["strategies"].values():
        runs = r["runs"]
        r.update({"measured_ms": statistics.median(x["measured_ms"] for x in runs),
                  "predicted_ms": statistics.median(x["predicted_ms"] for x in runs),
                  "ratio": statistics.median(x["predicted_ms"] / x["measured_ms"] for x in runs),
                  "load_avg_1m": statistics.median(x["load_avg_1m"] for x in runs)})
        if all("uncalibrated_ms" in x for x in runs):
            r["uncalibrated_ratio"] = statistics.median(x["uncalibrated_ms"] / x["measured_ms"] for x in runs)
        # how often the strategy's measured time moved against the others: its rounds' spread
        r["measured_spread"] = (max(x["measured_ms"] for x in runs) - min(x["measured_ms"] for x in runs)) / r[
            "measured_ms"]
    names = list(out["strategies"])
    six = [n for n in out.get("issue_strategies", names) if n in out["strategies"]]

    def tau(subset: list[str]) -> float:
        return kendall_tau([out["strategies"][n]["measured_ms"] for n in subset],
                           [out["strategies"][n]["predicted_ms"] for n in subset])

    out["kendall_tau"] = tau(six)
    out["kendall_tau_all"] = tau(names)
    out["resolved"] = resolved_pairs(out["strategies"], names)
    out["within_20pct"] = sum(abs(out["strategies"][n]["ratio"] - 1) <= 0.2 for n in names)
    out["within_20pct_uncalibrated"] = sum(abs(out["strategies"][n].get("uncalibrated_ratio", 0.0) - 1) <= 0.2
                                           for n in names)
    print(f"\n{'strategy':<24} {'measured ms':>12} {'predicted ms':>13} {'pred/meas':>10} {'uncal.':>7} "
          f"{'spread':>7} {'load':>6}")
    for n in names:
        r = out["strategies"][n]
        print(f"{n:<24} {r['measured_ms']:12.1f} {r['predicted_ms']:13.1f} {r['ratio']:10.3f} "
              f"{r.get('uncalibrated_ratio', float('nan')):7.3f} {r['measured_spread']:7.2f} {r['load_avg_1m']:6.2f}")
    res = out["resolved"]
    print(f"Kendall tau, the issue's {len(six)} strategies: {out['kendall_tau']:.3f}; all {len(names)}: "
          f"{out['kendall_tau_all']:.3f}; within 20%: {out['within_20pct']} of {len(names)} "
          f"(uncalibrated: {out['within_20pct_uncalibrated']})", flush=True)
    print(f"pairs whose measured rounds do not overlap: {res['pairs']} of {res['of']}, ordered right by the planner: "
          f"{res['concordant']} (tau over them {res['tau']:.3f})", flush=True)
    return out


def resolved_pairs(strategies: dict, names: list[str]) -> dict:
    """The pairs the measurement itself orders (every round of one faster than every round of the other),
    and how many of them the planner's medians order the same way."""
    pairs = concordant = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ra = [x["measured_ms"] for x in strategies[a]["runs"]]
            rb = [x["measured_ms"] for x in strategies[b]["runs"]]
            if max(ra) < min(rb) or max(rb) < min(ra):
                pairs += 1
                measured = strategies[a]["measured_ms"] - strategies[b]["measured_ms"]
                predicted = strategies[a]["predicted_ms"] - strategies[b]["predicted_ms"]
                concordant += measured * predicted > 0
    return {"pairs": pairs, "of": len(names) * (len(names) - 1) // 2, "concordant": concordant,
            "tau": (2 * concordant - pairs) / pairs if pairs else float("nan")}


def repredict(previous: dict, background: float | None = None) -> dict:
    """Plan the measured runs of ``previous`` again: from the profile each was planned from (a fresh one
    when it was not kept) and the compute calibration of its round, each run's recorded background load
    (or ``background`` runnable foreign processes for every run, for runs recorded with a wrong one)."""
    from workbench.models.zoo import get_entry
    from workbench.planning import Budget, RuntimeCalibration, SearchOptions, Workload, plan, transformer_shape

    from workbench.core.costs import ModelCosts

    shape = transformer_shape({**get_entry(MODEL).config(OVERRIDES), "seq_len": SEQ}, BATCH)
    fresh = None
    for name, r in previous["strategies"].items():
        for rep, run in enumerate(r["runs"]):
            if run.get("profile") and Path(run["profile"]).is_file():
                costs = ModelCosts.load(run["profile"])  # the profile the run was planned from
            else:
                fresh = costs = fresh or _profile()
            recorded = previous.get("calibrations") or []
            cal = None
            if rep < len(recorded):  # one calibration (a dict) per round, or one per runtime family (a list)
                entries = recorded[rep] if isinstance(recorded[rep], list) else [recorded[rep]]
                cal = [RuntimeCalibration.from_dict({k: v for k, v in c.items() if k != "measured_iteration_ms"})
                       for c in entries]
            bg = run["background_load"] if background is None else background
            result = plan(Workload(costs, BATCH, shape=shape), "local", Budget(world_size=4),
                          SearchOptions(strategies=[name], background_load=bg, calibration=cal))
            run["predicted_ms"] = result[name].estimate.iteration_ms
            if cal is not None:
                raw = plan(Workload(costs, BATCH, shape=shape), "local", Budget(world_size=4),
                           SearchOptions(strategies=[name], background_load=bg))
                run["uncalibrated_ms"] = raw[name].estimate.iteration_ms
    previous["repredicted_at"] = time.strftime("%Y-%m-%d %H:%M")
    return summarize(previous)


# -- 3. GroPipe's gain over data parallel on 8 x V100 PCIe, projected ---------------------------------------------
CLUSTER = "8xV100-PCIe"
ALLREDUCE_GBS = (None, 5.0, 2.5)  # the preset's PCIe link, then slower all-reduces (8 GPUs through host bridges)
OVERLAP_SLOWDOWNS = (None, 1.0)  # the preset's, then none (compute and NCCL not slowing each other)


def gropipe_gain_projection(batch: int = 256) -> dict:
    """Best GroPipe vs dp8, per model, at the preset's all-reduce bandwidth and overlap slowdown and at others."""
    import dataclasses

    import torch

    from workbench.core.costs import LinkSpec
    from workbench.core.plan import GroPipe
    from workbench.planning import SearchOptions, Workload, plan
    from workbench.planning.costs.clusters import get_cluster
    from workbench.profiling import profile
    from workbench.profiling.projection import project

    torch.set_num_threads(2)
    preset = get_cluster(CLUSTER)
    costs = {m: project(profile(m, batch=8, repeats=1, warmup=1, progress=False), preset.device) for m in PAPER_GAIN}
    out = {"cluster": CLUSTER, "device": preset.device.name, "global_batch": batch, "rows": [],
           "images_per_s_per_gpu": {m: c.batch_size / c.total("compute_ms") * 1e3 for m, c in costs.items()}}
    for m, rate in out["images_per_s_per_gpu"].items():
        print(f"{m}: {rate:.0f} images/s per {preset.device.name} (projected, float32)", flush=True)
    for slowdown in OVERLAP_SLOWDOWNS:
        cluster = preset if slowdown is None else dataclasses.replace(preset, overlap_slowdown=slowdown)
        for gbs in ALLREDUCE_GBS:
            link = LinkSpec("pcie-allreduce", 10.0, gbs) if gbs else None
            linked = dataclasses.replace(cluster, collective_link=link)
            for model, model_costs in costs.items():
                result = plan(Workload(model_costs, batch), linked,
                              options=SearchOptions(kinds=("dp", "gropipe"), recompute=(False,), simulate_top=40))
                dp = result["dp8"].estimate
                gro = min((p for p in result.plans
                           if isinstance(p.plan.pipeline, GroPipe) and p.estimate.method == "simulated"),
                          key=lambda p: p.estimate.iteration_ms)
                gain = dp.iteration_ms / gro.estimate.iteration_ms - 1
                gbs_used = gbs or preset.intra_node.bandwidth_gbs
                out["rows"].append({"model": model, "allreduce_gbs": gbs_used,
                                    "overlap_slowdown": cluster.overlap_slowdown, "preset": slowdown is None and not gbs,
                                    "dp_ms": dp.iteration_ms, "dp_exposed_comm_ms": dp.exposed_comm_ms,
                                    "gropipe": gro.name, "gropipe_ms": gro.estimate.iteration_ms,
                                    "predicted_gain": gain, "paper_gain": PAPER_GAIN[model]})
                print(f"overlap slowdown {cluster.overlap_slowdown:.1f} all-reduce {gbs_used:4.1f} GB/s {model:<9} dp8 "
                      f"{dp.iteration_ms:7.1f} ms (exposed {dp.exposed_comm_ms:6.1f} ms)  best {gro.name:<26} "
                      f"{gro.estimate.iteration_ms:7.1f} ms  predicted gain {gain:+.0%} (paper "
                      f"{PAPER_GAIN[model]:+.0%})", flush=True)
    return out


# -- 4. search speed ---------------------------------------------------------------------------------------------
def search_speed(repeats: int = 3) -> dict:
    from workbench.core.costs import ModelCosts
    from workbench.planning import Workload, plan, transformer_shape

    config = {"n_embd": 2048, "n_head": 16, "n_layer": 48, "vocab_size": 50257, "n_positions": 2048, "seq_len": 1024}
    shape = transformer_shape(config, 8)
    costs = ModelCosts.uniform(48, forward_ms=4.0, backward_ms=8.0, param_bytes=4 * 12 * 2048**2,
                               activation_bytes=8 * 1024 * 2048 * 4, batch_size=8, model="transformer-48")
    times, searched = [], 0
    for _ in range(repeats):
        result = plan(Workload(costs, 512, shape=shape), _cluster_64())
        times.append(result.elapsed_s)
        searched = result.searched
    out = {"devices": 64, "layers": 48, "strategies": searched, "seconds": statistics.median(times),
           "load_avg_1m": os.getloadavg()[0], "best": result.best.name}
    print(f"search: {searched} strategies for 64 devices and 48 layers in {out['seconds']:.2f} s (median of "
          f"{repeats}, load {out['load_avg_1m']:.2f}); best {out['best']}", flush=True)
    return out


def _cluster_64():
    from dataclasses import replace

    from workbench.planning.costs.clusters import get_cluster

    return replace(get_cluster("2x8xH100-IB"), name="8x8xH100-IB", num_nodes=8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlap-probe", metavar="OUT", help="(under torchrun) run the overlap probe, write OUT")
    parser.add_argument("--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", "3")))
    parser.add_argument("--parts", default="overlap,measured,projection,speed",
                        help="comma-separated parts to run (overlap, measured, projection, speed; repredict: plan the "
                             "runs recorded by the last measured part again, without running them)")
    parser.add_argument("--background", type=float, default=None,
                        help="with repredict: runnable foreign processes during the recorded runs (default: as recorded)")
    args = parser.parse_args()
    if args.overlap_probe:
        _probe_worker(args.overlap_probe, args.repeats)
        return 0
    parts = set(args.parts.split(","))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "planner.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    if "overlap" in parts:
        probe = overlap_probe()
        result["overlap_probe"] = probe
        print(f"overlap probe (load {probe['load_avg_1m']:.2f}): all-reduce 8 MB {probe['allreduce_8mb_ms_alone']:.2f} "
              f"ms alone, {probe['allreduce_8mb_ms_with_compute']:.2f} ms with compute "
              f"(x{probe['comm_slowdown']:.2f}); matmul {probe['matmul_ms_alone']:.3f} ms alone, "
              f"{probe['matmul_ms_with_allreduce']:.3f} ms with all-reduce (x{probe['compute_slowdown']:.2f}); "
              f"overlap slowdown {probe['overlap_slowdown']:.2f}; a small collective of a 2x2 grid costs "
              f"{probe['collective_call_ms']:.2f} ms ({probe['collective_call_ms_busy']:.2f} ms with 128 KiB blocks "
              f"and the ranks busy between calls); two processes computing at once each run at "
              f"{probe['core_efficiency']:.2f} of their speed alone; a transformer-block step with 1-4 processes "
              f"stepping: {', '.join(f'{v:.2f}' for v in probe['block_step_ms_by_processes'])} ms (oversubscription "
              f"penalty {probe['oversubscription_penalty']:.2f})", flush=True)
    if "measured" in parts:
        result["measured"] = measured_vs_predicted(args.repeats)
    if "repredict" in parts:  # the recorded runs of the last "measured" part, predicted again
        result["measured"] = repredict(result["measured"], args.background)
    if "projection" in parts:
        result["projection"] = gropipe_gain_projection()
    if "speed" in parts:
        result["search_speed"] = search_speed()
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
