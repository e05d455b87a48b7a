"""In-process checks of the interpreter's refusals, the stage and the event/schedule comparison."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.core.ir import Schedule
from workbench.core.timeline import Event, Timeline
from workbench.runtime.events import check_events_follow_schedule
from workbench.runtime.interpreter import Interpreter
from workbench.runtime.stage import Stage


def _stage(index, is_first=True, is_last=True, recompute=False):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    return Stage(index=index, module=module, device=torch.device("cpu"), is_first=is_first, is_last=is_last,
                 loss_fn=nn.functional.cross_entropy, loss_scale=0.5, recompute=recompute)


def test_interpreter_refuses_ops_and_stages_it_cannot_run():
    schedule = Schedule.from_text(["0F0 0STASH0 0B0"])
    with pytest.raises(ValueError, match="STASH"):
        Interpreter(rank=0, actions=schedule.actions(0), stages={0: _stage(0)}, num_microbatches=1,
                    boundary_shapes={}, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="stage 1"):
        Interpreter(rank=0, actions=Schedule.from_text(["1F0 1B0"]).actions(0), stages={0: _stage(0)},
                    num_microbatches=1, boundary_shapes={}, device=torch.device("cpu"))


def test_recompute_gives_the_same_gradients_with_dropout():
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    grads = []
    for recompute in (False, True):
        stage = _stage(0, recompute=recompute)
        torch.manual_seed(1)
        stage.forward(0, x, y)
        stage.backward(0)
        grads.append([p.grad.clone() for p in stage.parameters()])
        assert stage.in_flight == 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_backward_before_forward_is_an_error():
    with pytest.raises(RuntimeError, match="before its forward"):
        _stage(0).backward(3)


def test_event_order_check_catches_a_swap():
    schedule = Schedule.from_text(["0F0 0F1 0B0 0B1"])
    ops = [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    good = Timeline(tuple(Event(0, 0, op, i, i + 0.5, microbatch=m, source="measured")
                          for i, (op, m) in enumerate(ops)))
    check_events_follow_schedule(good, schedule, iteration=0)
    swapped = [ops[0], ops[2], ops[1], ops[3]]
    bad = Timeline(tuple(Event(0, 0, op, i, i + 0.5, microbatch=m, source="measured")
                         for i, (op, m) in enumerate(swapped)))
    with pytest.raises(ValueError, match="position 1"):
        check_events_follow_schedule(bad, schedule, iteration=0)
