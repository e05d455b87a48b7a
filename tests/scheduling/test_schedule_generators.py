"""Generators: golden text grids at small sizes, validity across sizes, weight versions, bad input."""

import os
from pathlib import Path

import pytest

from workbench.core.ir import Op, Schedule
from workbench.scheduling import generators as g
from workbench.scheduling.memory import in_flight_microbatches
from workbench.scheduling.passes import add_weight_stash, lower
from workbench.scheduling.validate import validate

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_CASES = {
    "gpipe_3x4": lambda: g.gpipe(3, 4),
    "1f1b_3x4": lambda: g.one_f_one_b(3, 4),
    "1f1b_2x2_lowered": lambda: lower(g.one_f_one_b(2, 2)),
    "interleaved_2x4_v2": lambda: g.interleaved(2, 4, 2),
    "async_3x2_i2_lowered": lambda: lower(g.async_1f1b(3, 2, 2)),
    "gropipe_2x2_m2_d0": lambda: g.gropipe(2, 2, 2, delay=0),
    "gropipe_2x2_m2_d1_i2": lambda: g.gropipe(2, 2, 2, delay=1, num_iterations=2),
    "gropipe_1x2_m2_gpipe_d1_drain": lambda: g.gropipe(1, 2, 2, inner="gpipe", delay=1, num_iterations=2, drain=True),
    "dp_2_b3": lambda: g.data_parallel(2, 3),
    "tensor2d_q2_l2": lambda: g.tensor2d_step(2, 2),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_grid(name):
    grid = GOLDEN_CASES[name]().to_grid() + "\n"
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("WORKBENCH_REGEN_GOLDEN"):
        path.write_text(grid)
    assert grid == path.read_text(), f"{name} changed; review and regenerate with WORKBENCH_REGEN_GOLDEN=1"


def test_1f1b_golden_is_the_textbook_order():
    # stage 0 of 3 warms up with 2 forwards, then alternates; the last stage alternates from the start
    s = g.one_f_one_b(3, 4)
    assert [str(a) for a in s.actions(0)] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [str(a) for a in s.actions(2)] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]


def _all_small_schedules():
    for p in (1, 2, 3, 4):
        for m in (1, 2, 3, 5, 8):
            yield g.gpipe(p, m)
            yield g.one_f_one_b(p, m)
            yield g.async_1f1b(p, m, 3)
        for v in (1, 2, 3):
            for m in (p, 2 * p):
                yield g.interleaved(p, m, v)
    for G in (1, 2, 3):
        for inner in ("gpipe", "1f1b"):
            for d in (0, 1):
                yield g.gropipe(G, 3, 4, inner=inner, delay=d, num_iterations=2)
    yield g.data_parallel(4, 3)
    yield g.tensor2d_step(3, 2)


def test_every_generator_validates_raw_and_lowered():
    count = 0
    for schedule in _all_small_schedules():
        validate(schedule)
        validate(lower(schedule))
        count += 1
    assert count > 90


def test_schedule_json_round_trip_keeps_every_action():
    s = lower(g.gropipe(2, 2, 3, delay=1, num_iterations=2))
    assert Schedule.from_json(s.to_json()).to_text() == s.to_text()


