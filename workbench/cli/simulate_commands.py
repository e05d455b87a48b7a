"""``workbench simulate``: time a pipeline schedule and print its metrics, figure or trace."""

from __future__ import annotations

import argparse

from ..core.plan import ParallelPlan
from ..scheduling.registry import schedule_for
from .result import Result


def _plan(args: argparse.Namespace) -> ParallelPlan:
    """The plan ``--plan`` names (any plan name ``ParallelPlan.parse`` reads)."""
    return ParallelPlan.parse(args.plan)


def _build_schedule(args: argparse.Namespace, stage_costs=None):
    plan = _plan(args)
    many = plan.iterates_across_steps or plan.delayed_update
    return schedule_for(plan, num_iterations=args.iterations if many else 1, num_buckets=args.buckets,
                        stage_costs=stage_costs)


def _stage_costs(args: argparse.Namespace, cluster):
    from ..core.costs import ModelCosts
    from ..core.partition import Partition
    from ..planning.partitioning.ampa import ampa
    from ..scheduling.registry import stage_memory
    from ..scheduling.stagecosts import StageCosts

    if args.costs is None:
        if args.partition:
            raise ValueError("--partition needs --costs (a ModelCosts JSON file)")
        return None
    costs = ModelCosts.load(args.costs)
    plan = _plan(args)
    num_stages = plan.num_virtual_stages
    dp = plan.num_virtual_stages == 1
    microbatches = 1 if dp else plan.microbatches
    if costs.batch_size % microbatches:
        raise ValueError(f"plan {plan.name!r}: {microbatches} micro-batches do not divide the profile's batch of "
                         f"{costs.batch_size}")
    if dp:
        part = Partition.uniform(costs.num_layers, 1)
    elif args.partition:
        part = Partition.parse(args.partition, costs.num_layers)
        if part.num_stages != num_stages:
            raise ValueError(f"--partition has {part.num_stages} stages but plan {plan.name!r} needs {num_stages}")
    else:
        part = ampa(costs, num_stages, num_microbatches=microbatches, schedule=stage_memory(plan),
                    memory_cap_bytes=10**18).partition
    return StageCosts.from_model(costs, part, costs.batch_size // microbatches,
                                 device=cluster.device if cluster else None)


def _simulate(args: argparse.Namespace) -> Result:
    from ..planning.costs.clusters import get_cluster
    from ..scheduling.passes import lower
    from ..scheduling.simulate import simulate
    from ..scheduling.validate import validate

    for name in ("iterations", "buckets"):
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    cluster = get_cluster(args.cluster) if args.cluster else None
    costs = _stage_costs(args, cluster)
    schedule = _build_schedule(args, costs)
    validate(lower(schedule))
    result = simulate(schedule, costs, cluster)
    m = result.metrics
    data = {**m, "memory": result.memory}
    if args.html:
        from ..viz.timeline import timeline_figure

        title = f"{args.plan}: {m['iteration_ms']:.3f} ms per iteration"
        timeline_figure(result.timeline, title=title).write_html(args.html, include_plotlyjs="cdn")
        data["html"] = args.html
    if args.trace:
        result.timeline.save_chrome_trace(args.trace)
        data["trace"] = args.trace
    lines = [f"{args.plan}: {m['num_ranks']} ranks, iteration {m['iteration_ms']:.3f} ms, "
             f"throughput {m['throughput']:.2f} {m['throughput_unit']}",
             f"bubble = {m['bubble_definition']}",
             f"{'rank':>4} {'bubble':>8} {'inside ms':>10} {'exposed comm ms':>16} {'peak memory MiB':>16}"]
    for r in range(m["num_ranks"]):
        lines.append(f"{r:>4} {m['bubble_fraction'][r]:>8.4f} {m['steady_bubble_ms'][r]:>10.3f} "
                     f"{m['exposed_comm_ms'][r]:>16.3f} {m['peak_memory_bytes'][r] / 2**20:>16.1f}")
    if m["comm_bytes_by_link"]:
        lines.append("communication: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in m["comm_bytes_by_link"].items()))
    lines += [f"wrote {data[k]}" for k in ("html", "trace") if k in data]
    return Result("\n".join(lines), data)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("simulate", parents=[common], help="simulate a pipeline schedule and report its metrics")
    p.add_argument("--plan", required=True, help="a plan name, e.g. pp4-1f1b-m8, pp4-zbh1-m8, pp2-zbv-m4, "
                   "gropipe-2x4-zbh1-m8-d1, async-1x4-m8, dp4")
    p.add_argument("--iterations", type=int, default=1,
                   help="iterations to simulate for plans that stream them (async) or delay their update (GroPipe d1)")
    p.add_argument("--buckets", type=int, default=4, help="dp: gradient buckets")
    p.add_argument("--costs", help="ModelCosts JSON; without it every stage costs the same and communication is free")
    p.add_argument("--partition", help="stage partition such as '0-3|4-9' (default: AMPA's)")
    p.add_argument("--cluster", help="cluster preset, e.g. local-cpu, 8xV100-PCIe, 2x8xH100-IB")
    p.add_argument("--html", help="write the timeline figure to this HTML file")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace JSON to this file")
    p.set_defaults(handler=_simulate)
