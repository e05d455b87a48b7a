"""AMPA is exact (equals brute force) and never worse than a baseline; bad input is rejected early."""

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.core.costs import LayerCost, ModelCosts
from workbench.core.partition import Partition
from workbench.planning.partitioning.ampa import Projection, ampa, kind_memory, search
from workbench.core.plan import PIPELINE_KINDS, ParallelPlan
from workbench.scheduling.registry import StageMemory, stage_memory
from workbench.scheduling.zero_bubble import zb_h2
from workbench.planning.costs.clusters import get_cluster
from workbench.planning.partitioning.partitioners import block_partition, manual, partition
from workbench.scheduling import generators as g
from workbench.scheduling.memory import in_flight_by_stage

GIB = 2**30


def make_costs(rows, batch=8):
    return ModelCosts("rand", batch, "x", tuple(
        LayerCost(f"l{i}", f, b, param_bytes=p, activation_bytes=a, saved_bytes=s)
        for i, (f, b, p, a, s) in enumerate(rows)))


layer = st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.integers(0, 10**8), st.integers(0, 10**8),
                  st.integers(0, 10**7))


def brute_force(proj, cap):
    L, S = proj.costs.num_layers, proj.num_stages
    best = None
    for cuts in itertools.combinations(range(1, L), S - 1):
        result = proj.evaluate(Partition.from_cuts(list(cuts), L), "brute", cap)
        if result.fits and (best is None or result.bottleneck_ms < best):
            best = result.bottleneck_ms
    return best


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(layer, min_size=1, max_size=9), data=st.data())
def test_ampa_equals_brute_force(rows, data):
    costs = make_costs(rows)
    S = data.draw(st.integers(1, len(rows)), label="stages")
    m = data.draw(st.sampled_from([1, 2, 4, 8]), label="microbatches")
    schedule = data.draw(st.sampled_from(["gpipe", "1f1b", "async"]), label="schedule")
    cluster = data.draw(st.sampled_from([None, get_cluster("8xV100-PCIe"), get_cluster("2x8xH100-IB")]))
    cap = data.draw(st.sampled_from([None, 2 * 10**8, 6 * 10**8, 2 * 10**9]), label="cap")
    if cluster is not None and cluster.world_size < S:
        cluster = None
    proj = Projection(costs, S, num_microbatches=m, schedule=schedule, cluster=cluster)
    expected = brute_force(proj, cap)
    if expected is None:
        with pytest.raises(ValueError, match="fits the memory cap"):
            ampa(costs, S, num_microbatches=m, schedule=schedule, memory_cap_bytes=cap, cluster=cluster)
        return
    got = ampa(costs, S, num_microbatches=m, schedule=schedule, memory_cap_bytes=cap or 10**15, cluster=cluster)
    assert got.fits
    assert got.bottleneck_ms == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_ampa_never_worse_than_any_baseline_on_random_models():
    rng = random.Random(7)
    cluster = get_cluster("2x8xH100-IB")
    for trial in range(25):
        L = rng.randint(4, 40)
        rows = [(rng.uniform(0.1, 5), rng.uniform(0.1, 10), rng.randint(0, 10**8), rng.randint(0, 10**9),
                 rng.randint(0, 10**8)) for _ in range(L)]
        costs = make_costs(rows, batch=16)
        S = rng.randint(1, min(L, 16))
        best = partition(costs, S, "ampa", num_microbatches=4, cluster=cluster, memory_cap_bytes=10**15)
        for alg in ("uniform", "params", "time", "pipedream"):
            other = partition(costs, S, alg, num_microbatches=4, cluster=cluster, memory_cap_bytes=10**15)
            assert best.bottleneck_ms <= other.bottleneck_ms + 1e-9, (trial, alg)


def test_ampa_beats_uniform_on_a_skewed_model():
    rows = [(1.0, 2.0, 0, 0, 0)] * 6 + [(6.0, 12.0, 0, 0, 0)] * 2
    costs = make_costs(rows)
    best = ampa(costs, 2, num_microbatches=2)
    uniform = partition(costs, 2, "uniform", num_microbatches=2)
    assert str(best.partition) == "0-6|7-7"  # 18+... the heavy tail gets a stage of its own
    assert best.bottleneck_ms == 18.0 < uniform.bottleneck_ms


def test_the_memory_ampa_counts_is_read_off_each_kind_s_schedule():
    """The textbook counts: GPipe keeps m, 1F1B min(S - k, m), the asynchronous pipeline S - k micro-batches and
    one older weight version on every stage but the last; ZB-H2 up to 2S - 1 (the generator walked directly)."""
    for S in (2, 3, 5):
        for m in (1, 2, 4, 7):
            assert kind_memory("gpipe", S, m).in_flight == (m,) * S
            assert kind_memory("1f1b", S, m) == StageMemory(tuple(min(S - k, m) for k in range(S)), (0,) * S)
            stream = kind_memory("async", S, m)
            assert stream.in_flight == tuple(S - k for k in range(S))
            if m >= S:  # one older version per stage but the last (fewer micro-batches: more iterations in flight)
                assert stream.extra_versions == (1,) * (S - 1) + (0,)
            assert stream.extra_versions[-1] == 0 and min(stream.extra_versions[:-1]) >= 1
            walked = in_flight_by_stage(zb_h2(S, m))
            assert kind_memory("zbh2", S, m).in_flight == tuple(walked[k] for k in range(S))
            assert max(walked.values()) == min(2 * S - 1, m)
    with pytest.raises(ValueError, match="schedule must be a pipeline kind"):
        kind_memory("fifo", 2, 2)



