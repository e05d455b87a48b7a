"""The per-layer hybrid search: Galvatron's strategy count, the cost model's shape, and exact optimality
against brute force on small stages (every per-layer assignment enumerated)."""

import itertools
import math
import random
import re

import pytest

from workbench.core.costs import ClusterSpec, DeviceSpec, LayerCost, LinkSpec, ModelCosts
from workbench.core.plan import LayerPlan
from workbench.planning.layerwise.layer_strategies import (CONV, LINEAR, TRANSFORMER, LayerKind, LayerStrategy,
                                                           decision_trees, for_layer, galvatron_space, guess_layer_kind,
                                                           stage_strategies)
from workbench.planning.layerwise.layer_dp import least_time
from workbench.planning.layerwise.stage_search import (StageSpec, assignment_cost, bucket_dp, layer_cost, pareto_dp,
                                                       search_stage, transition_ms)

GIB = 2**30


def two_node_cluster(per_node: int = 2, overlap: float = 1.2) -> ClusterSpec:
    """Two nodes: a fast link inside, a slow one between, so the consecutive flag matters."""
    device = DeviceSpec("gpu", {"float32": 100.0}, 16 * GIB, 1000.0)
    return ClusterSpec("2-node", 2, per_node, device, LinkSpec("nvlink", 5.0, 100.0), LinkSpec("ib", 10.0, 10.0),
                       overlap_slowdown=overlap)


def random_stage(seed: int, layers: int = 6, devices: int = 4) -> StageSpec:
    rng = random.Random(seed)
    costs = ModelCosts("random", 4, "gpu", tuple(
        LayerCost(f"block_{i}", rng.uniform(1, 10), rng.uniform(2, 20), param_bytes=rng.randint(1, 400) * 2**20,
                  activation_bytes=rng.randint(1, 64) * 2**20, saved_bytes=rng.randint(8, 512) * 2**20)
        for i in range(layers)), input_bytes=16 * 2**20)
    return StageSpec(costs, two_node_cluster(), devices=devices, microbatch_size=8, num_microbatches=4, in_flight=2)


def brute_force(spec: StageSpec, strategies, budget):
    """Least time over every per-layer assignment whose memory fits (None if none): the definition."""
    n = len(spec.layer_costs)
    options = [[s for s in strategies if s.tp == "none" or s.tp in spec.kind(i).tp_kinds] for i in range(n)]
    cost = {(i, s): layer_cost(spec, i, s) for i in range(n) for s in options[i]}
    move = {(i, a, b): transition_ms(spec, i, a, b) for i in range(1, n) for a in strategies for b in strategies}
    best = None
    for pick in itertools.product(*options):
        memory = sum(cost[(i, s)].memory_bytes for i, s in enumerate(pick))
        if memory > budget:
            continue
        time = sum(cost[(i, s)].time_ms for i, s in enumerate(pick)) + sum(
            move[(i, pick[i - 1], pick[i])] for i in range(1, n))
        if best is None or time < best[0]:
            best = (time, memory, pick)
    return best


# -- the strategy space --------------------------------------------------------------------------------------------

def test_galvatron_count_for_8_devices():
    assert len(decision_trees(8)) == 22
    assert len(decision_trees(8, prune_mixed=False)) == 34  # before rule 3 (no DP + SDP in one tree)
    space = galvatron_space(8)
    assert {pp: len(s) for pp, s in space.items()} == {1: 11, 2: 7, 4: 3, 8: 1}
    assert sum(len(s) for s in space.values()) == 22
    assert sum(len(s) for s in galvatron_space(8, recompute=(False, True)).values()) == 44
    assert len(stage_strategies(8, recompute=(False, True))) == 22


def test_trees_follow_the_pruning_rules():
    for tree in decision_trees(16):
        methods = [m for m, _ in tree]
        assert len(methods) == len(set(methods))                     # each method once
        assert all(f >= 2 and f & (f - 1) == 0 for _, f in tree)     # power-of-two fan-outs
        assert math.prod(f for _, f in tree) == 16
        assert not {"dp", "sdp"} <= set(methods)                     # no DP mixed with SDP
        assert "pp" not in methods[1:]                               # pipelining is the root


