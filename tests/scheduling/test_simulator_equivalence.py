"""The compiled simulator gives what the simulator before it gave, value for value.

``reference_simulator.py`` is the simulator as it was before the kernel
(one object stepping ``Action`` values, an ``Event`` per event, the metrics
read off the sorted timeline, the memory walk over every lowered action).
Each case draws a schedule kind and shape, per-stage costs and a cluster
(none, one node, several nodes with shared ports, the overlap slowdown,
shared compute, a collective link and call cost, processor sharing) and
compares everything a result carries with ``==``: metrics, memory per rank,
the lowered schedule, and every event's fields and order.
"""

from __future__ import annotations

import random

import pytest

from reference_simulator import simulate as reference_simulate
from workbench.core.costs import ClusterSpec, DeviceSpec, LinkSpec
from workbench.core.ir import Schedule
from workbench.scheduling import generators as g
from workbench.scheduling import zero_bubble as zb
from workbench.scheduling.passes import lower
from workbench.scheduling.sharing import CoreSharing
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts

DEVICE = DeviceSpec("test-gpu", {"float32": 10.0}, 16 * 2**30, 900.0)


def assert_same(fast, slow) -> None:
    assert fast.metrics == slow.metrics
    assert fast.memory == slow.memory
    assert [[type(v) for v in row.values()] for row in fast.memory] == \
        [[type(v) for v in row.values()] for row in slow.memory]
    assert fast.schedule == slow.schedule
    assert fast.timeline.meta == slow.timeline.meta
    assert len(fast.timeline.events) == len(slow.timeline.events)
    for i, (a, b) in enumerate(zip(fast.timeline.events, slow.timeline.events)):
        assert a == b, f"event {i}: {a} != {b}"
    # what the planner's estimate reads, as it read it off the timeline before
    work = [0.0] * slow.metrics["num_ranks"]
    steps: dict[tuple[int, int], float] = {}
    for e in slow.timeline.events:
        if e.op in ("F", "B", "I", "W", "STEP"):
            work[e.rank] += e.end - e.start
        if e.op == "STEP":
            steps[(e.rank, e.iteration)] = max(steps.get((e.rank, e.iteration), 0.0), e.end)
    assert fast.work_ms() == work
    assert fast.step_ends() == steps


def _pipeline(rng: random.Random) -> Schedule:
    kind = rng.choice(["gpipe", "1f1b", "1f1b", "interleaved", "async", "gropipe", "gropipe", "zb", "dp", "2d"])
    S, m = rng.randint(1, 6), rng.randint(1, 10)
    if kind == "gpipe":
        return g.gpipe(S, m)
    if kind == "1f1b":
        return g.one_f_one_b(S, m)
    if kind == "interleaved":
        p = rng.randint(1, 4)
        return g.interleaved(p, p * rng.randint(1, 3), rng.randint(2, 3))
    if kind == "async":
        mode = rng.choice(["stash", "2bw"])
        m = max(m, S) if mode == "2bw" else m
        inflight = rng.choice([None, rng.randint(1, S), sorted((rng.randint(1, S) for _ in range(S)), reverse=True)])
        return g.async_1f1b(S, m, rng.randint(1, 3), inflight=inflight, mode=mode,
                            vertical_sync=mode == "stash" and rng.random() < 0.3, num_groups=rng.randint(1, 3))
    if kind == "gropipe":
        inner = rng.choice(["1f1b", "gpipe", zb.zb_h1(S, m), zb.zb_h2(S, m)])
        return g.gropipe(rng.randint(1, 4), S, m, inner=inner, delay=rng.randint(0, 1),
                         num_iterations=rng.randint(1, 3), first_iteration=rng.randint(0, 2),
                         drain=rng.random() < 0.5)
    if kind == "zb":
        fn = rng.choice([zb.zb_h1, zb.zb_h2, zb.zb_v, zb.interleaved_zb, zb.dualpipe_v])
        return fn(S, max(m, 2 * S)) if fn is zb.dualpipe_v else fn(S, m)
    if kind == "dp":
        return g.data_parallel(rng.randint(1, 6), rng.randint(1, 4))
    return g.tensor2d_step(rng.randint(1, 2), rng.randint(1, 4))