def test_interleaved_places_virtual_stages_round_robin():
    s = g.interleaved(3, 6, 2)
    for r in range(3):
        assert {a.stage for a in s.actions(r)} == {r, 3 + r}
        assert all(a.chunk == a.stage // 3 for a in s.actions(r))
    assert s.num_stages == 6


def test_async_versions_backward_uses_its_forwards_version():
    s = g.async_1f1b(4, 4, 3)
    for r in range(4):
        version_of = {}
        steps = 0
        for a in s.actions(r):
            if a.op is Op.FORWARD:
                assert a.version == steps
                version_of[(a.microbatch, a.iteration)] = a.version
            elif a.op is Op.BACKWARD:
                assert a.version == version_of[(a.microbatch, a.iteration)]
            elif a.op is Op.STEP:
                assert a.iteration == steps
                steps += 1
        assert steps == 3


def test_async_has_no_flush_first_stage_starts_next_iteration_before_finishing():
    s = g.async_1f1b(3, 2, 2).actions(0)
    text = [str(a) for a in s]
    # stage 0 runs iteration 1's forwards before iteration 0's last backward
    assert text.index("0F0i1v0") < text.index("0B1i0v0")


def test_weight_stash_exactly_where_a_step_lands_between_forward_and_backward():
    s = add_weight_stash(g.async_1f1b(3, 2, 3))
    for r in range(3):
        stashed = {(a.microbatch, a.iteration) for a in s.actions(r) if a.op is Op.STASH}
        restored = {(a.microbatch, a.iteration) for a in s.actions(r) if a.op is Op.RESTORE}
        assert stashed == restored
        steps, expect = 0, set()
        forward_at = {}
        for a in s.actions(r):
            if a.op is Op.STEP:
                steps += 1
            elif a.op is Op.FORWARD:
                forward_at[(a.microbatch, a.iteration)] = steps
            elif a.op is Op.BACKWARD and forward_at[(a.microbatch, a.iteration)] != steps:
                expect.add((a.microbatch, a.iteration))
        assert stashed == expect
    assert any(a.op is Op.STASH for a in s.actions(0))  # stage 0 has the deepest pipeline, so it stashes


def test_1f1b_keeps_at_most_p_in_flight_gpipe_keeps_m():
    p, m = 4, 12
    assert in_flight_microbatches(g.one_f_one_b(p, m)) == [p - s for s in range(p)]
    assert in_flight_microbatches(g.gpipe(p, m)) == [m] * p


def test_gropipe_ranks_follow_topology_and_ar_after_last_backward():
    s = g.gropipe(2, 3, 4)
    assert s.meta.stage_to_rank == ((0, 1, 2), (3, 4, 5))
    assert s.meta.dp_groups == ((0, 3), (1, 4), (2, 5))
    for r in range(6):
        acts = s.actions(r)
        last_b = max(i for i, a in enumerate(acts) if a.op is Op.BACKWARD)
        assert acts[last_b + 1].op is Op.ALL_REDUCE and acts[last_b + 1].stage == r % 3
        assert acts[-1].op is Op.STEP


def test_gropipe_delay1_steps_apply_previous_iteration_and_leave_last_pending():
    s = g.gropipe(2, 2, 2, delay=1, num_iterations=3)
    steps = [a.iteration for a in s.actions(0) if a.op is Op.STEP]
    assert steps == [0, 1]
    assert s.meta.pending_step_iteration == 2
    # forwards of iteration t run on weights with t-1 updates (never fewer than 0)
    assert {(a.iteration, a.version) for a in s.actions(0) if a.op is Op.FORWARD} == {(0, 0), (1, 0), (2, 1)}
    cont = g.gropipe(2, 2, 2, delay=1, first_iteration=3)
    assert [a.iteration for a in cont.actions(0) if a.op is Op.STEP] == [2]


@pytest.mark.parametrize("call, field", [
    (lambda: g.gpipe(2, 0), "num_microbatches"),
    (lambda: g.one_f_one_b(0, 4), "num_stages"),
    (lambda: g.interleaved(4, 6, 2), "multiple of num_ranks"),
    (lambda: g.interleaved(2, 4, 0), "num_chunks"),
    (lambda: g.gropipe(2, 2, 2, delay=2), "delay"),
    (lambda: g.gropipe(2, 2, 2, inner="zb"), "inner"),
    (lambda: g.data_parallel(2, 0), "num_buckets"),
    (lambda: g.async_1f1b(2, 2, 0), "num_iterations"),
])
def test_bad_input_is_a_clear_value_error(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_schedules_are_named_after_their_generators():
    assert [s.name for s in (g.gpipe(2, 2), g.one_f_one_b(2, 2), g.gropipe(2, 2, 2))] == ["gpipe", "1f1b", "gropipe"]
