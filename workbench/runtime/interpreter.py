"""Execute one rank's lowered action list, recording every action as an Event.

The schedule generators and the lowering pass produce, per rank, the exact
sequence of forwards, backwards, sends, receives, all-reduces and optimizer
steps; the simulator times that same value. This interpreter walks the list
once per iteration and hands each action to a handler from a dispatch table
keyed by :class:`~workbench.core.ir.Op`, so a schedule is never re-written
as a loop here.

Communication overlaps compute: sends are ``dist.isend``, waited only at the
end of the iteration, so a stage goes on computing while its activations and
gradients travel; the data a ``RECV`` waits for has usually been pushed
already. A ``RECV`` posts its ``dist.irecv`` where the list places it and
waits for it there, one receive outstanding at a time: with gloo, posting a
second receive from a peer while an earlier one is pending can lose the
match (and ``batch_isend_irecv`` hangs). Every p2p message carries a tag
built from (kind, sending stage, micro-batch), so messages between the same
two ranks never mix.

``AR`` and ``STEP`` are delegated to the strategy (gradient synchronisation
and the optimizer differ between GPipe, GroPipe with delay and others).

Each executed action becomes a measured :class:`~workbench.core.timeline.Event`
(the fields the simulator emits), with times in ms since ``t0``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..core.ir import Action, Op
from ..core.timeline import Event
from .stage import Stage

__all__ = ["Interpreter", "MicrobatchData", "message_tag"]

_KIND_F, _KIND_B = 0, 1


def message_tag(kind: int, sender_stage: int, microbatch: int, num_microbatches: int) -> int:
    """Tag shared by a send and its receive: unique per (kind, sending stage, micro-batch)."""
    return (sender_stage * num_microbatches + microbatch) * 2 + kind


@dataclass
class MicrobatchData:
    """The inputs (for the first stage) and targets (for the last) of one iteration's micro-batches."""

    inputs: Sequence[torch.Tensor]
    targets: Sequence[torch.Tensor]


StrategyHandler = Callable[[Action], None]
Shape = tuple[tuple[int, ...], torch.dtype]


