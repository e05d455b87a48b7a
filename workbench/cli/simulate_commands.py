"""``workbench simulate``: time a pipeline schedule and print its metrics, figure or trace."""

from __future__ import annotations

import argparse

from ..core.plan import PIPELINE_KINDS, GroPipe, ParallelPlan
from ..core.topology import Topology
from .result import Result

SCHEDULES = (*(k for k in PIPELINE_KINDS if k not in ("none", "torch")), "dp")


def _plan(args: argparse.Namespace) -> ParallelPlan:
    """The plan the flags describe: a pipeline kind with its options, or ``dp`` (data parallelism)."""
    if args.schedule == "dp":
        return ParallelPlan(Topology(dp=args.groups))
    replicas = args.groups if args.schedule == GroPipe.kind else 1
    return ParallelPlan.for_pipeline(args.schedule, args.stages, args.microbatches, groups=replicas,
                                     chunks=args.chunks, inner=args.inner, delay=args.delay)


def _build_schedule(args: argparse.Namespace):
    plan = _plan(args)
    many = plan.iterates_across_steps or isinstance(plan.pipeline, GroPipe)
    return plan.schedule(num_iterations=args.iterations if many else 1, num_buckets=args.buckets)


def _stage_costs(args: argparse.Namespace, schedule, cluster):
    from ..core.costs import ModelCosts
    from ..core.partition import Partition
    from ..planning.ampa import ampa
    from ..scheduling.stagecosts import StageCosts

    if args.costs is None:
        if args.partition:
            raise ValueError("--partition needs --costs (a ModelCosts JSON file)")
        return None
    costs = ModelCosts.load(args.costs)
    num_stages = schedule.num_stages
    plan = _plan(args)
    dp = plan.num_virtual_stages == 1
    microbatches = 1 if dp else args.microbatches
    if costs.batch_size % microbatches:
        raise ValueError(f"--microbatches {microbatches} does not divide the profile's batch of {costs.batch_size}")
    if dp:
        part = Partition.uniform(costs.num_layers, 1)
    elif args.partition:
        part = Partition.parse(args.partition, costs.num_layers)
        if part.num_stages != num_stages:
            raise ValueError(f"--partition has {part.num_stages} stages but the {args.schedule} schedule needs "
                             f"{num_stages}")
    else:
        part = ampa(costs, num_stages, num_microbatches=microbatches, schedule=plan.memory_schedule,
                    memory_cap_bytes=10**18).partition
    return StageCosts.from_model(costs, part, costs.batch_size // microbatches,
                                 device=cluster.device if cluster else None)


def _simulate(args: argparse.Namespace) -> Result:
    from ..planning.clusters import collective_link, get_cluster
    from ..scheduling.passes import lower
    from ..scheduling.simulate import simulate
    from ..scheduling.validate import validate

    for name in ("stages", "microbatches", "groups", "chunks", "iterations", "buckets"):
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    cluster = get_cluster(args.cluster) if args.cluster else None
    schedule = _build_schedule(args)
    validate(lower(schedule))
    costs = _stage_costs(args, schedule, cluster)
    result = simulate(schedule, costs, cluster, collective_link=collective_link(args.cluster) if args.cluster else None)
    m = result.metrics
    data = {**m, "memory": result.memory}
    if args.html:
        from ..viz.timeline import timeline_figure

        title = f"{args.schedule}: {m['iteration_ms']:.3f} ms per iteration"
        timeline_figure(result.timeline, title=title).write_html(args.html, include_plotlyjs="cdn")
        data["html"] = args.html
    if args.trace:
        result.timeline.save_chrome_trace(args.trace)
        data["trace"] = args.trace
    lines = [f"{args.schedule}: {m['num_ranks']} ranks, iteration {m['iteration_ms']:.3f} ms, "
             f"throughput {m['throughput']:.2f} {m['throughput_unit']}",
             f"bubble = {m['bubble_definition']}",
             f"{'rank':>4} {'bubble':>8} {'exposed comm ms':>16} {'peak memory MiB':>16}"]
    for r in range(m["num_ranks"]):
        lines.append(f"{r:>4} {m['bubble_fraction'][r]:>8.4f} {m['exposed_comm_ms'][r]:>16.3f} "
                     f"{m['peak_memory_bytes'][r] / 2**20:>16.1f}")
    if m["comm_bytes_by_link"]:
        lines.append("communication: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in m["comm_bytes_by_link"].items()))
    lines += [f"wrote {data[k]}" for k in ("html", "trace") if k in data]
    return Result("\n".join(lines), data)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("simulate", parents=[common], help="simulate a pipeline schedule and report its metrics")
    p.add_argument("--schedule", required=True, choices=SCHEDULES)
    p.add_argument("--stages", type=int, default=2, help="pipeline stages (ranks per pipeline)")
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per iteration")
    p.add_argument("--groups", type=int, default=2, help="gropipe groups / data-parallel ranks")
    p.add_argument("--chunks", type=int, default=2, help="interleaved: virtual stages per rank")
    p.add_argument("--delay", type=int, default=0, choices=[0, 1], help="gropipe: all-reduce delay in iterations")
    p.add_argument("--inner", default="1f1b", choices=["1f1b", "gpipe"], help="gropipe: schedule inside a group")
    p.add_argument("--iterations", type=int, default=1, help="async / gropipe: iterations to simulate")
    p.add_argument("--buckets", type=int, default=4, help="dp: gradient buckets")
    p.add_argument("--costs", help="ModelCosts JSON; without it every stage costs the same and communication is free")
    p.add_argument("--partition", help="stage partition such as '0-3|4-9' (default: AMPA's)")
    p.add_argument("--cluster", help="cluster preset, e.g. local-cpu, 8xV100-PCIe, 2x8xH100-IB")
    p.add_argument("--html", help="write the timeline figure to this HTML file")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace JSON to this file")
    p.set_defaults(handler=_simulate)