def test_consecutive_flag_places_the_groups():
    inner = LayerStrategy(2, "replicate", "1d", consecutive=True, devices=8)
    outer = LayerStrategy(2, "replicate", "1d", consecutive=False, devices=8)
    assert inner.tp_ranks() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert outer.tp_ranks() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert outer.dp_ranks() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert LayerStrategy(8, "replicate", "1d", consecutive=False, devices=8).consecutive  # nothing beside it
    assert inner.to_layer_plan() == LayerPlan(dp="replicate", tp="1d", tp_degree=2)
    assert outer.text == "ddp.tp1d2.strided"


def test_zero2_replaces_ddp_as_the_unsharded_kind():
    kinds = {s.dp for s in stage_strategies(8, dp_kinds=("zero2", "fsdp")) if s.dp_degree > 1}
    assert kinds == {"zero2", "fsdp"}
    assert len(stage_strategies(8, dp_kinds=("zero2", "fsdp"))) == 11
    assert len(stage_strategies(8, dp_kinds=("replicate", "zero2", "fsdp"))) == 16


def test_conv_layer_gets_no_tensor_parallelism():
    pool = stage_strategies(8, tp_kinds=("1d", "2d"))
    assert {s.tp_degree for s in pool if s.tp == "2d"} == {4}  # a square grid only
    assert all(s.tp == "none" for s in for_layer(pool, CONV))
    assert {s.tp for s in for_layer(pool, TRANSFORMER)} == {"none", "1d", "2d"}
    costs = ModelCosts("mixed", 8, "gpu", (
        LayerCost("conv1_1", 5.0, 10.0, param_bytes=2**20, activation_bytes=2**24, saved_bytes=2**25),
        LayerCost("fc6", 5.0, 10.0, param_bytes=2**28, activation_bytes=2**16, saved_bytes=2**16)))
    assert [guess_layer_kind(l) for l in costs.layers] == [CONV, LINEAR]
    assert guess_layer_kind(LayerCost("layer1_0", 1, 1)) is not TRANSFORMER  # a ResNet block
    assert guess_layer_kind(LayerCost("block_3", 1, 1)) is TRANSFORMER
    spec = StageSpec(costs, two_node_cluster(4), devices=8, microbatch_size=8)
    found = search_stage(spec, pool, 16 * GIB)
    assert found.strategies[0].tp == "none"
    with pytest.raises(ValueError, match="'strategy.tp'.*conv"):
        layer_cost(spec, 0, LayerStrategy(2, "replicate", "1d", devices=8))
    only_tp = [s for s in pool if s.tp != "none"]
    with pytest.raises(ValueError, match="'strategies'.*conv1_1"):
        search_stage(spec, only_tp, 16 * GIB)


# -- the cost model --------------------------------------------------------------------------------------------------

def test_compute_and_memory_split_as_the_strategy_shards():
    spec = random_stage(0, layers=2, devices=4)
    layer = spec.layer_costs[1]
    ddp = layer_cost(spec, 1, LayerStrategy(1, "replicate", devices=4))
    tp2 = layer_cost(spec, 1, LayerStrategy(2, "replicate", "1d", devices=4))
    fsdp = layer_cost(spec, 1, LayerStrategy(1, "fsdp", devices=4))
    zero2 = layer_cost(spec, 1, LayerStrategy(1, "zero2", devices=4))
    recompute = layer_cost(spec, 1, LayerStrategy(1, "replicate", recompute=True, devices=4))
    share = spec.microbatch_size / 4 / spec.costs.batch_size
    assert ddp.compute_ms == pytest.approx(4 * (layer.forward_ms + layer.backward_ms) * share)
    assert tp2.compute_ms == pytest.approx(ddp.compute_ms)  # half the samples per group twice, half the work
    assert recompute.compute_ms == pytest.approx(ddp.compute_ms + 4 * layer.forward_ms * share)
    p = layer.param_bytes
    assert ddp.state_bytes == 4 * p                        # params + grads + Adam's two moments
    assert zero2.state_bytes == p + math.ceil(3 * p / 4)
    assert fsdp.state_bytes == 4 * p // 4
    assert tp2.state_bytes == 2 * p
    assert ddp.activation_bytes == math.ceil(layer.saved_bytes * share * 2)
    assert recompute.activation_bytes == math.ceil(spec.input_bytes(1) * share * 2)  # only the input, 2 in flight
    assert tp2.tp_comm_ms > 0 and ddp.tp_comm_ms == 0
    assert 0 < ddp.dp_comm_ms < fsdp.dp_comm_ms


