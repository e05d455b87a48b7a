"""The asynchronous pipeline's stream: the run's lowered schedule, and the interpreter that runs it in segments.

Micro-batches are numbered across the stream (``iteration * m +
microbatch``), a stream that starts later is shifted to its iteration and
weight version, and the interpreter keeps its state (held activations,
received tensors, outstanding sends) between the segments of successive
training steps. See :mod:`.async_pipeline`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from ...core.ir import Action, Op, Schedule
from ...core.timeline import Event
from ..interpreter import Interpreter, MicrobatchData
from .async_weights import StageWeights

__all__ = ["async_schedule", "StreamInterpreter"]


def async_schedule(config, inflight: tuple[int, ...] | int | None = None, *, iterations: int | None = None,
                   mode: str | None = None) -> Schedule:
    """The lowered stream of the whole run (``config.training.steps`` iterations, or ``iterations``) that every rank
    executes, with ``inflight`` (the depths the runtime resolved) and ``mode`` in place of the plan's own."""
    from ...scheduling.passes import add_p2p
    from ...scheduling.registry import schedule_for

    plan = config.plan
    if inflight is not None:
        plan = plan.replace(pipeline=replace(plan.pipeline, inflight=inflight))
    if mode is not None:
        plan = plan.replace(pipeline=replace(plan.pipeline, mode=mode))
    return add_p2p(schedule_for(plan, num_iterations=config.training.steps if iterations is None else iterations))


def _shifted(actions: tuple[Action, ...], start: int) -> list[Action]:
    """A stream that starts at iteration ``start`` on weight version ``start``: its iterations and versions
    moved on by ``start`` (a stream begins drained, with ``start`` steps applied)."""
    if not start:
        return list(actions)
    return [replace(a, iteration=(a.iteration or 0) + start,
                    version=None if a.version is None else a.version + start) for a in actions]


def _stream_index(actions: tuple[Action, ...], num_microbatches: int) -> list[Action]:
    """Actions with ``microbatch`` numbered across the stream: ``iteration * m + microbatch``."""
    return [a if a.microbatch is None else replace(a, microbatch=a.iteration * num_microbatches + a.microbatch)
            for a in actions]


@dataclass
class StreamInterpreter(Interpreter):
    """The schedule interpreter over a stream whose micro-batches outlive one step.

    State (held activations, received tensors, outstanding sends) persists
    between segments; forwards and backwards run on the stage's weight
    versions and record the version they used.
    """

    weights: dict[int, StageWeights] = field(default_factory=dict)
    microbatches_per_iteration: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self._activations, self._grads, self._received, self._sends = {}, {}, {}, []
        self._used_version: int | None = None
        self._planned = {a.microbatch: a.version for a in self.actions if a.op is Op.FORWARD}
        self.compute_ms: dict[Op, list[float]] = {op: [] for op in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT,
                                                                    Op.BACKWARD_WEIGHT, Op.STEP)}
        self.time_compute = False  # time every forward, backward and step (for an adapting run)

    def extend(self, actions: list[Action]) -> None:
        """Append more of the stream (the next stretch of an adapting run)."""
        self.check(actions)
        self.actions = list(self.actions) + actions
        self._planned.update({a.microbatch: a.version for a in actions if a.op is Op.FORWARD})

    def run_segment(self, actions: list[Action], data: MicrobatchData) -> None:
        self._data = data
        for action in actions:
            self._compute_start = time.perf_counter()
            self._used_version = self._planned.get(action.microbatch, self.weights[action.stage].current)
            nbytes = self._dispatch[action.op](action)
            timed = self.time_compute and action.op in self.compute_ms
            if timed or self.record:
                if (timed or action.is_compute) and self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                end = time.perf_counter()
                if timed:
                    self.compute_ms[action.op].append((end - self._compute_start) * 1e3)
                if self.record:
                    self._record(action, self._compute_start, end, nbytes)
        self._sends = [(work, t) for work, t in self._sends if not work.is_completed()]

    def finish(self) -> None:
        for work, _ in self._sends:
            work.wait()
        self._sends = []

    def _forward(self, a: Action) -> None:
        with self.weights[a.stage].bind(a.microbatch, a.version) as used:
            super()._forward(a)
        self._used_version = used

    def _begin_backward(self, a: Action) -> StageWeights:
        """Before a backward (or its I or W): record the version its graph reads, and let it accumulate into the
        live gradients."""
        weights = self.weights[a.stage]
        self._used_version = weights.read_version(a.microbatch)
        weights.before_backward(a.microbatch)
        return weights

    def _backward(self, a: Action) -> None:
        weights = self._begin_backward(a)
        with weights.rebound(a.microbatch):  # a recomputing stage's replay runs on the forward's version
            super()._backward(a)
        weights.finish_backward(a.microbatch, a.version)

    def _backward_input(self, a: Action) -> None:
        """I of a split backward, on the version the forward bound: its vectors' gradients go straight into the
        live gradients (as a fused backward's do), its matrices wait for W."""
        with self._begin_backward(a).rebound(a.microbatch):
            super()._backward_input(a)

    def _differentiated(self, a: Action) -> list[torch.Tensor]:
        return self.weights[a.stage].leaves(a.microbatch)

    def _backward_weight(self, a: Action) -> None:
        """W: the weight gradients from the graph I kept, on the same version; then the version is released."""
        weights = self._begin_backward(a)
        super()._backward_weight(a)
        weights.finish_backward(a.microbatch, a.version)

    def _record(self, action: Action, start: float, end: float, nbytes: int | None) -> None:
        m = self.microbatches_per_iteration
        version = self.weights[action.stage].current if action.op is Op.STEP else self._used_version
        self.events.append(Event(
            rank=self.rank, stage=action.stage, op=action.op.value,
            start=(start - self.t0_perf) * 1e3, end=(end - self.t0_perf) * 1e3,
            microbatch=None if action.microbatch is None else action.microbatch % m,
            iteration=action.iteration or 0, version=version, source="measured", peer=action.peer, nbytes=nbytes))
