"""Lesson 04's helpers: GroPipe simulated with either delay, the all-reduce hidden under the next iteration, and
the sentences about the real runs."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.core.plan import ParallelPlan
from workbench.core.timeline import Event, Timeline
from workbench.lessons.gropipe import (HiddenAllReduce, core_sharing_text, delay_comparison_text, hidden_allreduce,
                                       hidden_allreduce_text, longest_allreduce_rank, loss_comparison_text,
                                       simulate_gropipe, throughput_text)
from workbench.planning import get_cluster
from workbench.scheduling import StageCosts

PLAN = ParallelPlan.parse("gropipe-2x2-1f1b-m4-d1")
COSTS = StageCosts.uniform(2, forward_ms=1.0, backward_ms=2.0, param_bytes=200_000_000)
CLUSTER = get_cluster("8xV100-PCIe")


def test_one_iteration_takes_as_long_with_either_delay_and_several_are_faster_with_the_delay():
    one = {d: simulate_gropipe(PLAN, COSTS, CLUSTER, delay=d) for d in (0, 1)}
    assert one[0].metrics["iteration_ms"] == pytest.approx(one[1].metrics["iteration_ms"], rel=1e-6)
    four = {d: simulate_gropipe(PLAN, COSTS, CLUSTER, delay=d, iterations=4) for d in (0, 1)}
    assert four[1].metrics["makespan_ms"] < four[0].metrics["makespan_ms"]
    assert {1, 2, 3, 4} <= {e.iteration for e in four[1].timeline.events}  # numbered from 1, as the runtime does


def test_each_all_reduce_but_the_last_hides_under_the_next_iteration():
    timeline = simulate_gropipe(PLAN, COSTS, CLUSTER, delay=1, iterations=4).timeline
    rank = longest_allreduce_rank(timeline)
    hidden = hidden_allreduce(timeline, rank)
    assert [h.iteration for h in hidden] == [1, 2, 3, 4]
    assert all(h.under_ms > 0 for h in hidden[:-1]) and hidden[-1].under_ms == 0
    assert all(h.under_ms <= h.end - h.start + 1e-9 for h in hidden)
    lines = hidden_allreduce_text(hidden, rank).splitlines()
    assert len(lines) == 4 and f"under iteration 2's forward and backward passes" in lines[0]
    assert lines[-1].endswith(": the last iteration, nothing after it to hide behind")


def test_the_hidden_time_is_the_overlap_with_the_next_iterations_passes():
    events = [Event(0, 0, "AR", 10.0, 20.0, iteration=1), Event(0, 0, "F", 12.0, 15.0, microbatch=0, iteration=2),
              Event(0, 0, "B", 18.0, 25.0, microbatch=0, iteration=2), Event(0, 0, "F", 5.0, 11.0, microbatch=1,
                                                                              iteration=1),
              Event(1, 1, "AR", 10.0, 30.0, iteration=1), Event(2, 0, "AR", 10.0, 30.0, iteration=1)]
    timeline = Timeline(events)
    assert hidden_allreduce(timeline, 0) == [HiddenAllReduce(1, 10.0, 20.0, 5.0)]  # 3 ms of F, 2 of B; not iteration 1
    assert longest_allreduce_rank(timeline) == 1  # ranks 1 and 2 tie: the lower


def test_the_core_sharing_sentence_splits_the_gap():
    text = core_sharing_text(alone=10.0, shared=25.0, measured=40.0, processes=4, cores=2)
    assert "predicts **10.0 ms** an iteration; the run measured **40.0 ms**, 4.0x that" in text
    assert "Sharing the 2 cores among 4 processes" in text and "predicts **25.0 ms** (2.5x the profile)" in text
    assert "a factor of 1.60 between the shared-core estimate and the measurement" in text


def test_the_loss_sentence_says_which_run_ends_higher_and_by_how_much():
    higher = loss_comparison_text([2.3, 1.0, 0.9, 0.8], [2.3, 0.5, 0.4, 0.3], steps=4, delay=1)
    assert "Both start from the same loss (2.300). After 4 steps" in higher
    assert "**0.900** for GroPipe with delay 1 and **0.400** for DDP: GroPipe ends higher by 0.500, 2.3x DDP's loss." in higher
    lower = loss_comparison_text([2.3, 0.3, 0.3, 0.3], [2.3, 0.6, 0.6, 0.6], steps=4, delay=0)
    assert "GroPipe ends lower by 0.300. Both fell" in lower
    assert throughput_text({"GroPipe": 120.0, "DDP": 100.0}).startswith(
        "median throughput: GroPipe 120 samples/s, DDP 100 samples/s (ratio 1.20;")


def _evals(train_s, accuracy):
    return pd.DataFrame({"step": [5, 10], "train_s": train_s, "accuracy": accuracy})


def test_the_delay_sentence_compares_steps_and_seconds_to_the_target():
    evals = {"GroPipe, delay 0": _evals([1.0, 2.0], [0.5, 0.8]), "GroPipe, delay 1": _evals([0.8, 1.6], [0.4, 0.8]),
             "DDP": _evals([2.0, 4.0], [0.5, 0.8])}
    reach = {"GroPipe, delay 0": {"reached": True, "step": 5, "train_s": 1.0},
             "GroPipe, delay 1": {"reached": True, "step": 10, "train_s": 1.6}, "DDP": {"reached": False}}
    text = delay_comparison_text(evals, reach, steps=10)
    assert text.startswith("A step took 200 ms (GroPipe, delay 0), 160 ms (GroPipe, delay 1) and 400 ms (DDP) on "
                           "average.")
    assert "Delay 1 needed 2.0x the steps of delay 0 and 1.60x its training seconds: the hidden all-reduce did not " \
           "make up for the late gradients." in text
    assert text.endswith("their evaluated accuracies are equal at every evaluation.")
    reach["GroPipe, delay 1"] = {"reached": False}
    evals["DDP"] = _evals([2.0, 4.0], [0.5, 0.75])
    text = delay_comparison_text(evals, reach, steps=10)
    assert "Delay 1 needed" not in text and text.endswith("differ by at most 0.050.")