def _costs(rng: random.Random, stages: int, floats: bool) -> StageCosts:
    def times() -> tuple[float, ...]:
        return tuple(rng.choice([0.0, round(rng.uniform(0.1, 3.0), 3), rng.uniform(0.05, 3.0)]) for _ in range(stages))

    def sizes(top: int) -> tuple:
        return tuple(rng.choice([0.0, rng.uniform(0, top)]) if floats else rng.choice([0, rng.randint(1, top)])
                     for _ in range(stages))

    inputs, weights = times(), times()
    return StageCosts(forward_ms=times(), backward_ms=tuple(i + w for i, w in zip(inputs, weights)),
                      send_bytes=tuple(rng.choice([0, rng.randint(1, 10**7)]) for _ in range(stages)),
                      param_bytes=sizes(10**8), grad_bytes=tuple(rng.randint(0, 10**8) for _ in range(stages)),
                      optimizer_bytes=sizes(10**8), activation_bytes=sizes(10**7), step_ms=times(),
                      input_grad_ms=inputs, weight_grad_ms=weights, microbatch_size=rng.choice([None, 1, 4]))


def _cluster(rng: random.Random, ranks: int) -> ClusterSpec | None:
    if rng.random() < 0.2:
        return None
    per_node = rng.choice([ranks, 1, 2, 3, 4])
    nodes = -(-ranks // per_node)
    intra = LinkSpec("nvlink", rng.choice([0.0, 5.0]), rng.choice([100.0, 10.0]))
    inter = LinkSpec("ib", rng.choice([0.0, 20.0]), rng.choice([1.0, 12.5]))
    return ClusterSpec("c", nodes, per_node, DEVICE, intra, inter if nodes > 1 else rng.choice([None, inter]),
                       overlap_slowdown=rng.choice([1.0, 1.0, 1.5, 2.5]), shared_compute=rng.random() < 0.3,
                       collective_call_ms=rng.choice([0.0, 0.0, 0.05]),
                       collective_link=rng.choice([None, LinkSpec("gloo", 50.0, 2.0)]))


def _case(seed: int):
    rng = random.Random(seed)
    schedule = _pipeline(rng)
    if rng.random() < 0.1:
        schedule = lower(schedule)  # an already lowered schedule simulates the same
    used = max(a.stage for r in range(schedule.num_ranks) for a in schedule.actions(r)) + 1
    costs = _costs(rng, max(used, schedule.num_stages or 1), floats=rng.random() < 0.15)
    cluster = _cluster(rng, schedule.num_ranks)
    sharing = CoreSharing(rng.choice([1, 2]), rng.choice([0.0, 1.0])) if rng.random() < 0.1 else None
    return schedule, costs, cluster, sharing


@pytest.mark.parametrize("seed", range(160))
def test_random_cases_equal_the_reference(seed):
    schedule, costs, cluster, sharing = _case(seed)
    mb = 2 if seed % 5 == 0 else None
    assert_same(simulate(schedule, costs, cluster, microbatch_size=mb, sharing=sharing),
                reference_simulate(schedule, costs, cluster, microbatch_size=mb, sharing=sharing))


@pytest.mark.parametrize("seed", range(8))
def test_default_costs_equal_the_reference(seed):
    schedule = _case(1000 + seed)[0]
    assert_same(simulate(schedule), reference_simulate(schedule))


def _several_nodes(per_node: int, nodes: int, slowdown: float = 1.0) -> ClusterSpec:
    return ClusterSpec("nodes", nodes, per_node, DEVICE, LinkSpec("nvlink", 5.0, 100.0), LinkSpec("ib", 20.0, 12.5),
                       overlap_slowdown=slowdown)


@pytest.mark.parametrize("schedule, cluster", [
    (g.one_f_one_b(16, 64), _several_nodes(4, 4)),  # ports shared by both directions at every node boundary
    (g.gpipe(12, 24), _several_nodes(3, 4, slowdown=1.6)),
    (g.gropipe(4, 4, 16, delay=1, num_iterations=3), _several_nodes(4, 4)),  # all-reduces across nodes
    (g.async_1f1b(8, 8, 4, num_groups=2), _several_nodes(2, 8, slowdown=1.3)),
    (g.interleaved(4, 16, 2), _several_nodes(2, 2)),
])
def test_larger_schedules_on_several_nodes_equal_the_reference(schedule, cluster):
    costs = _costs(random.Random(7), schedule.num_stages, floats=False)
    assert_same(simulate(schedule, costs, cluster), reference_simulate(schedule, costs, cluster))


def test_errors_are_the_reference_errors():
    stuck = Schedule.from_text(["0RECV_F0<1 0F0", "0RECV_F0<0 0F0"], num_stages=1)
    for sim in (simulate, reference_simulate):
        with pytest.raises(ValueError, match="cannot finish: rank 0 is blocked at step 0"):
            sim(stuck)
        with pytest.raises(ValueError, match="schedule uses stages up to 3 but stage_costs has 2"):
            sim(g.one_f_one_b(4, 4), StageCosts.uniform(2))
        with pytest.raises(ValueError, match="has 2 devices but the schedule needs 4 ranks"):
            sim(g.one_f_one_b(4, 4), None, _several_nodes(1, 2))


def test_the_timeline_is_made_when_read_and_then_kept():
    result = simulate(g.gropipe(2, 3, 4, delay=1, num_iterations=3))
    work, steps = result.work_ms(), result.step_ends()
    first = result.timeline
    assert result.timeline is first and len(first) > 0
    shifted = result.replace(timeline=first.shifted(1.0))
    assert shifted.timeline.start == 1.0 and shifted.metrics is result.metrics
    assert shifted.work_ms() == work  # read off the new timeline
    assert shifted.step_ends() == {key: end + 1.0 for key, end in steps.items()}
    with pytest.raises(ValueError, match="no field 'nope'"):
        result.replace(nope=1)


def _random_walk_schedule(rng: random.Random) -> Schedule:
    """Ranks of random forwards, backwards (whole or split, some bucketed), steps and sends, weight versions on
    some: whatever order, memory_breakdown walks it."""
    from workbench.core.ir import Action, Op, ScheduleMeta

    def action() -> Action:
        op = rng.choice([Op.FORWARD, Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.STEP,
                         Op.SEND_F])
        stage, mb = rng.randint(0, 2), rng.randint(0, 3)
        if op is Op.STEP:
            return Action(stage, op)
        if op is Op.SEND_F:
            return Action(stage, op, mb, peer=1)
        return Action(stage, op, mb, iteration=rng.choice([None, 0, 1]), version=rng.choice([None, 0, 1, 2]),
                      bucket=rng.choice([None, None, 0, 1]))

    def burst() -> list[Action]:  # forwards, a step while they are in flight, their backwards: stale versions
        stage, mbs = rng.randint(0, 2), rng.sample(range(4), rng.randint(1, 3))
        return ([Action(stage, Op.FORWARD, mb, version=rng.choice([None, 0, 1])) for mb in mbs]
                + [Action(stage, Op.STEP)] * rng.randint(1, 2) + [Action(stage, Op.BACKWARD, mb) for mb in mbs])

    def rank() -> tuple[Action, ...]:
        out: list[Action] = []
        for _ in range(rng.randint(0, 6)):
            out += burst() if rng.random() < 0.4 else [action() for _ in range(rng.randint(1, 6))]
        return tuple(out)

    ranks = tuple(rank() for _ in range(rng.randint(1, 3)))
    meta = ScheduleMeta(weight_stashing=rng.random() < 0.5, delay=rng.randint(0, 1))
    return Schedule(ranks, num_stages=3, meta=meta)


@pytest.mark.parametrize("seed", range(60))
def test_memory_walk_equals_memory_breakdown(seed):
    from workbench.scheduling.memory import MemoryWalk, memory_breakdown

    rng = random.Random(seed)
    schedule = _random_walk_schedule(rng)
    costs = _costs(rng, 3, floats=rng.random() < 0.3)
    expected = memory_breakdown(schedule, costs)
    got = MemoryWalk(schedule).breakdown(costs)
    assert got == expected
    assert [[type(v) for v in row.values()] for row in got] == [[type(v) for v in row.values()] for row in expected]


@pytest.mark.parametrize("seed", range(60))
def test_compiling_before_lowering_equals_compiling_the_lowered_schedule(seed):
    """Where lowering only adds sends and receives, the compiler adds their entries itself: the same programs,
    tables and memory walk as compiling the lowered schedule."""
    from workbench.scheduling.sim_compile import _compile

    schedule = _case(seed)[0]
    direct, lowered = _compile(schedule), _compile(lower(schedule))
    for name in ("programs", "classes", "sends", "send_queue", "queue_receiver", "ar_keys", "needs", "max_stage",
                 "iterations"):
        assert getattr(direct, name) == getattr(lowered, name), name
    assert direct.memory.ranks == lowered.memory.ranks and direct.memory.pending == lowered.memory.pending
    assert direct.lowered == lowered.lowered == lower(schedule)