def test_overlap_hides_communication_only_up_to_the_slowdown():
    spec = random_stage(1, layers=1, devices=4)
    free = StageSpec(spec.costs, two_node_cluster(overlap=1.0), devices=4, microbatch_size=8, num_microbatches=4)
    slowed = StageSpec(spec.costs, two_node_cluster(overlap=2.0), devices=4, microbatch_size=8, num_microbatches=4)
    fsdp = LayerStrategy(1, "fsdp", devices=4)
    a, b = layer_cost(free, 0, fsdp), layer_cost(slowed, 0, fsdp)
    assert a.dp_comm_ms < b.dp_comm_ms  # overlap at γ = 2 is no better than serial


def test_transitions_follow_layouts_and_links():
    spec = random_stage(2, layers=2, devices=4)  # ranks 0-1 on node 0, 2-3 on node 1
    ddp, fsdp = LayerStrategy(1, "replicate", devices=4), LayerStrategy(1, "fsdp", devices=4)
    inner = LayerStrategy(2, "replicate", "1d", True, devices=4)
    outer = LayerStrategy(2, "replicate", "1d", False, devices=4)
    assert transition_ms(spec, 1, ddp, fsdp) == 0.0        # same layout
    assert transition_ms(spec, 0, ddp, inner) == 0.0       # nothing before the stage's first layer
    assert transition_ms(spec, 1, ddp, inner) > 0
    assert transition_ms(spec, 1, inner, outer) > transition_ms(spec, 1, ddp, inner)  # across the slow link
    assert transition_ms(spec, 1, ddp, inner) == transition_ms(spec, 1, inner, ddp)
    # the consecutive group's all-reduces stay on one node; the strided one's cross the slow link
    assert layer_cost(spec, 1, inner).tp_comm_ms < layer_cost(spec, 1, outer).tp_comm_ms



