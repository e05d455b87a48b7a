import pytest
from hypothesis import given, strategies as st

from workbench.core.plan import ParallelPlan
from workbench.planning.strategy.space import check_plan, enumerate_strategies, factorizations


@pytest.mark.parametrize("name", ["dp8", "gropipe-2x4-1f1b-m8-d1", "gropipe-4x2-gpipe-m4-d0-rc", "pp4-1f1b-m8",
                                  "pp2-interleaved-v2-m4", "async-2x4-m8", "tp2d-2x2-dp2", "tp1d-4-dp2"])
def test_names_round_trip(name):
    s = ParallelPlan.parse(name)
    assert s.name == name
    assert ParallelPlan.parse(s.name) == s


def test_world_sizes():
    assert ParallelPlan.parse("tp2d-2x2-dp2").world_size == 8
    assert ParallelPlan.parse("gropipe-2x4-1f1b-m8-d1").world_size == 8
    assert ParallelPlan.parse("tp1d-4-dp2").world_size == 8


def test_factorizations():
    assert factorizations(8, 2) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert len(factorizations(64, 3)) == 28
    with pytest.raises(ValueError, match="world size must be an int >= 1"):
        factorizations(0, 2)


def test_enumeration_for_8_devices():
    names = {s.name for s in enumerate_strategies(8, num_layers=24, global_batch=64, num_heads=12, hidden=768)}
    for expected in ("dp8", "gropipe-2x4-1f1b-m8-d1", "gropipe-2x4-1f1b-m8-d0", "pp8-1f1b-m8", "async-2x4-m8",
                     "tp2d-2x2-dp2", "tp1d-4-dp2", "pp8-interleaved-v2-m8"):
        assert expected in names
    assert "tp1d-8-dp1" not in names  # 12 heads do not split 8 ways
    assert not any(n.startswith("tp2d-3x3") for n in names)


def test_no_tensor_parallel_without_transformer_shape():
    names = {s.name for s in enumerate_strategies(4, num_layers=10, global_batch=16)}
    assert not any(n.startswith("tp") for n in names)


@given(st.sampled_from([1, 2, 4, 6, 8, 16]), st.sampled_from([8, 16, 48, 96]))
def test_every_enumerated_strategy_is_valid(world, batch):
    for s in enumerate_strategies(world, num_layers=12, global_batch=batch, num_heads=12, hidden=96):
        assert s.world_size == world
        check_plan(s, num_layers=12, global_batch=batch, num_heads=12, hidden=96)
        assert ParallelPlan.parse(s.name) == s


@pytest.mark.parametrize(
    "name, kw, fragment",
    [("pp8-1f1b-m8", dict(num_layers=4, global_batch=8), "8 stages for 4 layers"),
     ("dp3", dict(num_layers=4, global_batch=8), "does not split over 3 replicas"),
     ("gropipe-2x2-1f1b-m3-d0", dict(num_layers=4, global_batch=8), "3 micro-batches do not divide"),
     ("tp2d-2x2-dp1", dict(num_layers=4, global_batch=8, num_heads=3, hidden=96), "not divisible by 2"),
     ("tp1d-2-dp1", dict(num_layers=4, global_batch=8), "needs a GPT-2 model .* no GPT-2 shape"),
     ("tp1d-2-dp1-L[0-1=ddp;2-3=ddp.tp1d2]", dict(num_layers=4, global_batch=8), "costs tensor parallelism from a"),
     ("pp4-interleaved-v2-m12", dict(num_layers=6, global_batch=12), "8 stages for 6 layers")],
)
def test_check_explains(name, kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        check_plan(ParallelPlan.parse(name), **kw)


def test_bad_names_and_values():
    with pytest.raises(ValueError, match="unknown plan name"):
        ParallelPlan.parse("zero3-8")
    with pytest.raises(ValueError, match="square"):
        ParallelPlan.parse("tp2d-2x3-dp1")
    with pytest.raises(ValueError, match="'pipeline.delay' = 2 is invalid"):
        ParallelPlan.parse("gropipe-2x2-1f1b-m4-d2")
    with pytest.raises(ValueError, match="interleaved 1F1B needs a multiple of pp"):
        ParallelPlan.parse("pp4-interleaved-v2-m6")
    with pytest.raises(ValueError, match="no valid strategy"):
        enumerate_strategies(3, num_layers=4, global_batch=1, kinds=["dp"])
