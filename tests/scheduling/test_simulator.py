"""Simulator: exact bubble formulas on uniform costs, communication timing, GroPipe delay, memory."""

import pytest

from workbench.core.costs import ClusterSpec, DeviceSpec, LinkSpec
from workbench.scheduling import generators as g
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts

DEVICE = DeviceSpec("test-gpu", {"float32": 10.0}, 16 * 2**30, 900.0)


def one_node(n, gbs=10.0, latency_us=10.0):
    return ClusterSpec("one-node", 1, n, DEVICE, LinkSpec("pcie", latency_us, gbs))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 16])
@pytest.mark.parametrize("gen", [g.gpipe, g.one_f_one_b])
def test_gpipe_and_1f1b_bubble_is_exact(gen, p, m):
    bubbles = simulate(gen(p, m)).metrics["bubble_fraction"]
    assert bubbles == pytest.approx([(p - 1) / (m + p - 1)] * p, abs=1e-12)


@pytest.mark.parametrize("p, v, m", [(2, 2, 2), (2, 3, 4), (3, 2, 6), (4, 2, 8), (4, 4, 4), (4, 3, 12)])
def test_interleaved_bubble_is_exact(p, v, m):
    bubbles = simulate(g.interleaved(p, m, v)).metrics["bubble_fraction"]
    assert bubbles == pytest.approx([(p - 1) / (v * m + p - 1)] * p, abs=1e-12)


def test_async_steady_state_has_no_flush_bubble():
    p, m, iters = 4, 4, 6
    res = simulate(g.async_1f1b(p, m, iters))
    for r in range(p):
        step_ends = [e.end for e in res.timeline.events if e.op == "STEP" and e.rank == r]
        gaps = [b - a for a, b in zip(step_ends, step_ends[1:])]
        assert gaps == pytest.approx([m * 3.0] * (iters - 1))  # each iteration is exactly m * (f + b): no flush
    # the whole run pays the fill/drain once, not once per iteration
    assert res.metrics["makespan_ms"] == pytest.approx(iters * m * 3.0 + (p - 1) * 3.0)
    flushing = simulate(g.one_f_one_b(p, m)).metrics["iteration_ms"]
    assert res.metrics["iteration_ms"] < flushing


def test_async_peak_memory_counts_stashed_versions():
    costs = StageCosts.uniform(3, param_bytes=1000, activation_bytes=10)
    res = simulate(g.async_1f1b(3, 2, 3), costs)
    stage0 = res.memory[0]
    assert stage0["stashed_weights"] == 1000  # one older version kept for in-flight micro-batches
    assert stage0["weights"] == 1000 and stage0["gradients"] == 1000 and stage0["optimizer"] == 2000
    assert res.memory[2]["stashed_weights"] == 0  # the last stage never holds a micro-batch across a step


def test_1f1b_peak_activation_memory_at_most_p_gpipe_m():
    p, m, act = 4, 16, 100
    costs = StageCosts.uniform(p, activation_bytes=act)
    one = simulate(g.one_f_one_b(p, m), costs).metrics["peak_memory_bytes"]
    fill = simulate(g.gpipe(p, m), costs).metrics["peak_memory_bytes"]
    assert one == [(p - s) * act for s in range(p)]
    assert fill == [m * act] * p


def test_point_to_point_time_is_latency_plus_bytes_over_bandwidth():
    costs = StageCosts(forward_ms=(1.0, 1.0), backward_ms=(2.0, 2.0), send_bytes=(10_000_000, 0),
                       param_bytes=(0, 0), grad_bytes=(0, 0), optimizer_bytes=(0, 0), activation_bytes=(0, 0))
    cluster = one_node(2, gbs=10.0, latency_us=100.0)
    transfer = 0.1 + 1.0  # 100 us + 10 MB / 10 GB/s
    res = simulate(g.one_f_one_b(2, 1), costs, cluster)
    assert res.metrics["makespan_ms"] == pytest.approx(1 + transfer + 1 + 2 + transfer + 2)
    assert res.metrics["comm_bytes_by_link"] == {"pcie": 20_000_000}
    assert sum(res.metrics["exposed_comm_ms"]) == pytest.approx(2 * transfer)
    sends = [e for e in res.timeline.events if e.op == "SEND_F"]
    assert len(sends) == 1 and sends[0].duration == pytest.approx(transfer) and sends[0].peer == 1


def test_shared_channel_serialises_transfers():
    # forward takes no time, so rank 0 launches both sends at t=0; the second has to wait for the first
    costs = StageCosts(forward_ms=(0.0, 1.0), backward_ms=(0.0, 0.0), send_bytes=(10_000_000, 0),
                       param_bytes=(0, 0), grad_bytes=(0, 0), optimizer_bytes=(0, 0), activation_bytes=(0, 0))
    res = simulate(g.gpipe(2, 2), costs, one_node(2, gbs=10.0, latency_us=0.0))
    sends = sorted((e.start, e.end) for e in res.timeline.events if e.op == "SEND_F")
    assert sends == [pytest.approx((0.0, 1.0)), pytest.approx((1.0, 2.0))]


