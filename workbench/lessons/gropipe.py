"""Lesson 04, GroPipe: the grouped pipeline simulated with either all-reduce delay, how much of each all-reduce
hides under the next iteration, and the sentences that set the real runs against the estimates and DDP."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..core.timeline import Timeline
from ..scheduling import StageCosts, schedule_for, simulate
from .text import listing


def simulate_gropipe(plan: Any, stage_costs: StageCosts, cluster: Any, *, delay: int, iterations: int = 1):
    """``iterations`` iterations of the GroPipe ``plan`` with all-reduce delay ``delay`` (its inner schedule
    kept), simulated with ``stage_costs``; the all-reduces run on the cluster's collective link."""
    pipeline = dataclasses.replace(plan.pipeline, delay=delay)
    schedule = schedule_for(plan.replace(pipeline=pipeline), first_iteration=1, num_iterations=iterations)
    return simulate(schedule, stage_costs, cluster)


class HiddenAllReduce(NamedTuple):
    """One all-reduce of one rank: its iteration, start and end (ms), and the ms of the next iteration's forward
    and backward passes that run on that rank while it is in flight."""

    iteration: int
    start: float
    end: float
    under_ms: float


def hidden_allreduce(timeline: Timeline, rank: int) -> list[HiddenAllReduce]:
    """Per all-reduce of ``rank``, in order: how much of the next iteration's compute runs under it."""
    out = []
    for ar in (e for e in timeline.events if e.rank == rank and e.op == "AR"):
        after = [e for e in timeline.events
                 if e.rank == rank and e.op in ("F", "B") and e.iteration == ar.iteration + 1]
        out.append(HiddenAllReduce(ar.iteration, ar.start, ar.end,
                                   sum(max(0.0, min(ar.end, e.end) - max(ar.start, e.start)) for e in after)))
    return out


def longest_allreduce_rank(timeline: Timeline) -> int:
    """The rank whose longest all-reduce is the longest of all."""
    longest: dict[int, float] = {}
    for e in timeline.events:
        if e.op == "AR":
            longest[e.rank] = max(longest.get(e.rank, 0.0), e.duration)
    return max(sorted(longest), key=longest.get)  # the lowest such rank on a tie


def hidden_allreduce_text(hidden: Sequence[HiddenAllReduce], rank: int) -> str:
    """One line per all-reduce of ``rank``: when it runs and how much of it the next iteration hides."""
    lines = []
    for h in hidden:
        lines.append(f"rank {rank}: the all-reduce of iteration {h.iteration} runs {h.start:.1f}-{h.end:.1f} ms"
                     + (f", {h.under_ms:.1f} ms of it under iteration {h.iteration + 1}'s forward and backward passes"
                        if h.under_ms else ": the last iteration, nothing after it to hide behind"))
    return "\n".join(lines)


def core_sharing_text(*, alone: float, shared: float, measured: float, processes: int, cores: int) -> str:
    """The measured iteration against the profile's estimate with a core per process (``alone``) and the
    planner's estimate with ``processes`` sharing ``cores`` cores (``shared``), all in ms."""
    return (
        f"The profile with a core per process predicts **{alone:.1f} ms** an iteration; the run measured "
        f"**{measured:.1f} ms**, {measured / alone:.1f}x that. Sharing the {cores} cores among "
        f"{processes} processes, as the planner's `local` cluster models it with no other work on the "
        f"machine, predicts **{shared:.1f} ms** "
        f"({shared / alone:.1f}x the profile). That leaves a factor of {measured / shared:.2f} between "
        f"the shared-core estimate and the measurement: contention the model does not see (collectives and "
        f"compute competing for the same cores, the processes' scheduling), measured here, not modelled.")


def loss_comparison_text(gropipe: Sequence[float], ddp: Sequence[float], *, steps: int, delay: int) -> str:
    """Where GroPipe's and DDP's losses started and where they ended (the mean of the last three steps)."""
    end = {"GroPipe": sum(gropipe[-3:]) / 3, "DDP": sum(ddp[-3:]) / 3}
    higher = end["GroPipe"] > end["DDP"]
    return (
        f"Both start from the same loss ({gropipe[0]:.3f}). After {steps} steps the mean of the last "
        f"three losses is **{end['GroPipe']:.3f}** for GroPipe with delay {delay} and **{end['DDP']:.3f}** for DDP: "
        + ("GroPipe ends higher" if higher else "GroPipe ends lower")
        + f" by {abs(end['GroPipe'] - end['DDP']):.3f}"
        + (f", {end['GroPipe'] / end['DDP']:.1f}x DDP's loss. " if higher else ". ")
        + "Both fell from their first step (the check below asserts it); a delayed update trades some progress per "
        "step for hiding the all-reduce.")


def throughput_text(throughput: Mapping[str, float]) -> str:
    return (f"median throughput: GroPipe {throughput['GroPipe']:.0f} samples/s, DDP {throughput['DDP']:.0f} "
            f"samples/s (ratio {throughput['GroPipe'] / throughput['DDP']:.2f}; on two shared cores this ranks "
            "nothing, see the text)")


def delay_comparison_text(evals: Mapping[str, Any], reach: Mapping[str, dict], steps: int) -> str:
    """The mean step time of each run, how delay 1 compares with delay 0 in steps and seconds to the target
    (when both reached it), and how far delay 0 and DDP's evaluated accuracies ever were apart."""
    step_ms = {label: 1e3 * frame["train_s"].iloc[-1] / steps for label, frame in evals.items()}
    text = "A step took " + listing([f"{ms:.0f} ms ({label})" for label, ms in step_ms.items()]) + " on average."
    d0, d1 = reach["GroPipe, delay 0"], reach["GroPipe, delay 1"]
    if d0["reached"] and d1["reached"]:
        ratio = d1["train_s"] / d0["train_s"]
        text += (f" Delay 1 needed {d1['step'] / d0['step']:.1f}x the steps of delay 0 and "
                 f"{ratio:.2f}x its training seconds: the hidden all-reduce "
                 + ("did not make up for the late gradients." if ratio > 1 else "paid for the late gradients."))
    gap = (evals["GroPipe, delay 0"]["accuracy"] - evals["DDP"]["accuracy"]).abs().max()
    return text + (" GroPipe with delay 0 and DDP make the same update at every step; their evaluated accuracies "
                   + ("are equal at every evaluation." if gap == 0 else f"differ by at most {gap:.3f}."))
