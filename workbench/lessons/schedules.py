"""Lesson 02, pipeline schedules: the zero-bubble schedules on uniform stages and on a profiled model, their
real runs against the simulation, and the sentences that compare them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ..core.costs import ModelCosts
from ..core.partition import Partition
from ..core.plan import ParallelPlan
from ..scheduling import StageCosts, simulate
from ..scheduling.registry import schedule_for
from .runs import median_step_ms, rank_losses
from .text import text_table


class UniformRun(NamedTuple):
    """One zero-bubble kind simulated on F = I = W = 1 ms."""

    result: Any  # the SimulationResult
    bubble_ms: float  # the flushed iteration's idle time per rank: makespan - M (F + I + W)
    steady_ms: float  # the worst rank's idle time between its first and last pass
    peak: float  # the most micro-batches' activations a rank holds at once


def zero_bubble_uniform(stages: int, microbatches: int, kind: str) -> UniformRun:
    """Plan ``pp<stages>-<kind>-m<microbatches>`` simulated with F = I = W = 1 ms a stage (a V-shaped kind's
    chunk is half a stage, so every rank has the same work) and 2 bytes of activations per stage and micro-batch."""
    plan = ParallelPlan.parse(f"pp{stages}-{kind}-m{microbatches}")
    c = plan.chunks
    unit = StageCosts.uniform(plan.num_virtual_stages, forward_ms=1.0 / c, input_grad_ms=1.0 / c,
                              weight_grad_ms=1.0 / c, activation_bytes=2 // c)
    result = simulate(schedule_for(plan), unit)
    bubble = result.metrics["makespan_ms"] - microbatches * 3.0  # a rank computes M x (F + I + W)
    steady = max(result.metrics["steady_bubble_ms"])
    peak = max(row["activations"] for row in result.memory) / 2
    return UniformRun(result, bubble, steady, peak)


def zero_bubble_table(runs: Mapping[str, UniformRun], formulas: Mapping[str, tuple[str, float, int]]) -> str:
    """Per kind: the simulated bubble and steady bubble, the formula (``(text, ms, peak micro-batches)``) and the
    simulated peak."""
    rows = [(kind, run.bubble_ms, run.steady_ms, formulas[kind][0], formulas[kind][1], run.peak, formulas[kind][2])
            for kind, run in runs.items()]
    return text_table(["kind", "bubble ms", "steady ms", "formula", "= ms", "peak", "formula"], rows,
                      ["<6", ">11.2f", ">11.2f", ">15", ">6.1f", ">6.1f", ">9"])


class BackwardCost(NamedTuple):
    """A profile's whole forward, fused backward and split backward (input gradient + weight gradient), in ms."""

    forward_ms: float
    fused_ms: float
    split_ms: float

    @property
    def ratio(self) -> float:
        """The split backward's time over the fused one's."""
        return self.split_ms / self.fused_ms


def backward_cost(profile: ModelCosts) -> BackwardCost:
    """What the backward costs in ``profile``, fused and split into I + W."""
    return BackwardCost(sum(layer.forward_ms for layer in profile.layers),
                        sum(layer.backward_ms for layer in profile.layers),
                        sum(layer.input_grad_ms + layer.weight_grad_ms for layer in profile.layers))


def backward_cost_text(profile: ModelCosts, microbatch: int) -> str:
    cost = backward_cost(profile)
    return (f"{profile.num_layers} layers at micro-batch {microbatch}: forward {cost.forward_ms:.2f} ms, "
            f"backward {cost.fused_ms:.2f} ms, I + W {cost.split_ms:.2f} ms ({cost.ratio:.2f} x the fused backward)")


def simulate_from_profile(profile: ModelCosts, plans: Mapping[str, ParallelPlan], microbatch: int, *,
                          optimizer: str = "sgd") -> dict[str, float]:
    """Each plan's simulated iteration in ms: the profile cut uniformly into the plan's virtual stages, costed
    at ``microbatch`` samples, and its schedule built for those costs (zb-auto builds its own from them)."""
    out = {}
    for kind, plan in plans.items():
        partition = Partition.uniform(profile.num_layers, plan.num_virtual_stages)
        stage_costs = StageCosts.from_model(profile, partition, microbatch, optimizer=optimizer)
        out[kind] = simulate(schedule_for(plan, stage_costs=stage_costs), stage_costs).metrics["iteration_ms"]
    return out


def measured_runs(jobs: Mapping[str, Any], from_step: int = 2) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Per run: the median step time from ``from_step`` on (each step timed by its slower rank), and the losses
    the last rank (which computes the loss) reported, in step order."""
    measured, losses = {}, {}
    for kind, job in jobs.items():
        frame = job.metrics()
        measured[kind] = median_step_ms(frame, from_step)
        losses[kind] = rank_losses(frame, int(frame["rank"].max()))
    return measured, losses


def measured_table(measured: Mapping[str, float], simulated: Mapping[str, float], baseline: str = "1f1b") -> str:
    """Measured and simulated step times, their ratio, and each plan's speed against ``baseline``'s."""
    rows = [(kind, measured[kind], simulated[kind], simulated[kind] / measured[kind],
             measured[baseline] / measured[kind]) for kind in measured]
    return text_table(["kind", "measured ms", "simulated ms", "sim / meas", "vs 1F1B"], rows,
                      ["<7", ">12.2f", ">14.2f", ">11.2f", ">9.3f"])


def zero_bubble_summary(cost: BackwardCost, measured: Mapping[str, float], simulated: Mapping[str, float]) -> str:
    """What the real runs said: the split's price, ZB-H1 against 1F1B measured and simulated, the fastest plan,
    and how close the simulation came to every measured step."""
    best = min(measured, key=measured.get)
    h1_measured = measured["1f1b"] / measured["zbh1"]
    h1_simulated = simulated["1f1b"] / simulated["zbh1"]
    errors = {kind: abs(simulated[kind] / measured[kind] - 1) for kind in measured}
    return (
        f"On this machine the split backward costs **{cost.ratio:.2f} x** the fused one in the profile. "
        f"ZB-H1 ran at **{h1_measured:.2f} x** 1F1B's speed (the simulation from the profile said "
        f"{h1_simulated:.2f} x): "
        + ("the bubble it saves outweighs what the split costs. " if h1_measured > 1 else
           "what the split costs outweighs the bubble it saves at this size. ")
        + f"The fastest plan measured was **{best}** ({measured[best]:.1f} ms per step). "
        f"The simulation was within {100 * max(errors.values()):.0f}% of every measured step "
        f"(worst: {max(errors, key=errors.get)}). Every plan trained on the same losses as 1F1B to within 1e-4.")