def test_gropipe_delay0_exposes_stage0_allreduce_delay1_hides_it():
    costs = StageCosts.uniform(2, param_bytes=20_000_000)  # all-reduce of 20 MB over 10 GB/s ~ 2 ms per stage
    cluster = one_node(4)
    sync = simulate(g.gropipe(2, 2, 4, delay=0, num_iterations=3), costs, cluster)
    delayed = simulate(g.gropipe(2, 2, 4, delay=1, num_iterations=3), costs, cluster)
    stage0_ranks = [0, 2]
    for r in stage0_ranks:
        assert sync.metrics["exposed_comm_ms"][r] > 1.0
        assert delayed.metrics["exposed_comm_ms"][r] == 0.0
    # visible in the events: with delay 0 the rank's step waits for its own all-reduce to end
    ar = [e for e in sync.timeline.events if e.rank == 0 and e.op == "AR"]
    steps = [e for e in sync.timeline.events if e.rank == 0 and e.op == "STEP"]
    last_b = max(e.end for e in sync.timeline.events if e.rank == 0 and e.op == "B" and e.iteration == 0)
    assert steps[0].start == pytest.approx(ar[0].end) and ar[0].end > last_b
    # with delay 1 the all-reduce of iteration t runs while iteration t+1 computes
    ar1 = [e for e in delayed.timeline.events if e.rank == 0 and e.op == "AR"]
    f_next = [e for e in delayed.timeline.events if e.rank == 0 and e.op == "F" and e.iteration == 1]
    assert any(f.start < ar1[0].end and f.end > ar1[0].start for f in f_next)
    assert delayed.metrics["iteration_ms"] < sync.metrics["iteration_ms"]


def test_data_parallel_buckets_overlap_backward():
    costs = StageCosts.uniform(1, forward_ms=1.0, backward_ms=4.0, param_bytes=40_000_000)
    one = simulate(g.data_parallel(4, 1), costs, one_node(4))
    four = simulate(g.data_parallel(4, 4), costs, one_node(4))
    assert four.metrics["iteration_ms"] < one.metrics["iteration_ms"]
    ars = [e for e in four.timeline.events if e.rank == 0 and e.op == "AR"]
    backward_end = max(e.end for e in four.timeline.events if e.rank == 0 and e.op == "B")
    assert ars[0].start < backward_end  # the first bucket is reduced while later buckets are still computing


def test_throughput_units_and_samples():
    res = simulate(g.gropipe(2, 2, 4), StageCosts.uniform(2), microbatch_size=8)
    assert res.metrics["throughput_unit"] == "samples/s"
    assert res.metrics["throughput"] == pytest.approx(2 * 4 * 8 / (res.metrics["iteration_ms"] / 1e3))


def test_tensor2d_step_runs_on_a_grid():
    costs = StageCosts.uniform(2, forward_ms=8.0, backward_ms=16.0, param_bytes=1_000_000, send_bytes=1_000_000)
    res = simulate(g.tensor2d_step(2, 2), costs, one_node(4))
    assert res.metrics["num_ranks"] == 4
    assert res.metrics["iteration_ms"] > (8 + 16) * 2 / 4  # a quarter of the compute plus the broadcasts


def test_cluster_too_small_and_costs_too_short_are_errors():
    with pytest.raises(ValueError, match="needs 4 ranks"):
        simulate(g.one_f_one_b(4, 4), None, one_node(2))
    with pytest.raises(ValueError, match="stage_costs has 2"):
        simulate(g.one_f_one_b(4, 4), StageCosts.uniform(2))


def test_weight_read_floor_makes_small_microbatches_cost_nearly_a_full_pass():
    from workbench.core.costs import LayerCost, ModelCosts
    from workbench.core.partition import Partition

    fc = LayerCost("fc", forward_ms=10.0, backward_ms=20.0, param_bytes=9 * 10**9)  # 9 GB of weights at 900 GB/s
    costs = ModelCosts("fc", batch_size=64, device="test", layers=(fc,))
    linear = StageCosts.from_model(costs, Partition.parse("0"), 8)
    floored = StageCosts.from_model(costs, Partition.parse("0"), 8, device=DEVICE)
    assert linear.forward_ms == (10.0 * 8 / 64,)
    assert floored.forward_ms == (10.0,) and floored.backward_ms == (20.0,)


def test_delayed_allreduce_keeps_a_second_gradient_buffer():
    costs = StageCosts.uniform(2, param_bytes=1000)
    sync = simulate(g.gropipe(2, 2, 2, delay=0), costs).memory[0]
    delayed = simulate(g.gropipe(2, 2, 2, delay=1, num_iterations=2), costs).memory[0]
    assert sync["pending_gradients"] == 0 and delayed["pending_gradients"] == 1000
    assert delayed["peak"] == sync["peak"] + 1000


@pytest.mark.parametrize("p, m, most", [(4, 4, 1), (4, 8, 1), (4, 2, 2)])
def test_async_holds_two_versions_when_microbatches_cover_the_pipeline(p, m, most):
    memory = simulate(g.async_1f1b(p, m, 4), StageCosts.uniform(p, param_bytes=1)).memory
    assert max(row["stashed_weights"] for row in memory) == most
    assert memory[-1]["stashed_weights"] == 0
