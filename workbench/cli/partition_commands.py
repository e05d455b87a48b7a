"""``workbench partition``: cut a profiled model into pipeline stages and show the cost of each."""

from __future__ import annotations

import argparse

from .result import Result

GIB = 2**30


def _partition(args: argparse.Namespace) -> Result:
    from ..core.costs import ModelCosts
    from ..planning.costs.clusters import get_cluster
    from ..planning.partitioning.partitioners import partition

    costs = ModelCosts.load(args.costs)
    if args.memory_cap is not None and args.memory_cap <= 0:
        raise ValueError(f"--memory-cap must be > 0 GiB, got {args.memory_cap}")
    if args.algorithm == "manual" and not args.partition:
        raise ValueError("--algorithm manual needs --partition, e.g. --partition '0-3|4-9|10-15'")
    cap = int(args.memory_cap * GIB) if args.memory_cap is not None else None
    cluster = get_cluster(args.cluster) if args.cluster else None
    result = partition(costs, args.stages, args.algorithm, num_microbatches=args.microbatches, schedule=args.schedule,
                       memory_cap_bytes=cap, cluster=cluster, text=args.partition)
    data = result.to_dict()
    lines = [f"{data['partition']}   ({args.algorithm}, {args.schedule}, {result.num_microbatches} micro-batches of "
             f"{result.microbatch_size}; bottleneck stage {result.bottleneck_stage}: {result.bottleneck_ms:.3f} ms)",
             f"{'stage':>5} {'layers':>11} {'fwd ms':>9} {'bwd ms':>9} {'comm ms':>9} {'memory GiB':>11}"]
    for k, stage in enumerate(data["stages"]):
        mark = "  <- bottleneck" if k == result.bottleneck_stage else ""
        lines.append(f"{k:>5} {stage['layers'][0]:>5}-{stage['layers'][1]:<5} {stage['forward_ms']:>9.3f} "
                     f"{stage['backward_ms']:>9.3f} {stage['comm_ms']:>9.3f} {stage['memory_bytes'] / GIB:>11.3f}{mark}")
    lines.append(f"projected iteration: {result.projected_iteration_ms:.3f} ms")
    return Result("\n".join(lines), data)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("partition", parents=[common], help="partition a profiled model into pipeline stages")
    p.add_argument("costs", help="ModelCosts JSON file (per-layer profile)")
    p.add_argument("--stages", type=int, required=True, help="number of pipeline stages")
    p.add_argument("--algorithm", default="ampa", choices=["ampa", "uniform", "params", "time", "pipedream", "manual"])
    p.add_argument("--partition", help="manual partition text such as '0-3|4-9|10-15' (with --algorithm manual)")
    p.add_argument("--microbatches", type=int, default=1, help="micro-batches the profile's batch is split into")
    p.add_argument("--schedule", default="1f1b", metavar="KIND",
                   help="pipeline kind whose schedule's in-flight activations and weight versions count against "
                        "memory (1f1b, gpipe, zbh2, async, ...; default 1f1b)")
    p.add_argument("--memory-cap", type=float, help="per-device memory cap in GiB (default: the cluster's device)")
    p.add_argument("--cluster", help="cluster preset for link and device numbers, e.g. 8xV100-PCIe")
    p.set_defaults(handler=_partition)
