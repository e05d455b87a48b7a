"""The validator rejects every kind of broken schedule and shows the grid."""

import pytest

from workbench.core.ir import Schedule
from workbench.scheduling import generators as g
from workbench.scheduling.passes import lower
from workbench.scheduling.validate import ScheduleError, validate

PIPE2 = {"stage_to_rank": [[0, 1]], "replicas": 1}


def _schedule(lines, **meta):
    return Schedule.from_text(lines, name="hand", num_stages=2, num_microbatches=1, meta={**PIPE2, **meta})


def test_good_hand_written_schedule_passes():
    validate(_schedule(["0F0 0SEND_F0>1 0RECV_B0<1 0B0", "1RECV_F0<0 1F0 1B0 1SEND_B0>0"]))


def test_send_without_receive_is_reported_with_the_grid():
    with pytest.raises(ScheduleError) as err:
        validate(_schedule(["0F0 0SEND_F0>1 0RECV_B0<1 0B0", "1F0 1B0 1SEND_B0>0"]))
    msg = str(err.value)
    assert "rank 0 sends 1 F-messages to rank 1, which receives 0" in msg
    assert "rank0" in msg and "0SEND_F0>1" in msg  # the grid


def test_deadlock_both_ranks_receive_first():
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(_schedule(["0RECV_B0<1 0F0 0SEND_F0>1 0B0", "1RECV_F0<0 1F0 1B0 1SEND_B0>0"]))


def test_backward_before_forward():
    with pytest.raises(ScheduleError, match="before \\(or without\\) its forward"):
        validate(Schedule.from_text(["0B0 0F0"], meta={"stage_to_rank": [[0]]}, num_microbatches=1))


def test_forward_without_backward():
    with pytest.raises(ScheduleError, match="never its backward"):
        validate(Schedule.from_text(["0F0 0F1 0B0"], meta={"stage_to_rank": [[0]]}, num_microbatches=2))


def test_missing_microbatch_on_a_stage():
    with pytest.raises(ScheduleError, match="never runs the forward of micro-batch 1"):
        validate(Schedule.from_text(["0F0 0B0"], meta={"stage_to_rank": [[0]]}, num_microbatches=2))


def test_messages_out_of_order_are_rejected():
    lines = ["0F0 0SEND_F0>1 0F1 0SEND_F1>1 0RECV_B0<1 0B0 0RECV_B1<1 0B1",
             "1RECV_F1<0 1RECV_F0<0 1F0 1SEND_B0>0 1F1 1SEND_B1>0 1B0 1B1"]
    with pytest.raises(ScheduleError, match="order differs"):
        validate(Schedule.from_text(lines, num_microbatches=2, meta=PIPE2))


def test_action_on_the_wrong_rank():
    with pytest.raises(ScheduleError, match="puts stage 1 elsewhere"):
        validate(_schedule(["1F0 1B0", "0F0 0B0"]))


def test_collectives_in_different_orders():
    s = Schedule.from_text(["0F0 0B0 0ARb0 0ARb1 0STEP", "0F0 0B0 0ARb1 0ARb0 0STEP"],
                           meta={"dp_groups": [[0, 1]]}, num_microbatches=1)
    with pytest.raises(ScheduleError, match="different orders"):
        validate(s)


def test_step_waiting_for_a_collective_a_peer_never_launches():
    s = Schedule.from_text(["0F0 0B0 0AR 0STEP", "0F0 0B0 0STEP"], meta={"dp_groups": [[0, 1]]}, num_microbatches=1)
    with pytest.raises(ScheduleError):
        validate(s)


def test_unlowered_pipeline_data_dependency_deadlock():
    # stage 1 runs its backward of micro-batch 0 before anything exists upstream: fine; but stage 0 waiting on a
    # backward that stage 1 only runs after stage 0's next forward is a cycle
    s = Schedule.from_text(["0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"], meta=PIPE2, num_microbatches=2)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(s)


def test_error_is_a_value_error():
    assert issubclass(ScheduleError, ValueError)
    validate(lower(g.one_f_one_b(4, 8)))
