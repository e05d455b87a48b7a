"""The overlap slowdown: compute and communication overlapping on one device both run slower."""

from dataclasses import replace

import pytest

from workbench.core.costs import ClusterSpec, DeviceSpec, LinkSpec
from workbench.scheduling import generators
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts

DEVICE = DeviceSpec("dev", {"float32": 1.0}, 2**34, 100.0)
LINK = LinkSpec("link", 0.0, 1.0)  # 1 GB/s, no latency: 1e6 bytes take 1 ms point to point


def cluster(factor: float = 1.0, shared: bool = False) -> ClusterSpec:
    return ClusterSpec("c", 1, 4, DEVICE, LINK, overlap_slowdown=factor, shared_compute=shared)


def events(result):
    return [(e.rank, e.op, e.stage, e.microbatch, e.start, e.end) for e in result.timeline.events]


def test_factor_one_changes_nothing():
    costs = StageCosts.uniform(2, forward_ms=1.0, backward_ms=2.0, send_bytes=500_000, param_bytes=4_000_000)
    schedule = generators.gropipe(2, 2, 4, delay=1, num_iterations=2)
    plain = ClusterSpec("c", 1, 4, DEVICE, LINK)
    assert events(simulate(schedule, costs, plain)) == events(simulate(schedule, costs, cluster(1.0)))
    assert events(simulate(schedule, costs, plain)) == events(simulate(schedule, costs, cluster(1.0, shared=True)))


def test_data_parallel_bucket_overlap_is_slowed():
    # F [0,1], B bucket 1 [1,2]; its all-reduce (1 ms alone) overlaps B bucket 0 (1 ms alone).
    costs = StageCosts.uniform(1, forward_ms=1.0, backward_ms=2.0, param_bytes=2_000_000)
    schedule = generators.data_parallel(2, 2)
    base = simulate(schedule, costs, cluster(1.0))
    assert base.metrics["makespan_ms"] == pytest.approx(4.0)
    slowed = simulate(schedule, costs, cluster(2.0))
    ar = sorted((e.start, e.end) for e in slowed.timeline.events if e.op == "AR")
    # the first all-reduce overlaps rank 0's backward [2, 3] (placed before it): half speed there, so 0.5 ms of
    # work is left at 3 and it ends at 3.5; rank 1's backward, placed after it, runs at half speed until 3.5
    assert ar[0] == pytest.approx((2.0, 3.5))
    b0 = {e.rank: e.end - e.start for e in slowed.timeline.events if e.op == "B" and e.start >= 2.0}
    assert b0 == pytest.approx({0: 1.0, 1: 1.75})
    assert ar[-1] == pytest.approx((3.75, 4.75))  # the last all-reduce runs alone
    assert slowed.metrics["makespan_ms"] == pytest.approx(4.75)


def test_partial_overlap_slows_only_the_overlapping_part():
    costs = StageCosts.uniform(1, forward_ms=1.0, backward_ms=4.0, param_bytes=2_000_000)
    schedule = generators.data_parallel(2, 2)  # each backward bucket 2 ms, the all-reduce 1 ms alone
    slowed = simulate(schedule, costs, cluster(1.5))
    b0 = [e for e in slowed.timeline.events if e.op == "B" and e.rank == 1 and e.start >= 3.0][0]
    # the all-reduce overlaps rank 0's backward throughout: 1 ms of work takes 1.5 ms; rank 1's backward does
    # 1 ms of its work in those 1.5 ms and the other 1 ms at full speed
    ar = [e for e in slowed.timeline.events if e.op == "AR"][0]
    assert ar.end - ar.start == pytest.approx(1.5)
    assert b0.end - b0.start == pytest.approx(2.5)


def test_shared_compute_spreads_the_slowdown_over_the_node():
    # GroPipe 2 x 2: stage 1 (ranks 1, 3) all-reduces while stage 0 (ranks 0, 2) still runs its backward.
    costs = StageCosts.uniform(2, forward_ms=1.0, backward_ms=4.0, send_bytes=1000, param_bytes=8_000_000)
    schedule = generators.gropipe(2, 2, 1)
    per_rank = simulate(schedule, costs, cluster(2.0))
    shared = simulate(schedule, costs, cluster(2.0, shared=True))

    def stage0_backward(result):
        return [e.end - e.start for e in result.timeline.events if e.op == "B" and e.rank == 0][0]

    assert stage0_backward(per_rank) == pytest.approx(4.0)  # its own rank has no communication then
    assert stage0_backward(shared) > 4.0  # the node's cores are shared with ranks 1 and 3's all-reduce
    assert shared.metrics["makespan_ms"] > per_rank.metrics["makespan_ms"]


def test_overlap_slowdown_is_validated():
    with pytest.raises(ValueError, match="overlap_slowdown must be in"):
        cluster(0.5)
    with pytest.raises(ValueError, match="shared_compute must be true or false"):
        replace(cluster(), shared_compute="yes")
    assert ClusterSpec.from_dict(cluster(1.3, shared=True).to_dict()) == cluster(1.3, shared=True)


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_all_reduce_pays_the_clusters_call_cost_per_ring_step(ranks):
    costs = StageCosts.uniform(1, forward_ms=1.0, backward_ms=2.0, param_bytes=1_000_000)
    schedule = generators.data_parallel(ranks, 1)
    base = simulate(schedule, costs, cluster())
    charged = simulate(schedule, costs, replace(cluster(), collective_call_ms=0.5))
    # a ring all-reduce among n ranks is 2(n - 1) steps, each waiting for its two ranks
    assert charged.metrics["makespan_ms"] == pytest.approx(base.metrics["makespan_ms"] + 0.5 * 2 * (ranks - 1))
