"""Lesson 02's helpers: the zero-bubble schedules on uniform stages, from a profile, and against measurements."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from workbench.core.costs import LayerCost, ModelCosts
from workbench.core.plan import ParallelPlan
from workbench.lessons.schedules import (backward_cost, backward_cost_text, measured_runs, measured_table,
                                         simulate_from_profile, zero_bubble_summary, zero_bubble_table,
                                         zero_bubble_uniform)

S, M = 4, 8
FORMULAS = {"1f1b": ("(S-1)(F+I+W)", (S - 1) * 3.0, S), "zbh1": ("(S-1)(F+I-W)", (S - 1) * 1.0, S),
            "zbh2": ("0 steady", 0.0, 2 * S - 1), "zbv": ("0 steady", 0.0, S)}


def _profile() -> ModelCosts:
    layers = tuple(LayerCost(f"l{i}", forward_ms=1.0 + i, backward_ms=2.0 + i, input_grad_ms=1.25 + i,
                             weight_grad_ms=1.0, param_bytes=1000, activation_bytes=4000, saved_bytes=4000)
                   for i in range(4))
    return ModelCosts("toy", 8, "cpu", layers)


@pytest.mark.parametrize("kind", sorted(FORMULAS))
def test_uniform_zero_bubble_runs_match_the_textbook(kind):
    run = zero_bubble_uniform(S, M, kind)
    text, value, peak = FORMULAS[kind]
    assert (run.steady_ms if "steady" in text else run.bubble_ms) == pytest.approx(value, abs=1e-9)
    assert run.peak == peak
    assert run.result.metrics["makespan_ms"] == pytest.approx(M * 3.0 + run.bubble_ms)


def test_the_zero_bubble_table_has_a_row_per_kind_with_its_formula():
    runs = {kind: zero_bubble_uniform(S, M, kind) for kind in ("1f1b", "zbh1")}
    lines = zero_bubble_table(runs, FORMULAS).splitlines()
    assert lines[0].split() == ["kind", "bubble", "ms", "steady", "ms", "formula", "=", "ms", "peak", "formula"]
    assert lines[1].split() == ["1f1b", "9.00", "9.00", "(S-1)(F+I+W)", "9.0", "4.0", "4"]
    assert lines[2].split()[0] == "zbh1" and lines[2].split()[1] == "3.00"


def test_backward_cost_sums_the_fused_and_the_split_backward():
    cost = backward_cost(_profile())
    assert (cost.forward_ms, cost.fused_ms, cost.split_ms) == (10.0, 14.0, 15.0)
    assert cost.ratio == pytest.approx(15 / 14)
    assert backward_cost_text(_profile(), 2) == ("4 layers at micro-batch 2: forward 10.00 ms, backward 14.00 ms, "
                                                 "I + W 15.00 ms (1.07 x the fused backward)")


def test_plans_are_simulated_from_the_profile_and_zb_auto_never_loses_to_zb_h1():
    plans = {kind: ParallelPlan.parse(f"pp2-{kind}-m4") for kind in ("1f1b", "zbh1", "zbv", "zbauto")}
    simulated = simulate_from_profile(_profile(), plans, 2)
    assert list(simulated) == list(plans) and all(ms > 0 for ms in simulated.values())
    assert simulated["zbauto"] <= simulated["zbh1"] + 1e-9
    assert simulated["zbh1"] < simulated["1f1b"]  # I and W together cost about the fused backward here


def _job(step_ms_by_rank: dict[int, list[float]], loss_by_rank: dict[int, list[float]]):
    rows = [{"rank": r, "step": s + 1, "step_ms": ms, "loss": loss_by_rank[r][s]}
            for r, times in step_ms_by_rank.items() for s, ms in enumerate(times)]
    return SimpleNamespace(metrics=lambda: pd.DataFrame(rows))


def test_measured_runs_take_the_slower_rank_per_step_and_the_last_ranks_losses():
    jobs = {"1f1b": _job({0: [50, 10, 12, 14], 1: [60, 11, 13, 9]}, {0: [0.0] * 4, 1: [4, 3, 2, 1]}),
            "zbh1": _job({0: [40, 8, 8, 8], 1: [40, 9, 9, 7]}, {0: [0.0] * 4, 1: [4, 3, 2, 1]})}
    measured, losses = measured_runs(jobs, from_step=2)
    assert measured == {"1f1b": 13.0, "zbh1": 9.0}
    assert losses == {"1f1b": [4, 3, 2, 1], "zbh1": [4, 3, 2, 1]}
    lines = measured_table(measured, {"1f1b": 13.0, "zbh1": 11.7}).splitlines()
    assert lines[2].split() == ["zbh1", "9.00", "11.70", "1.30", "1.444"]


def test_the_summary_says_which_way_the_split_went_and_how_close_the_simulation_was():
    cost = backward_cost(_profile())
    faster = zero_bubble_summary(cost, {"1f1b": 10.0, "zbh1": 8.0}, {"1f1b": 11.0, "zbh1": 10.0})
    assert "**1.07 x** the fused one" in faster and "ZB-H1 ran at **1.25 x** 1F1B's speed" in faster
    assert "said 1.10 x" in faster and "the bubble it saves outweighs" in faster
    assert "fastest plan measured was **zbh1** (8.0 ms per step)" in faster
    assert "within 25% of every measured step (worst: zbh1)" in faster
    slower = zero_bubble_summary(cost, {"1f1b": 10.0, "zbh1": 12.0}, {"1f1b": 10.0, "zbh1": 12.0})
    assert "what the split costs outweighs the bubble" in slower and "within 0%" in slower