def test_ampa_counts_each_kind_s_memory_only_from_its_schedule():
    """One count of what a stage keeps: AMPA's memory for a pipeline kind (by name, as the CLI and the search
    pass it) is the schedule registry's stage_memory of that kind's plan, for every kind and a few stage and
    micro-batch counts, and a partition costed by kind name equals one costed by the plan's stage_memory."""
    costs = make_costs([(1.0 + i % 3, 2.0, 10**6, 10**6 * (1 + i % 4), 0) for i in range(12)])
    checked = set()
    for kind in (k for k in PIPELINE_KINDS if k != "none"):
        for stages in (1, 2, 3, 4):
            for m in (1, 2, 4, 8):
                try:
                    plan = ParallelPlan.for_pipeline(kind, stages, m)
                    expected = stage_memory(plan)
                except ValueError:  # a shape the kind does not run (too few stages or micro-batches)
                    continue
                virtual = plan.num_virtual_stages
                assert kind_memory(kind, virtual, m) == expected, (kind, stages, m)
                by_name = ampa(costs, virtual, num_microbatches=m, schedule=kind)
                assert by_name == ampa(costs, virtual, num_microbatches=m, schedule=expected), (kind, stages, m)
                checked.add(kind)
    assert checked == set(PIPELINE_KINDS) - {"none"}

def test_block_partition_and_params_baselines():
    assert block_partition([1, 1, 1, 1, 4], 2).sizes == [4, 1]
    rows = [(1.0, 1.0, p, 0, 0) for p in (10, 10, 10, 30)]
    assert str(partition(make_costs(rows), 2, "params").partition) == "0-2|3-3"


def test_memory_cap_failure_names_stage_and_excess():
    rows = [(1.0, 1.0, GIB, 0, 0)] * 4  # weights + grads + adam = 4 GiB per layer
    with pytest.raises(ValueError, match=r"needs 8\.000 GiB on stage \d, 1\.000 GiB over the cap"):
        ampa(make_costs(rows), 2, num_microbatches=1, memory_cap_bytes=7 * GIB)
    with pytest.raises(ValueError, match=r"stage 0 needs 12\.000 GiB, 5\.000 GiB over"):
        manual(make_costs(rows), "0-2|3", memory_cap_bytes=7 * GIB)


@pytest.mark.parametrize("call, field", [
    (lambda c: ampa(c, 5, num_microbatches=1), "more stages than the model's 4 layers"),
    (lambda c: ampa(c, 2, num_microbatches=0), "num_microbatches"),
    (lambda c: ampa(c, 2, num_microbatches=3), "does not divide the batch"),
    (lambda c: ampa(c, 2, num_microbatches=2, schedule="zb"), "schedule"),
    (lambda c: partition(c, 2, "magic"), "algorithm"),
    (lambda c: manual(c, "0-1|3"), "uncovered"),
    (lambda c: partition(c, 3, "manual", text="0-1|2-3"), "has 2 stages"),
    (lambda c: search(c, 8, global_batch=8, stages=3), "does not divide world_size"),
    (lambda c: search(c, 32, global_batch=8, cluster=get_cluster("8xV100-PCIe")), "fewer than world_size"),
])
def test_bad_input(call, field):
    costs = make_costs([(1.0, 2.0, 10, 10, 10)] * 4)
    with pytest.raises(ValueError, match=field):
        call(costs)


def test_search_ranks_factorisations_and_delay_hides_allreduce():
    rng = random.Random(1)
    rows = [(rng.uniform(1, 3), rng.uniform(2, 6), 50 * 10**6, 10**6, 10**6) for _ in range(16)]
    costs = make_costs(rows, batch=32)
    cluster = get_cluster("8xV100-PCIe")
    ranked = search(costs, 8, global_batch=64, cluster=cluster, delay=1)
    feasible = [c for c in ranked if c.infeasible is None]
    assert {(c.groups, c.stages) for c in feasible} == {(8, 1), (4, 2), (2, 4), (1, 8)}
    times = [c.projected_iteration_ms for c in feasible]
    assert times == sorted(times)
    sync = {(c.groups, c.stages, c.num_microbatches): c for c in search(costs, 8, global_batch=64, cluster=cluster,
                                                                        delay=0)}
    for c in feasible:
        if c.groups > 1:
            assert c.exposed_allreduce_ms <= sync[(c.groups, c.stages, c.num_microbatches)].exposed_allreduce_ms
    assert any(sync[k].exposed_allreduce_ms > 0 for k in sync if k[0] > 1)
    local = search(costs, 2, global_batch=8, cluster=get_cluster("local-cpu"))
    assert local[0].infeasible is None


def test_ampa_exact_when_the_optimum_is_a_rounded_difference():
    # 9.999999999999998 + 7 + 9: the optimum 16 is only reachable if float rounding in the
    # candidate bound (x - prefix) does not exclude the cut it came from.
    costs = make_costs([(0.0, 9.999999999999998, 0, 0, 0), (0.0, 7.0, 0, 0, 0), (0.0, 9.0, 0, 0, 0)])
    proj = Projection(costs, 2, num_microbatches=1, schedule="gpipe")
    assert ampa(costs, 2, num_microbatches=1, schedule="gpipe").bottleneck_ms == pytest.approx(brute_force(proj, None))
    assert str(ampa(costs, 2, num_microbatches=1, schedule="gpipe").partition) == "0-0|1-2"