def _fetches_by_sets(have, need, devices, node):
    """Per-rank fetch counts by the definition: each rank's units as a set, every node's as their union."""
    def held(layout, r):
        tp, t, consecutive = layout
        d = devices // t
        group, pos = (r // t, r % t) if consecutive else (r % d, r // d)
        slices, pieces = range(group * t, (group + 1) * t), range(devices)
        if tp == "2d":
            q = math.isqrt(t)
            row, col = divmod(pos, q)
            slices = range(group * t + row * q, group * t + (row + 1) * q)
            pieces = range(col * (devices // q), (col + 1) * (devices // q))
        return {s * devices + p for s in slices for p in pieces}
    before = [held(have, r) for r in range(devices)]
    on_node: dict[int, set[int]] = {}
    for r in range(devices):
        on_node.setdefault(node[r], set()).update(before[r])
    out = []
    for r in range(devices):
        missing = held(need, r) - before[r]
        near = len(missing & on_node[node[r]])
        out.append((near, len(missing) - near))
    return out


def test_fetch_counts_on_cells_match_the_units_counted_one_by_one():
    from workbench.planning.layerwise.layer_costs import _fetch_units

    for n in (2, 4, 8, 16):
        layouts = [("none", 1, True)] + [("1d", t, c) for t in (2, 4, 8, 16) if t <= n for c in (True, False)
                                         if c or t < n] + [("2d", t, c) for t in (4, 16) if t <= n
                                                           for c in (True, False) if c or t < n]
        for per_node, strided in ((1, False), (2, False), (4, True), (8, False), (n, False)):
            node = tuple((r * 3 % n if strided else r) // per_node for r in range(n))
            for have, need in itertools.product(layouts, repeat=2):
                expected = tuple(dict.fromkeys(_fetches_by_sets(have, need, n, node)))
                assert _fetch_units(have, need, n, node) == expected, (have, need, n, node)


def test_layer_costs_shared_between_stages_and_layers_equal_those_costed_alone():
    """Stages sharing one table of layer costs (and layers of one class within a stage) answer exactly what the
    cost model computes for each layer afresh: the table separates what a cost depends on."""
    from workbench.planning.layerwise.layer_costs import _layer_cost

    rng = random.Random(5)
    block = LayerCost("block_0", 2.0, 4.0, param_bytes=64 * 2**20, activation_bytes=8 * 2**20,
                      saved_bytes=96 * 2**20)
    odd = LayerCost("block_9", 2.0, 4.0, param_bytes=64 * 2**20, activation_bytes=4 * 2**20, saved_bytes=96 * 2**20)
    layers = [LayerCost("embeddings", 0.5, 1.0, param_bytes=300 * 2**20, activation_bytes=8 * 2**20)]
    layers += [LayerCost(f"block_{i}", 2.0, 4.0, param_bytes=64 * 2**20, activation_bytes=8 * 2**20,
                         saved_bytes=96 * 2**20) for i in range(1, 5)] + [block, odd, block, block]
    costs = ModelCosts("repeated", 4, "gpu", tuple(layers), input_bytes=2**20)
    cluster = two_node_cluster(per_node=4)
    pool = stage_strategies(4, dp_kinds=("replicate", "zero2", "fsdp"), recompute=(False, True))
    tables: dict = {}
    for _ in range(12):
        first = rng.randrange(len(layers))
        args = dict(devices=4, microbatch_size=rng.choice([4, 8]), layers=(first, rng.randrange(first, len(layers))),
                    num_microbatches=rng.choice([1, 4]), in_flight=rng.choice([1, 2]),
                    ranks=tuple(rng.sample(range(8), 4)), optimizer=rng.choice(["adam", "sgd"]))
        shared, alone = StageSpec(costs, cluster, **args).share_costs(tables), StageSpec(costs, cluster, **args)
        for i in range(len(alone.layer_costs)):
            for s in for_layer(pool, alone.kind(i)):
                assert layer_cost(shared, i, s) == _layer_cost(alone, i, s)
                if i:
                    assert transition_ms(shared, i, pool[0], s) == transition_ms(alone, i, pool[0], s)
    assert len(tables) > 1


def test_collective_steps_on_shared_cores_wait_per_step_only_when_the_group_outnumbers_the_cores():
    from dataclasses import replace

    from workbench.planning.costs.clusters import get_cluster
    from workbench.planning.layerwise.stage_search import paying_steps

    local = replace(get_cluster("local"), collective_call_ms=2.0)
    costs = ModelCosts("t", 8, "cpu", tuple(LayerCost(f"block_{i}", 1.0, 2.0, param_bytes=2**20,
                                                      activation_bytes=2**16) for i in range(2)), input_bytes=2**16)
    spec = StageSpec(costs, local, devices=4, microbatch_size=8, num_microbatches=3)
    cores = spec._cores
    assert cores is not None and cores >= 1
    for n in (1, 2, 4, 8):
        assert paying_steps(spec, n, 2 * (n - 1)) == (min(1, 2 * (n - 1)) if n <= cores else 2 * (n - 1))
    gpu = random_stage(2, layers=2, devices=4)  # devices of their own: every step pays what was measured
    assert gpu._cores is None and paying_steps(gpu, 2, 2) == 2
    # a layout change inside a stage of 4: the runtime's all-gather (3 steps) forward and all-reduce of the
    # gradient (6 steps) backward, every micro-batch, each step paying the call cost where 4 ranks outnumber
    # the cores
    ddp, inner = LayerStrategy(1, "replicate", devices=4), LayerStrategy(2, "replicate", "1d", True, devices=4)
    free = StageSpec(costs, replace(local, collective_call_ms=0.0), devices=4, microbatch_size=8, num_microbatches=3)
    extra = transition_ms(spec, 1, ddp, inner) - transition_ms(free, 1, ddp, inner)
    steps = paying_steps(spec, 4, 3) + paying_steps(spec, 4, 6)
    assert extra == pytest.approx(3 * steps * 2.0)
    # a layout that holds every row on every rank (1D over the whole stage) is gathered into, never split
    whole = LayerStrategy(4, "replicate", "1d", True, devices=4)
    extra_in = transition_ms(spec, 1, ddp, whole) - transition_ms(free, 1, ddp, whole)
    assert extra_in == pytest.approx(3 * paying_steps(spec, 4, 3) * 2.0)

# -- optimality --------------------------------------------------------------------------------------------------------

SMALL_POOL = (LayerStrategy(1, "replicate", devices=4), LayerStrategy(1, "fsdp", recompute=True, devices=4),
              LayerStrategy(2, "replicate", "1d", True, devices=4), LayerStrategy(2, "fsdp", "1d", False, devices=4))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.7, 1.0])
def test_search_matches_brute_force(seed, fraction):
    spec = random_stage(seed, layers=3 + seed % 4)
    pool = SMALL_POOL[:3 + seed % 2]
    low = brute_force(spec, pool, math.inf)
    least = sum(min(layer_cost(spec, i, s).memory_bytes for s in pool) for i in range(len(spec.layer_costs)))
    budget = least + fraction * (low[1] - least)
    best = brute_force(spec, pool, budget)
    found = search_stage(spec, pool, budget)
    assert found.time_ms == pytest.approx(best[0], rel=1e-12)
    assert found.memory_bytes <= budget
    again = assignment_cost(spec, found.strategies)
    assert again.time_ms == pytest.approx(found.time_ms) and again.memory_bytes == found.memory_bytes


@pytest.mark.parametrize("seed", range(3))
def test_search_matches_brute_force_with_2d_grids(seed):
    pool = (LayerStrategy(1, "replicate", devices=4), LayerStrategy(4, "replicate", "1d", devices=4),
            LayerStrategy(4, "fsdp", "2d", devices=4), LayerStrategy(2, "zero2", "1d", False, True, devices=4))
    spec = random_stage(10 + seed, layers=5)
    budget = brute_force(spec, pool, math.inf)[1] * 0.7
    best = brute_force(spec, pool, budget)
    assert search_stage(spec, pool, budget).time_ms == pytest.approx(best[0], rel=1e-12)


def test_memory_cap_forces_a_mix_and_the_search_finds_it():
    spec = random_stage(3, layers=6)
    unconstrained = brute_force(spec, SMALL_POOL, math.inf)
    budget = unconstrained[1] * 0.6
    best = brute_force(spec, SMALL_POOL, budget)
    assert len(set(best[2])) >= 2  # no single strategy is optimal under this cap
    found = search_stage(spec, SMALL_POOL, budget)
    assert found.time_ms == pytest.approx(best[0], rel=1e-12)
    assert found.transition_ms >= 0 and len(set(found.strategies)) >= 2
    assert found.layer_plans() == tuple(s.to_layer_plan() for s in found.strategies)
    assert search_stage(spec, SMALL_POOL, budget, method="buckets").time_ms >= found.time_ms - 1e-9


def test_nothing_fits_names_the_shortfall():
    spec = random_stage(4, layers=4)
    least = sum(min(layer_cost(spec, i, s).memory_bytes for s in SMALL_POOL) for i in range(4))
    assert search_stage(spec, SMALL_POOL, least).memory_bytes == least  # exactly full still fits
    with pytest.raises(ValueError, match=rf"least memory any needs is {least} bytes, 1000 bytes"):
        search_stage(spec, SMALL_POOL, least - 1000)


@pytest.mark.parametrize("seed", range(40))
def test_solvers_on_random_tables(seed):
    rng = random.Random(seed)
    layers, layouts = rng.randint(1, 6), ["a", "b", "c"]
    options = [[(rng.uniform(0, 10), rng.randint(0, 20) * 8, rng.choice(layouts)) for _ in range(rng.randint(1, 4))]
               for _ in range(layers)]
    cost = {(l, a, b): (0.0 if a == b else rng.uniform(0, 5)) for l in range(layers) for a in layouts for b in layouts}
    move = lambda l, a, b: cost[(l, a, b)]  # noqa: E731
    budget = 8 * rng.randint(0, 20 * layers)
    best, fastest = None, math.inf
    for pick in itertools.product(*[range(len(o)) for o in options]):
        t = sum(options[l][i][0] for l, i in enumerate(pick)) + sum(
            move(l, options[l - 1][pick[l - 1]][2], options[l][pick[l]][2]) for l in range(1, layers))
        fastest = min(fastest, t)
        if sum(options[l][i][1] for l, i in enumerate(pick)) > budget:
            continue
        best = t if best is None else min(best, t)
    free_time, free_memory, free_picks = least_time(options, move)  # the budget ignored
    assert free_time == pytest.approx(fastest, rel=1e-12)
    assert free_memory == sum(options[l][i][1] for l, i in enumerate(free_picks))
    exact = pareto_dp(options, move, budget)
    bounded = pareto_dp(options, move, budget, best * (1 + 1e-9) if best is not None else math.inf)
    assert bounded == exact  # a bound no lower than the optimum prunes, and changes no answer
    buckets = bucket_dp(options, move, budget, resolution=max(1, budget // 8))  # memory on unit boundaries
    if best is None:
        assert exact is None and bounded is None and buckets is None
        return
    for found in (exact, bounded, buckets):
        time, memory, picks = found
        assert time == pytest.approx(best, rel=1e-12) and memory <= budget
        assert memory == sum(options[l][i][1] for l, i in enumerate(picks))



@pytest.mark.parametrize("seed", range(10))
def test_bucket_table_breaks_ties_by_last_option_then_least_memory(seed):
    """The one per-layer programme as the planner's selective recomputation asks it (each option its own layout,
    nothing to pay between layers): of the fastest choices, the last layer's earliest option, then the least
    memory, each checked against every choice enumerated (whole-number times, so ties are common)."""
    rng = random.Random(seed)
    for _ in range(20):
        options = [[(float(rng.randint(0, 3)), rng.randint(0, 30), o) for o in range(rng.randint(1, 3))]
                   for _ in range(rng.randint(1, 6))]
        budget = rng.randint(1, 100)
        found = bucket_dp(options, lambda l, a, b: 0.0, budget, resolution=budget)  # whole units: exact
        fits = [(sum(options[l][i][0] for l, i in enumerate(c)), c[-1], sum(options[l][i][1] for l, i in enumerate(c)))
                for c in itertools.product(*[range(len(o)) for o in options])
                if sum(options[l][i][1] for l, i in enumerate(c)) <= budget]
        if not fits:
            assert found is None
            continue
        time, memory, picks = found
        assert (time, picks[-1], memory) == min(fits)
        assert memory == sum(options[l][i][1] for l, i in enumerate(picks))

# -- bad input ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, field", [
    ({"devices": 3}, "devices"),
    ({"microbatch_size": 6}, "microbatch_size"),
    ({"layers": (2, 9)}, "layers"),
    ({"num_microbatches": 0}, "num_microbatches"),
    ({"first_rank": 2}, "first_rank"),
    ({"optimizer": "lamb"}, "optimizer"),
    ({"kinds": [TRANSFORMER]}, "kinds"),
    ({"kinds": ["conv"] * 4}, "kinds[0]"),
])
def test_bad_stage_names_the_field(changes, field):
    options = dict(costs=random_stage(0, layers=4).costs, cluster=two_node_cluster(), devices=4, microbatch_size=8)
    with pytest.raises(ValueError, match=rf"'{re.escape(field)}'"):
        StageSpec(**{**options, **changes})


@pytest.mark.parametrize("build, field", [
    (lambda: LayerStrategy(3, devices=4), "strategy.tp_degree"),
    (lambda: LayerStrategy(2, "ddp", "1d", devices=4), "strategy.dp"),
    (lambda: LayerStrategy(2, devices=4), "strategy.tp"),
    (lambda: LayerStrategy(2, "replicate", "2d", devices=4), "strategy.tp_degree"),
    (lambda: LayerStrategy(1, devices=6), "strategy.devices"),
    (lambda: stage_strategies(8, dp_kinds=("ddp",)), "dp_kinds"),
    (lambda: stage_strategies(8, tp_kinds=("3d",)), "tp_kinds"),
    (lambda: stage_strategies(8, recompute=(1,)), "recompute"),
    (lambda: decision_trees(6), "devices"),
    (lambda: LayerKind("odd", ("1d",), 0), "kind.linears"),
    (lambda: search_stage(random_stage(0, 2), SMALL_POOL, -1.0), "budget_bytes"),
    (lambda: search_stage(random_stage(0, 2), SMALL_POOL, method="greedy"), "method"),
    (lambda: search_stage(random_stage(0, 2), stage_strategies(8)), "strategies"),
    (lambda: assignment_cost(random_stage(0, 2), SMALL_POOL[:1]), "strategies"),
])
def test_bad_values_name_the_field(build, field):
    with pytest.raises(ValueError, match=rf"'{re.escape(field)}'"):
        build()
