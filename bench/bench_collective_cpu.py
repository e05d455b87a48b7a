"""How much of a gloo all-reduce between CPU processes is work on their cores: the simulator's share.

The ``local`` cluster's ranks are processes time-sharing this machine's
cores, and a gloo ring all-reduce on them copies and sums on those cores
while it also waits for its peer. The simulator stretches a collective by
the threads runnable beside it (:mod:`workbench.scheduling.sharing`), with
the fraction of its time that is work on a core (``COLLECTIVE_CPU_SHARE``):
an all-reduce of ``T0`` alone takes ``T0 ((1 - s) + s max(1, D / cores))``
where ``D`` counts the threads runnable on the node, each all-reduce thread
as ``s`` and each computing one as 1.

Four cases, 4 processes spawned on the machine (gloo, one thread each),
``MB`` MiB all-reduced, medians of ``REPEATS`` timed after a warm-up, the
cases interleaved ``ROUNDS`` times:

* ``alone``: ranks 0 and 1 all-reduce; ranks 2 and 3 sleep;
* ``two pairs``: ranks 0-1 and 2-3 all-reduce at once (two groups);
* ``beside compute``: ranks 0-1 all-reduce while ranks 2 and 3 multiply
  matrices without a pause;
* ``compute alone``: ranks 2 and 3 multiply ``MATMULS`` matrices while
  ranks 0 and 1 wait: how much the all-reduce slowed the computing ranks
  (the model counts an all-reduce thread as its share of a computing one).

The model gives ``two pairs`` ``D = 4 s`` (four all-reduce threads) and
``beside compute`` ``D = 2 + 2 s``; ``s`` is fitted to both measured ratios
by least squares (a grid of 0.01), and the model's value
(``COLLECTIVE_CPU_SHARE``) is printed with what it predicts for each case.
Writes ``bench/results/collective_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "collective_cpu.json"
MB, REPEATS, ROUNDS, WORLD = 64, 5, 3, 4
CASES = ("alone", "two pairs", "beside compute", "compute alone")
MATMULS = 40  # "compute alone": ranks 2 and 3 multiply this many 512 x 512 matrices while ranks 0 and 1 wait


def _rank(rank: int, port: int, queue, mb: int, repeats: int, rounds: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = pairs[rank // 2]
    tensor = torch.ones(mb * 2 ** 20 // 4)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    out: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(rounds):
        for case in CASES:
            dist.barrier()
            reducing = (rank < 2 and case != "compute alone") or case == "two pairs"
            times = []
            if case == "compute alone" and rank >= 2:
                start = time.perf_counter()
                for _ in range(MATMULS):
                    a @ b
                times.append((time.perf_counter() - start) * 1e3 / MATMULS)
            elif reducing:
                for i in range(repeats + 1):
                    start = time.perf_counter()
                    dist.all_reduce(tensor, group=mine)
                    if i:
                        times.append((time.perf_counter() - start) * 1e3)
            flag = torch.zeros(1)
            if (rank < 2) != (case == "compute alone"):  # whoever works tells the others when it is done
                flag += 1
            if not flag.item() and case != "two pairs":
                work = dist.all_reduce(flag, async_op=True)  # the done flag, summed over everyone
                if case == "beside compute":
                    start, done = time.perf_counter(), 0
                    while not work.is_completed():
                        a @ b
                        done += 1
                    times.append((time.perf_counter() - start) * 1e3 / max(1, done))
                work.wait()  # otherwise blocked in the wait, off the cores
            else:
                dist.all_reduce(flag)
            if rank == 0 and case != "compute alone":
                out[case].append(statistics.median(times))
            if rank == 2 and case in ("compute alone", "beside compute"):
                out.setdefault("matmul ms, " + case, []).append(times[0])
    if rank in (0, 2):
        queue.put({k: v for k, v in out.items() if v})
    dist.barrier()
    dist.destroy_process_group()


def measure(mb: int, repeats: int, rounds: int) -> dict[str, list[float]]:
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, queue, mb, repeats, rounds)) for r in range(WORLD)]
    for p in procs:
        p.start()
    result = {**queue.get(timeout=300), **queue.get(timeout=300)}
    for p in procs:
        p.join(timeout=60)
    return result


def stretch(case: str, share: float, cores: int = 2) -> float:
    """The model's all-reduce time in ``case`` over its time alone (two ranks, each with a core)."""
    demand = 4 * share if case == "two pairs" else 2 + 2 * share
    return (1 - share) + share * max(1.0, demand / cores)


def fit_share(ratios: dict[str, float]) -> float:
    """The share in [0, 1] (steps of 0.01) whose stretches are nearest the measured ratios (least squares)."""
    return min((k / 100 for k in range(101)),
               key=lambda s: sum((stretch(case, s) - r) ** 2 for case, r in ratios.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=MB)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    raw = measure(args.mb, REPEATS, args.rounds)
    med = {case: statistics.median(v) for case, v in raw.items()}
    ratios = {case: med[case] / med["alone"] for case in ("two pairs", "beside compute")}
    share = fit_share(ratios)
    compute = med["matmul ms, beside compute"] / med["matmul ms, compute alone"]
    from workbench.scheduling.sharing import COLLECTIVE_CPU_SHARE

    result = {"mb": args.mb, "rounds": args.rounds, "repeats": REPEATS, "load_before": load_before, "raw_ms": raw,
              "median_ms": med, "ratios": ratios, "fitted_share": share,
              "fitted_stretch": {case: stretch(case, share) for case in ratios}, "model_share": COLLECTIVE_CPU_SHARE,
              "model_stretch": {case: stretch(case, COLLECTIVE_CPU_SHARE) for case in ratios},
              "compute_slowdown_beside_all_reduce": compute, "fitted_compute_weight": max(0.0, compute - 1.0)}
    for case, times in raw.items():
        print(f"{case:<28} {med[case]:7.2f} ms  ({', '.join(f'{t:.1f}' for t in times)})")
    for case, r in ratios.items():
        print(f"all-reduce {case} / alone {r:.2f}: share {share:.2f} (fitted) gives {stretch(case, share):.2f}, "
              f"{COLLECTIVE_CPU_SHARE} (the model's) {stretch(case, COLLECTIVE_CPU_SHARE):.2f}")
    print(f"a matmul beside the all-reduce / alone {compute:.2f}: an all-reduce thread weighs "
          f"{max(0.0, compute - 1.0):.2f} of a computing one (the model: {COLLECTIVE_CPU_SHARE}, its share)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
