import pytest
from hypothesis import given, strategies as st

from workbench.core.ir import Action, Op, Schedule, parse_action


@pytest.mark.parametrize(
    "text",
    ["1F3", "0B2", "0I2", "2W0", "0SEND_F3>1", "1RECV_F3<0", "1SEND_B3>0", "0RECV_B3<1", "0AR", "0ARb2",
     "0STEP", "0STASH4", "0RESTORE4", "1F3c1", "1F3i2v5", "3B10c1i0v2", "12SEND_F7c2>5"],
)
def test_text_form_round_trips(text):
    action = parse_action(text)
    assert str(action) == text
    assert Action.from_dict(action.to_dict()) == action


def test_parse_fields():
    a = parse_action("3B10c1i0v2")
    assert (a.stage, a.op, a.microbatch, a.chunk, a.iteration, a.version) == (3, Op.BACKWARD, 10, 1, 0, 2)
    s = parse_action("0SEND_F3>1")
    assert s.is_send and s.is_comm and not s.is_compute and s.peer == 1
    assert parse_action("1RECV_B2<2").is_recv


actions = st.builds(
    Action,
    stage=st.integers(0, 64),
    op=st.sampled_from([Op.FORWARD, Op.BACKWARD, Op.BACKWARD_WEIGHT, Op.STASH]),
    microbatch=st.integers(0, 500),
    chunk=st.none() | st.integers(0, 8),
    iteration=st.none() | st.integers(0, 100),
    version=st.none() | st.integers(0, 100),
)


@given(actions)
def test_round_trip_property(action):
    assert parse_action(str(action)) == action


@pytest.mark.parametrize(
    "text, fragment",
    [("1X3", "unknown op 'X'"), ("F3", "malformed"), ("1f3", "malformed"), ("", "malformed"),
     ("0SEND_F3", "needs a peer"), ("0F", "needs a microbatch"), ("0F3>1", "does not fit"),
     ("0SEND_F3<1", "does not fit")],
)
def test_malformed_text_is_rejected_with_reason(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_action(text)


def test_constructor_validation():
    with pytest.raises(ValueError, match="stage must be >= 0"):
        Action(-1, Op.FORWARD, 0)
    with pytest.raises(ValueError, match="op must be one of"):
        Action(0, "Z", 0)
    with pytest.raises(ValueError, match="peer is only meaningful"):
        Action(0, Op.FORWARD, 0, peer=1)
    with pytest.raises(ValueError, match="microbatch must be"):
        Action(0, Op.FORWARD, 1.5)
    assert Action(0, "F", 1).op is Op.FORWARD


GPIPE_2x3 = ["0F0 0F1 0F2 . . 0B2 0B1 0B0", ". 1F0 1F1 1F2 1B2 1B1 1B0"]


def test_schedule_text_and_json_round_trip():
    s = Schedule.from_text(GPIPE_2x3, name="gpipe", num_stages=2, num_microbatches=3)
    assert s.num_ranks == 2
    assert s.to_text() == GPIPE_2x3
    assert Schedule.from_json(s.to_json()) == s
    assert [str(a) for a in s.actions(1)][:2] == ["1F0", "1F1"]
    assert s.stages_of(0) == [0]
    assert s.compact().ranks[1][0] == parse_action("1F0")


def test_grid_rendering_has_a_row_per_step_and_a_column_per_rank():
    s = Schedule.from_text(GPIPE_2x3)
    grid = s.to_grid().splitlines()
    assert grid[0].split() == ["|", "rank0", "rank1"]
    assert len(grid) == 2 + 8
    assert grid[2].split() == ["0", "|", "0F0", "."]
    assert grid[-1].split() == ["7", "|", "0B0", "."]


def test_schedule_validation():
    with pytest.raises(ValueError, match="at least one rank"):
        Schedule(ranks=())
    with pytest.raises(ValueError, match=r"ranks\[0\]\[1\] must be an Action"):
        Schedule(ranks=((parse_action("0F0"), "0F1"),))
    with pytest.raises(ValueError, match="rank must be in"):
        Schedule.from_text(GPIPE_2x3)[2]
    with pytest.raises(ValueError, match="unsupported schedule version"):
        Schedule.from_dict({"version": 9, "ranks": []})


def test_schedule_meta_is_typed_and_round_trips_through_json():
    from workbench.core.ir import ScheduleMeta

    meta = ScheduleMeta(stage_to_rank=[[0, 1], [2, 3]], replicas=2, delay=1, pending_step_iteration=3,
                        lowered=["p2p"])
    assert meta.stage_to_rank == ((0, 1), (2, 3)) and meta.lowered == ("p2p",)
    assert meta.to_dict() == {"stage_to_rank": [[0, 1], [2, 3]], "replicas": 2, "delay": 1,
                              "pending_step_iteration": 3, "lowered": ["p2p"]}
    schedule = Schedule.from_text(["0F0 0B0", "1F0 1B0"], meta=meta.to_dict(), num_microbatches=1)
    assert schedule.meta == meta and Schedule.from_json(schedule.to_json()) == schedule
    with pytest.raises(ValueError, match="schedule meta field 'stage_2_rank' is unknown"):
        Schedule.from_text(["0F0"], meta={"stage_2_rank": [[0]]})
    with pytest.raises(ValueError, match="meta.delay must be 0 or 1"):
        ScheduleMeta(delay=2)
    with pytest.raises(ValueError, match="meta.dp_groups must be a list of rank lists"):
        ScheduleMeta(dp_groups=[0, 1])
    with pytest.raises(ValueError, match="meta.delay must be 0 or 1"):
        ScheduleMeta(delay=True)
    with pytest.raises(ValueError, match="meta.lowered must be a list"):
        ScheduleMeta(lowered="p2p")  # a string would otherwise become the passes 'p', '2', 'p'
    with pytest.raises(ValueError, match="meta.lowered must list pass names"):
        ScheduleMeta(lowered=["p2p", 3])
    with pytest.raises(ValueError, match="meta.inflight must be a list"):
        ScheduleMeta(inflight=2)
