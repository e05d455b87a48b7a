"""Measure the real process group's links and fit them to the alpha-beta model.

The simulator and the planner price every message with a ``LinkSpec``
(``t = latency + bytes / bandwidth``; all-reduce by the ring formula). Preset
links are guesses about someone else's cluster; this module measures the one
the job actually runs on. Run under torchrun, every rank takes part:

* point-to-point: rank 0 and rank 1 ping-pong messages of each size (plain
  blocking send/recv), one-way time = half the round trip;
* all-reduce over the whole group, each rank timing its own call and the
  slowest rank's median kept.

Times are taken over ``--iters`` runs after ``--warmup`` ones, synchronised on
CUDA; the fit uses each size's fastest run (the link's capability, free of
the scheduler noise of shared machines), the medians are kept next to it.
Each series is fitted by least squares on *relative* error (so 1 KiB
and 16 MiB messages weigh alike) to a ``LinkSpec``, and rank 0 writes both
links and the raw measurements as JSON::

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m workbench.runtime.commbench --out link.json

gloo on CPU, NCCL on CUDA with a GPU per rank (``device="auto"``; see
:func:`workbench.runtime.groups.choose_backend`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Sequence

if __name__ == "__main__":  # before torch: a warm rank server, when one is named, runs this rank forked from it
    from .warm_client import forward_to_warm_server
    forward_to_warm_server("workbench.runtime.commbench")

import numpy as np

from ..core.costs import LinkSpec

__all__ = ["fit_link", "load_link", "DEFAULT_SIZES", "main"]

COMMBENCH_VERSION = 1
DEFAULT_SIZES = tuple(4 ** k * 1024 for k in range(8))  # 1 KiB .. 16 MiB


def fit_link(nbytes: Sequence[float], times_ms: Sequence[float], name: str, *, group_size: int | None = None) -> LinkSpec:
    """Least-squares (relative error) fit of measured times to a LinkSpec.

    Point-to-point (``group_size=None``): ``t = latency + bytes / bandwidth``.
    All-reduce over ``n`` ranks: the ring model of ``LinkSpec.allreduce_ms``,
    ``t = 2(n-1) latency + 2(n-1)/n * bytes / bandwidth``.
    """
    sizes, times = np.asarray(nbytes, dtype=float), np.asarray(times_ms, dtype=float)
    if sizes.shape != times.shape or len(sizes) < 2:
        raise ValueError(f"need at least 2 (size, time) pairs of equal length, got {len(sizes)} sizes "
                         f"and {len(times)} times")
    if np.any(times <= 0) or np.any(sizes <= 0):
        raise ValueError("sizes and times must all be > 0")
    steps = 1.0 if group_size is None else 2.0 * (group_size - 1)
    if group_size is not None and group_size < 2:
        raise ValueError(f"group_size must be >= 2 for an all-reduce fit, got {group_size}")
    volume = sizes if group_size is None else steps / group_size * sizes
    design = np.stack([np.full_like(volume, steps), volume], axis=1) / times[:, None]  # [n, 2]
    (latency_ms, ms_per_byte), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if ms_per_byte <= 0:
        raise ValueError(f"times do not grow with message size ({list(times)} ms); cannot fit a bandwidth")
    return LinkSpec(name=name, latency_us=round(max(float(latency_ms), 0.0) * 1e3, 3),
                    bandwidth_gbs=round(1.0 / (float(ms_per_byte) * 1e6), 4))


def load_link(path: str | Path, kind: str = "p2p") -> LinkSpec:
    """The fitted ``p2p`` or ``allreduce`` link from a commbench JSON file."""
    data = json.loads(Path(path).read_text())
    if kind not in ("p2p", "allreduce") or kind not in data:
        raise ValueError(f"kind must be 'p2p' or 'allreduce' (present in {path}), got {kind!r}")
    if data[kind] is None:
        raise ValueError(f"{path} holds no fitted {kind} link: {data.get(f'{kind}_error')}")
    return LinkSpec.from_dict(data[kind])


def _time_ms(fn, sync, warmup: int, iters: int) -> tuple[float, float]:
    """(median, minimum) of ``iters`` timed calls after ``warmup`` untimed ones."""
    times = []
    for run in range(warmup + iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        if run >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def _measure(sizes: Sequence[int], warmup: int, iters: int) -> dict:
    import torch
    import torch.distributed as dist

    from .groups import init_distributed, pick_device

    device = pick_device("auto")
    init_distributed(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise ValueError(f"commbench needs at least 2 ranks, got world size {world}; launch with --nproc-per-node 2")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    p2p, allreduce = [], []
    for nbytes in sizes:
        buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)  # [nbytes / 4]

        def ping_pong() -> None:
            if rank == 0:
                dist.send(buffer, dst=1)
                dist.recv(buffer, src=1)
            elif rank == 1:
                dist.recv(buffer, src=0)
                dist.send(buffer, dst=0)

        dist.barrier()
        round_trip = _time_ms(ping_pong, sync, warmup, iters)
        dist.barrier()
        mine = torch.tensor(_time_ms(lambda: dist.all_reduce(buffer), sync, warmup, iters), device=device)  # [2]
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        p2p.append({"bytes": nbytes, "ms": round_trip[0] / 2, "min_ms": round_trip[1] / 2})
        allreduce.append({"bytes": nbytes, "ms": float(mine[0]), "min_ms": float(mine[1])})
    result = {"rank": rank, "world_size": world, "backend": dist.get_backend(), "device": str(device),
              "p2p": p2p, "allreduce": allreduce}
    dist.barrier()
    dist.destroy_process_group()
    return result


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="workbench.runtime.commbench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    parser.add_argument("--sizes", default=None, help="comma-separated message sizes in bytes (default 1 KiB..16 MiB)")
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions per size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repetitions per size")
    parser.add_argument("--name", default="measured", help="name of the fitted links")
    args = parser.parse_args(argv)
    try:
        args.sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else DEFAULT_SIZES
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if len(args.sizes) < 2 or min(args.sizes) < 4:
        parser.error(f"--sizes needs at least 2 sizes of >= 4 bytes, got {args.sizes}")
    if args.iters < 1 or args.warmup < 0:
        parser.error(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    return args


def main(argv: Sequence[str] | None = None) -> dict | None:
    """Entry point under torchrun; rank 0 writes ``--out`` and returns the result."""
    args = _parse(argv)
    measured = _measure(args.sizes, args.warmup, args.iters)
    if measured["rank"] != 0:
        return None
    result = {
        "version": COMMBENCH_VERSION, "world_size": measured["world_size"], "backend": measured["backend"],
        "device": measured["device"], "threads": os.environ.get("OMP_NUM_THREADS"),
        "fitted_on": "min_ms", "measurements": {"p2p": measured["p2p"], "allreduce": measured["allreduce"]},
    }
    for kind, group_size in (("p2p", None), ("allreduce", measured["world_size"])):
        series = measured[kind]
        try:
            link = fit_link([m["bytes"] for m in series], [m["min_ms"] for m in series], f"{args.name}-{kind}",
                            group_size=group_size)
            result[kind] = link.to_dict()
        except ValueError as exc:
            result[kind] = None
            result[f"{kind}_error"] = str(exc)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"commbench: p2p {result['p2p']}  allreduce {result['allreduce']}  -> {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
