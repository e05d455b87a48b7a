"""Processor sharing: ranks time-sharing a node's cores, in the simulator and in measured timelines."""

from __future__ import annotations

import pytest

from workbench.core.costs import ClusterSpec, DeviceSpec, LinkSpec
from workbench.core.timeline import Event, Timeline
from workbench.scheduling import generators
from workbench.scheduling.from_config import stage_costs_from_timeline
from workbench.scheduling.sharing import (COLLECTIVE_CPU_SHARE, CoreSharing, Pace, runnable_at,
                                          sharing_slowdown, solo_durations, wait_fraction)
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


def test_runnable_threads_count_compute_and_cpu_communication_not_waits():
    events = [ev(0, "F", 0, 10), ev(1, "F", 0, 5), ev(1, "RECV_F", 5, 10), ev(2, "AR", 5, 10), ev(3, "B", 20, 30)]
    at = runnable_at(events, CoreSharing(2))
    # beside rank 0: rank 1's forward for the first half, the all-reduce (its share of work on a core) after
    assert at(0, 2.0) == pytest.approx(1.0)
    assert at(0, 7.0) == pytest.approx(COLLECTIVE_CPU_SHARE)
    assert at(3, 7.0) == pytest.approx(1 + COLLECTIVE_CPU_SHARE)  # rank 1's receive is a wait
    # ranks on different nodes do not share cores
    assert runnable_at(events, CoreSharing(2, ranks_per_node=1))(0, 2.0) == pytest.approx(0.0)