@dataclass
class Interpreter:
    """Runs ``actions`` for this rank over its ``stages`` (virtual stage -> Stage).

    ``boundary_shapes[s]`` is the shape and dtype of stage ``s``'s output for
    one micro-batch (the receive buffers are allocated from it).
    ``handlers`` supplies ``Op.ALL_REDUCE`` and ``Op.STEP``.
    """

    rank: int
    actions: Sequence[Action]
    stages: dict[int, Stage]
    num_microbatches: int
    boundary_shapes: dict[int, Shape]
    device: torch.device
    handlers: dict[Op, StrategyHandler] = field(default_factory=dict)
    record: bool = True
    t0_perf: float = field(default_factory=time.perf_counter)
    t0_unix: float = field(default_factory=time.time)
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._dispatch: dict[Op, Callable[[Action], int | None]] = {
            Op.FORWARD: self._forward,
            Op.BACKWARD: self._backward,
            Op.BACKWARD_INPUT: self._backward_input,
            Op.BACKWARD_WEIGHT: self._backward_weight,
            Op.SEND_F: self._send,
            Op.SEND_B: self._send,
            Op.RECV_F: self._recv,
            Op.RECV_B: self._recv,
            Op.ALL_REDUCE: self._strategy_op,
            Op.STEP: self._strategy_op,
        }
        self.check(self.actions)

    def check(self, actions: Sequence[Action]) -> None:
        """Refuse actions this runtime cannot execute or stages this rank does not hold."""
        for a in actions:
            if a.op not in self._dispatch:
                raise ValueError(f"rank {self.rank}: action {a} uses op {a.op.value}, which this runtime does not "
                                 f"execute; supported: {', '.join(op.value for op in self._dispatch)}")
            if a.stage not in self.stages:
                raise ValueError(f"rank {self.rank}: action {a} is for stage {a.stage}, but this rank holds "
                                 f"stages {sorted(self.stages)}")

    # -- one iteration ----------------------------------------------------------------
    def run(self, iteration: int, data: MicrobatchData, *, skip: frozenset[Op] = frozenset(),
            actions: Sequence[Action] | None = None) -> None:
        """Execute the action list once; ops in ``skip`` (e.g. AR, STEP while accumulating) are left out.

        ``actions`` replaces the list for this and later iterations (schedules
        that number their iterations give each iteration its own list).
        """
        if actions is not None:
            self.check(actions)
            self.actions = actions
        self._iteration = iteration
        self._data = data
        self._activations: dict[tuple[int, int], torch.Tensor] = {}  # (stage, mb) -> output to send
        self._grads: dict[tuple[int, int], torch.Tensor] = {}  # (stage, mb) -> input grad to send
        self._received: dict[tuple[Op, int, int], torch.Tensor] = {}
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []
        for action in self.actions:
            if action.op in skip:
                continue
            start = self._compute_start = time.perf_counter()
            nbytes = self._dispatch[action.op](action)
            if self.record:
                if action.is_compute and self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self._record(action, self._compute_start, time.perf_counter(), nbytes)
        for work, _ in self._sends:
            work.wait()
        leftover = [s for s in self.stages.values() if s.in_flight]
        if leftover:
            raise RuntimeError(f"rank {self.rank}: stage {leftover[0].index} still holds {leftover[0].in_flight} "
                               f"activations after the iteration: the schedule has a forward without its backward")

    def compute_started(self) -> None:
        """Called by a handler once it has waited for communication: its event starts here.

        A ``STEP`` that first waits for its gradient all-reduce records only the
        optimizer's work, as the simulator times it; the wait shows as the gap
        before the event (exposed communication), not as compute.
        """
        self._compute_start = time.perf_counter()

    def _record(self, action: Action, start: float, end: float, nbytes: int | None) -> None:
        self.events.append(Event(
            rank=self.rank, stage=action.stage, op=action.op.value,
            start=(start - self.t0_perf) * 1e3, end=(end - self.t0_perf) * 1e3,
            microbatch=action.microbatch, iteration=self._iteration, version=action.version,
            source="measured", chunk=action.chunk, peer=action.peer, nbytes=nbytes,
        ))

    def take_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    # -- compute ----------------------------------------------------------------------
    def _forward(self, a: Action) -> None:
        stage = self.stages[a.stage]
        if stage.is_first:
            inputs = self._data.inputs[a.microbatch].to(self.device, non_blocking=True)
        else:
            inputs = self._take_received(Op.RECV_F, a)
        target = self._data.targets[a.microbatch].to(self.device, non_blocking=True) if stage.is_last else None
        out = stage.forward(a.microbatch, inputs, target)
        if out is not None:
            self._activations[(a.stage, a.microbatch)] = out
        return None

    def _backward(self, a: Action) -> None:
        stage = self.stages[a.stage]
        grad_output = None if stage.is_last else self._take_received(Op.RECV_B, a)
        grad_input = stage.backward(a.microbatch, grad_output)
        if grad_input is not None:
            self._grads[(a.stage, a.microbatch)] = grad_input
        return None

    def _backward_input(self, a: Action) -> None:
        stage = self.stages[a.stage]
        grad_output = None if stage.is_last else self._take_received(Op.RECV_B, a)
        grad_input = stage.backward_input(a.microbatch, grad_output, params=self._differentiated(a))
        if grad_input is not None:
            self._grads[(a.stage, a.microbatch)] = grad_input
        return None

    def _differentiated(self, a: Action) -> list[torch.Tensor] | None:
        """The tensors a split backward differentiates, where they are not the stage's own parameters (None)."""
        return None

    def _backward_weight(self, a: Action) -> None:
        self.stages[a.stage].backward_weight(a.microbatch)
        return None

    def _take_received(self, op: Op, a: Action) -> torch.Tensor:
        """The tensor a RECV delivered for this compute; a local hand-over when both stages live here."""
        key = (op, a.stage, a.microbatch)
        if key in self._received:
            return self._received.pop(key)
        neighbour = a.stage - 1 if op is Op.RECV_F else a.stage + 1
        local = self._activations if op is Op.RECV_F else self._grads
        if (neighbour, a.microbatch) in local and neighbour in self.stages:
            return local.pop((neighbour, a.microbatch))
        raise RuntimeError(f"rank {self.rank}: {a} needs a {op.value} for micro-batch {a.microbatch} of stage "
                           f"{a.stage}, but the schedule has no receive before it")

    # -- communication ----------------------------------------------------------------
    def _send(self, a: Action) -> int:
        if a.op is Op.SEND_F:
            tensor = self._activations.pop((a.stage, a.microbatch))
            tag = message_tag(_KIND_F, a.stage, a.microbatch, self.num_microbatches)
        else:
            tensor = self._grads.pop((a.stage, a.microbatch))
            tag = message_tag(_KIND_B, a.stage, a.microbatch, self.num_microbatches)
        tensor = tensor.contiguous()
        self._sends.append((dist.isend(tensor, dst=a.peer, tag=tag), tensor))
        return tensor.numel() * tensor.element_size()

    def _recv(self, a: Action) -> int:
        if a.op is Op.RECV_F:
            sender, kind, (shape, dtype) = a.stage - 1, _KIND_F, self.boundary_shapes[a.stage - 1]
        else:
            sender, kind, (shape, dtype) = a.stage + 1, _KIND_B, self.boundary_shapes[a.stage]
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        dist.irecv(buf, src=a.peer, tag=message_tag(kind, sender, a.microbatch, self.num_microbatches)).wait()
        self._received[(a.op, a.stage, a.microbatch)] = buf
        return buf.numel() * buf.element_size()

    def _strategy_op(self, a: Action) -> int | None:
        """A strategy-owned action (AR, STEP, ...); a handler may return the bytes it moved."""
        handler = self.handlers.get(a.op)
        if handler is None:
            raise ValueError(f"rank {self.rank}: the strategy has no handler for {a.op.value} (action {a})")
        return handler(a)
