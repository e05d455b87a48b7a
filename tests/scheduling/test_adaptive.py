"""Micro-batches in flight for the async pipeline: the generator's caps and the adaptive choice."""

from __future__ import annotations

import pytest

from workbench.scheduling import generators as g
from workbench.scheduling.adaptive import choose_inflight, evaluate_inflight
from workbench.scheduling.memory import in_flight_by_stage, memory_breakdown
from workbench.scheduling.passes import lower
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts
from workbench.scheduling.validate import validate


@pytest.mark.parametrize("inflight", [None, 1, 2, 3, (3, 2, 2, 1), (2, 2, 1, 1)])
@pytest.mark.parametrize("mode", ["stash", "2bw"])
def test_capped_streams_are_valid_and_hold_the_cap(inflight, mode):
    s = g.async_1f1b(4, 4, 3, inflight=inflight, mode=mode)
    validate(lower(s))
    caps = g.async_inflight(4, inflight)
    assert in_flight_by_stage(s) == dict(enumerate(caps))
    for rank in range(4):
        for a in s.actions(rank):
            if a.op.value == "F" and mode == "2bw":
                assert a.version == max(0, a.iteration - 1)


def test_one_in_flight_is_sequential_and_always_uses_the_newest_weights():
    s = g.async_1f1b(3, 2, 3, inflight=1)
    for rank in range(3):
        kinds = [a.op.value for a in s.actions(rank) if a.op.value in ("F", "B")]
        assert kinds == ["F", "B"] * 6
        assert all(a.version == a.iteration for a in s.actions(rank) if a.op.value == "F")
    assert [r["stashed_weights"] for r in memory_breakdown(s, StageCosts.uniform(3, param_bytes=100))] == [0, 0, 0]


def test_vertical_sync_uses_stage_zeros_version_everywhere():
    s = g.async_1f1b(4, 4, 3, vertical_sync=True)
    first = {(a.iteration, a.microbatch): a.version for a in s.actions(0) if a.op.value == "F"}
    for rank in range(4):
        assert all(a.version == first[(a.iteration, a.microbatch)] for a in s.actions(rank) if a.op.value in "FB")
    stashed = [r["stashed_weights"] for r in memory_breakdown(s, StageCosts.uniform(4, param_bytes=1))]
    assert stashed == [1, 1, 1, 1]  # the last stage now runs micro-batches on stage 0's older version


def test_grouped_async_adds_allreduce_before_each_step():
    s = g.async_1f1b(2, 2, 2, num_groups=2)
    assert s.num_ranks == 4 and s.meta.dp_groups == ((0, 2), (1, 3))
    ops = [a.op.value for a in s.actions(3)]
    assert [ops[i + 1] for i, op in enumerate(ops) if op == "AR"] == ["STEP", "STEP"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"inflight": 0}, "inflight"),
    ({"inflight": (1, 2, 1, 1)}, r"inflight\[1\] = 2 exceeds"),
    ({"inflight": (2, 2)}, "one entry per stage"),
    ({"mode": "3bw"}, "mode"),
    ({"mode": "2bw", "vertical_sync": True}, "vertical_sync"),
])
def test_bad_async_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        g.async_1f1b(4, 4, 2, **kwargs)


def test_2bw_needs_microbatches_at_least_the_depth():
    with pytest.raises(ValueError, match="num_microbatches .3. must be >= num_stages .4."):
        g.async_1f1b(4, 3, 2, mode="2bw")


def test_without_memory_cap_the_full_depth_wins_on_uniform_stages():
    costs = StageCosts.uniform(4, param_bytes=10**6, activation_bytes=10**6)
    choice = choose_inflight(costs, 4)
    assert choice.inflight == (4, 3, 2, 1)
    assert choice.iteration_ms == min(c["iteration_ms"] for c in choice.candidates)
    assert "*" in choice.table()


def test_memory_cap_lowers_the_caps_to_what_the_memory_model_says_fits():
    costs = StageCosts.uniform(4, param_bytes=10**6, activation_bytes=10**6)
    full = evaluate_inflight(costs, 4, (4, 3, 2, 1))
    cap = max(full["peak_bytes"]) - 1
    choice = choose_inflight(costs, 4, memory_cap_bytes=cap)
    assert choice.inflight != (4, 3, 2, 1) and max(choice.peak_bytes) <= cap
    fitting = [c for c in choice.candidates if c["fits"]]
    assert choice.iteration_ms == min(c["iteration_ms"] for c in fitting)
    schedule = g.async_1f1b(4, 4, 4, inflight=choice.inflight)
    assert max(r["peak"] for r in memory_breakdown(schedule, costs)) == max(choice.peak_bytes)


def test_a_slow_last_stage_needs_less_depth_upstream():
    """When the last stage dominates, running further ahead upstream buys nothing: fewer in flight is chosen."""
    costs = StageCosts(forward_ms=(1.0, 1.0, 1.0, 6.0), backward_ms=(2.0, 2.0, 2.0, 12.0), send_bytes=(0,) * 4,
                       param_bytes=(10**6,) * 4, grad_bytes=(10**6,) * 4, optimizer_bytes=(0,) * 4,
                       activation_bytes=(10**6,) * 4)
    choice = choose_inflight(costs, 4)
    assert sum(choice.inflight) < sum((4, 3, 2, 1))
    full = simulate(g.async_1f1b(4, 4, 4), costs).metrics["iteration_ms"]
    assert choice.iteration_ms <= full * 1.02


def test_nothing_fits_names_the_memory_needed():
    costs = StageCosts.uniform(2, param_bytes=10**6, activation_bytes=10**6)
    with pytest.raises(ValueError, match="even one in flight per stage needs"):
        choose_inflight(costs, 4, memory_cap_bytes=1000)