def _pairs_all_reducing(cluster: ClusterSpec, compute_beside: bool) -> list[float]:
    """The all-reduce events' durations: ranks 0-1 all-reduce (stage 0's group), ranks 2-3 all-reduce too or
    compute meanwhile."""
    from dataclasses import replace

    from workbench.core.ir import Action, Op, Schedule, ScheduleMeta

    def rank(r: int) -> tuple:
        if compute_beside and r >= 2:
            return (Action(r, Op.STEP, iteration=0),)  # a long optimizer step: compute, with nothing to receive
        return (Action(r // 2, Op.ALL_REDUCE, iteration=0), Action(r // 2, Op.STEP, iteration=0))

    schedule = Schedule(tuple(rank(r) for r in range(4)), name="pairs", num_stages=4, num_microbatches=1,
                        meta=ScheduleMeta(stage_to_rank=((0, 0, 1, 1),), dp_groups=((0, 1), (2, 3), (2,), (3,))))
    costs = replace(StageCosts.uniform(4, param_bytes=120_000_000), step_ms=(0.0, 0.0, 1000.0, 1000.0))
    sim = simulate(schedule, costs, cluster, sharing=CoreSharing(2))
    return sorted(e.end - e.start for e in sim.timeline.events if e.op == "AR")  # one event per member


def test_an_all_reduce_on_shared_cores_slows_by_its_share_of_work_on_them():
    link = LinkSpec("ar", latency_us=0.0, bandwidth_gbs=1.0)
    cluster = ClusterSpec("two-core", 1, 4, DeviceSpec("cpu", {"float32": 1.0}, 2**34, 10.0), link,
                          shared_compute=True)
    alone = link.allreduce_ms(120_000_000, 2)
    share = COLLECTIVE_CPU_SHARE
    # two pairs at once: four all-reduce threads, each the share of a runnable one, on two cores
    assert _pairs_all_reducing(cluster, False) == pytest.approx([alone * ((1 - share) + share * 4 * share / 2)] * 4,
                                                                rel=0.02)
    # beside two computing ranks: 2 + 2 share runnable
    assert _pairs_all_reducing(cluster, True) == pytest.approx([alone * ((1 - share) + share * (2 + 2 * share) / 2)] * 2,
                                                               rel=0.02)


def test_compute_is_paced_by_the_threads_runnable_at_each_moment():
    """One core: rank 1 computed over [0, 5) in the last pass, so rank 0's 10 ms from 0 run at half speed until 5
    (2.5 ms of work done) and alone after (7.5 more)."""
    pace = Pace([[ev(1, "F", 0, 5)]], CoreSharing(1))
    assert pace.compute_end(0, 0.0, 10.0) == pytest.approx(12.5)
    assert pace.compute_end(0, 5.0, 10.0) == pytest.approx(15.0)  # after rank 1 stopped: alone
    assert pace.compute_end(1, 0.0, 10.0) == pytest.approx(10.0)  # its own earlier compute is not beside it
    # a rank's own all-reduce thread is (a delayed all-reduce beside the next iteration), at its share of a thread
    own = Pace([[ev(0, "AR", 0, 10)]], CoreSharing(1))
    slow = 1 + COLLECTIVE_CPU_SHARE
    assert own.compute_end(0, 0.0, 10.0) == pytest.approx(10.0 + (10.0 - 10.0 / slow))
    # two passes weigh half each (the fixed point's damping): rank 1 half a thread over [0, 5)
    assert Pace([[ev(1, "F", 0, 5)], []], CoreSharing(1)).compute_end(0, 0.0, 10.0) == pytest.approx(12.5 - 2.5 / 3)
    assert Pace([], CoreSharing(1)).compute_end(0, 3.0, 10.0) == pytest.approx(13.0)
    # the stage costs are solo times taken beside the background: it slows a rank only with others beside it
    assert Pace([], CoreSharing(1, background=1.0)).compute_end(0, 0.0, 10.0) == pytest.approx(10.0)
    busy = Pace([[ev(1, "F", 0, 100)]], CoreSharing(1, background=1.0))
    assert busy.compute_end(0, 0.0, 10.0) == pytest.approx(15.0)  # a third of the core against half of it


def test_an_all_reduce_is_paced_by_the_threads_beside_its_members():
    """Two cores; ranks 2 and 3 compute throughout: 2 + 2 x share threads, so the all-reduce's share of work on a
    core runs (2 + 2 share) / 2 times slower, its waiting no slower."""
    pace = Pace([[ev(2, "F", 0, 1000), ev(3, "F", 0, 1000), ev(0, "AR", 0, 3), ev(1, "AR", 0, 3)]], CoreSharing(2))
    share = COLLECTIVE_CPU_SHARE
    stretch = (1 - share) + share * (2 + 2 * share) / 2
    assert pace.all_reduce_end((0, 1), 0.0, 10.0) == pytest.approx(10.0 * stretch)
    # on separate nodes nothing computes beside either member
    apart = Pace([[ev(2, "F", 0, 1000), ev(3, "F", 0, 1000)]], CoreSharing(2, ranks_per_node=2))
    assert apart.all_reduce_end((0, 1), 0.0, 10.0) == pytest.approx(10.0 * ((1 - share) + share * max(1, 2 * share / 2)))


def test_a_rank_is_slowed_only_while_others_compute_beside_it():
    """Rank 0 runs two 10 ms optimizer steps, rank 1 one, at the same time as the first (nothing to wait for).
    One core: the first two share it (20 ms each, as processor sharing gives), rank 0's second runs alone. A
    rank-wide mean would stretch both of rank 0's steps alike."""
    from dataclasses import replace

    from workbench.core.ir import Action, Op, Schedule, ScheduleMeta

    programs = ((Action(0, Op.STEP, iteration=0), Action(0, Op.STEP, iteration=1)), (Action(1, Op.STEP, iteration=0),))
    schedule = Schedule(programs, name="two-then-one", num_stages=2, num_microbatches=1,
                        meta=ScheduleMeta(stage_to_rank=((0, 1),), dp_groups=((0,), (1,))))
    costs = replace(StageCosts.uniform(2), step_ms=(10.0, 10.0))
    sim = simulate(schedule, costs, sharing=CoreSharing(1))
    steps = sorted((e.rank, e.start, e.end - e.start) for e in sim.timeline.events if e.op == "STEP")
    assert [d for _, _, d in steps] == pytest.approx([20.0, 10.0, 20.0], rel=0.03)
    assert sim.metrics["makespan_ms"] == pytest.approx(30.0, rel=0.03)
    assert sim.metrics["sharing_slowdown"] == pytest.approx([1.5, 2.0], rel=0.03)


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


def test_a_woken_thread_waits_only_as_far_as_the_cores_are_oversubscribed():
    assert wait_fraction(2, 2) == 0.0  # every runnable thread has a core
    assert wait_fraction(3, 2) == pytest.approx(0.5)
    assert wait_fraction(4, 2) == 1.0 and wait_fraction(9, 2) == 1.0  # capped at the whole wait
    assert wait_fraction(2, 2, background=1) == pytest.approx(0.5)
    assert CoreSharing(2, background=1).wait_fraction(2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="cores"):
        wait_fraction(1, 0)


def test_runnable_at_reads_the_threads_of_the_node_at_an_instant():
    events = [ev(0, "F", 0, 10), ev(1, "RECV_F", 0, 5), ev(1, "F", 5, 10), ev(2, "SEND_F", 2, 4)]
    at = runnable_at(events, CoreSharing(2, ranks_per_node=4))
    assert [at(1, t) for t in (-1, 1, 3, 4.5, 6, 11)] == [0, 1, 2, 1, 1, 0]  # receives do not count, sends do
    assert [at(0, t) for t in (1, 3, 6)] == [0, 1, 1]  # nor the rank's own threads


def _cpu_cluster(ranks: int, call_ms: float) -> ClusterSpec:
    return ClusterSpec("cpu", 1, ranks, DeviceSpec("cpu", {"fp32": 1.0}, 2**34, 10.0), LinkSpec("loop", 0.0, 1e6),
                       shared_compute=True, collective_call_ms=call_ms)


def test_messages_wait_for_a_core_only_when_the_cores_are_oversubscribed():
    """1F1B on 4 ranks: on 2 cores the ranks' messages arrive while others compute and wait for a core;
    on 4 cores, or with one micro-batch (one rank busy at a time), they never do."""
    costs = StageCosts.uniform(4, forward_ms=2.0, backward_ms=4.0)
    busy = generators.one_f_one_b(4, 4)

    def makespan(schedule, cores: int, call_ms: float) -> float:
        return simulate(schedule, costs, _cpu_cluster(4, call_ms), sharing=CoreSharing(cores)).metrics["makespan_ms"]

    assert makespan(busy, 2, 1.0) > makespan(busy, 2, 0.0) + 1.0
    assert makespan(busy, 4, 1.0) == pytest.approx(makespan(busy, 4, 0.0))
    lone = generators.one_f_one_b(4, 1)
    assert makespan(lone, 2, 1.0) == pytest.approx(makespan(lone, 2, 0.0))
