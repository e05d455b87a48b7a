"""Processor sharing: ranks time-sharing a node's cores, in the simulator and in measured timelines."""

from __future__ import annotations

import pytest

from workbench.core.timeline import Event, Timeline
from workbench.scheduling import generators
from workbench.scheduling.from_config import stage_costs_from_timeline
from workbench.scheduling.sharing import CoreSharing, activity, sharing_slowdown, solo_durations
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts


def ev(rank: int, op: str, start: float, end: float, stage: int = 0) -> Event:
    return Event(rank=rank, stage=stage, op=op, start=start, end=end, microbatch=0 if op in ("F", "B") else None,
                 iteration=0, source="measured")


def test_processor_sharing_slowdown():
    assert sharing_slowdown(1, 2) == 1.0
    assert sharing_slowdown(2, 2) == 1.0
    assert sharing_slowdown(4, 2) == pytest.approx(2.0)
    assert sharing_slowdown(3, 2) == pytest.approx(1.5)
    # two foreign processes already on the 2 cores: alone gets 2/3 of a core, among two 1/2
    assert sharing_slowdown(2, 2, background=2) == pytest.approx((2 / 3) / (2 / 4))
    with pytest.raises(ValueError, match="cores"):
        sharing_slowdown(2, 0)
    with pytest.raises(ValueError, match="CoreSharing.cores"):
        CoreSharing(0)


def test_activity_counts_compute_and_cpu_communication_not_waits():
    events = [ev(0, "F", 0, 10), ev(1, "F", 0, 5), ev(1, "RECV_F", 5, 10), ev(2, "AR", 5, 10), ev(3, "B", 20, 30)]
    got = activity(events, 4, CoreSharing(2))
    assert got[0] == pytest.approx(2.0)  # rank 1's forward for the first half, the all-reduce for the second
    assert got[1] == pytest.approx(2.0)
    assert got[2] == 1.0  # no compute: it would run alone
    assert got[3] == pytest.approx(1.0)
    # ranks on different nodes do not share cores
    assert activity(events, 4, CoreSharing(2, ranks_per_node=1))[0] == pytest.approx(1.0)


def test_solo_durations_undo_the_sharing():
    events = [ev(r, "F", 0, 8) for r in range(4)]  # four ranks on two cores: each ran at half speed
    solo = solo_durations(events, CoreSharing(2))
    assert [solo[i] for i in range(4)] == pytest.approx([4.0] * 4)


def test_data_parallel_on_shared_cores_runs_at_cores_over_ranks():
    costs = StageCosts.uniform(1, forward_ms=2.0, backward_ms=4.0)
    schedule = generators.data_parallel(4, 1)
    alone = simulate(schedule, costs).metrics["makespan_ms"]
    shared = simulate(schedule, costs, sharing=CoreSharing(2))
    assert shared.metrics["makespan_ms"] == pytest.approx(2 * alone, rel=0.02)
    assert shared.metrics["sharing_slowdown"] == pytest.approx([2.0] * 4, rel=0.02)
    roomy = simulate(schedule, costs, sharing=CoreSharing(4))
    assert roomy.metrics["makespan_ms"] == pytest.approx(alone)


def test_a_pipeline_with_one_microbatch_is_not_slowed():
    """One micro-batch through 4 stages: one rank computes at a time, so nothing shares a core."""
    costs = StageCosts.uniform(4)
    schedule = generators.one_f_one_b(4, 1)
    alone = simulate(schedule, costs).metrics["makespan_ms"]
    assert simulate(schedule, costs, sharing=CoreSharing(1)).metrics["makespan_ms"] == pytest.approx(alone)


def test_a_pipeline_is_slowed_less_than_data_parallelism():
    """The bubble relieves the cores: 4 stages x 4 micro-batches on 2 cores stretch compute by less than 2."""
    costs = StageCosts.uniform(4)
    slowdown = simulate(generators.one_f_one_b(4, 4), costs, sharing=CoreSharing(2)).metrics["sharing_slowdown"]
    assert all(1.0 < s < 2.0 for s in slowdown), slowdown


def test_measured_costs_round_trip_through_the_simulator():
    """Timing a schedule with sharing, then reading solo stage costs back from that timeline, recovers them.

    Approximately: the simulator stretches each rank by the mean number of
    threads beside its compute, the reading divides each event by the number
    beside that event, so the two agree to within the spread of the overlap.
    """
    costs = StageCosts.uniform(4, forward_ms=3.0, backward_ms=6.0)
    schedule = generators.one_f_one_b(4, 8)
    sharing = CoreSharing(2)
    timeline = simulate(schedule, costs, sharing=sharing).timeline
    contended = stage_costs_from_timeline(timeline, 4)
    solo = stage_costs_from_timeline(Timeline(timeline.events, {}), 4, sharing)
    assert contended.forward_ms[0] > 1.2 * costs.forward_ms[0]  # the shared timeline's durations are stretched
    assert solo.forward_ms == pytest.approx(costs.forward_ms, rel=0.15)
    assert solo.backward_ms == pytest.approx(costs.backward_ms, rel=0.15)


def test_replicas_of_a_stage_are_costed_by_the_slowest_mean():
    """Replicas meet at every all-reduce, so the slower one sets the pace; an iteration sums, so means."""
    events = [ev(0, "F", 0, 2), ev(0, "F", 2, 4), ev(0, "B", 4, 8), ev(0, "B", 8, 20),  # rank 0: B mean 8
              ev(2, "F", 0, 3), ev(2, "F", 3, 6), ev(2, "B", 6, 10), ev(2, "B", 10, 14)]  # rank 2: F mean 3
    costs = stage_costs_from_timeline(Timeline(events, {}), 1)
    assert costs.forward_ms == (3.0,) and costs.backward_ms == (8.0,)
