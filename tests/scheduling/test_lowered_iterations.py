"""GroPipe's schedule is lowered once per run: every iteration renumbered from a template equals it built fresh."""

import pytest

from workbench.core.plan import ParallelPlan
from workbench.scheduling.passes import LoweredIterations, lower
from workbench.scheduling.registry import schedule_for


@pytest.mark.parametrize("name", ["gropipe-2x2-1f1b-m4-d0", "gropipe-2x2-1f1b-m4-d1", "gropipe-2x3-gpipe-m3-d1",
                                  "gropipe-3x2-gpipe-m2-d0", "gropipe-1x2-1f1b-m2-d1", "gropipe-2x2-zbh1-m4-d1"])
def test_renumbered_templates_equal_the_schedule_built_for_each_iteration(name):
    plan = ParallelPlan.parse(name)
    iterations = LoweredIterations(lambda i: schedule_for(plan, first_iteration=i), warmup=plan.pipeline.delay)
    assert len(iterations.templates) == plan.pipeline.delay + 1  # lowered once each, not once per step
    for t in range(6):
        fresh = lower(schedule_for(plan, first_iteration=t))
        for rank in range(plan.world_size):
            assert iterations.actions(rank, t) == list(fresh.actions(rank)), (t, rank)


def test_bad_iterations_are_refused():
    plan = ParallelPlan.parse("gropipe-2x2-1f1b-m4-d1")
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        LoweredIterations(lambda i: schedule_for(plan, first_iteration=i), warmup=-1)
    with pytest.raises(ValueError, match="iteration must be an int >= 0"):
        LoweredIterations(lambda i: schedule_for(plan, first_iteration=i)).actions(0, -1)
