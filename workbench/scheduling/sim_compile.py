"""A lowered schedule as flat integer programs, compiled once per schedule for the simulator's kernel.

Problem. The simulator times the same schedule again and again (a
partition editor or a planner changes only the stage costs), and stepping
through :class:`~workbench.core.ir.Action` objects re-derives, at every
action, what depends only on the schedule: which channel a send uses,
which all-reduces a step waits for, which cost an action takes.

Approach. :func:`compiled` lowers the schedule and turns every rank's
actions into ``(code, x, y)`` triples of small integers once, remembered
while the schedule lives: ``code`` is the kind of action (:data:`COMPUTE`,
:data:`STEP`, :data:`SEND`, :data:`RECV`, :data:`ALL_REDUCE`, or
:data:`OTHER` for actions that take no time), and ``x`` / ``y`` index the
tables the kernel fills per call:

* a compute action's ``x`` is its cost class ``(op, stage, bucketed)``,
  all the simulator's cost model reads of an action;
* a step's ``x`` is its cost class and ``y`` the all-reduces it waits for
  (every all-reduce of its stage and iteration on its rank);
* a send's ``x`` is its descriptor ``(sender, receiver, direction,
  stage)`` (the link, bytes and resources it takes) and ``y`` the queue
  ``(sender, receiver, direction)`` its receive reads; a receive's ``x``
  is that queue;
* an all-reduce's ``x`` is its key ``(stage, iteration, bucket)``.

The memory walk (:class:`~workbench.scheduling.memory.MemoryWalk`) is
gathered here too, so one compiled value is everything the simulator reads
off a schedule.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from ..core.ir import Action, Op, Schedule
from .memory import MemoryWalk
from .passes import lower

__all__ = ["Compiled", "compiled", "COMPUTE", "STEP", "SEND", "RECV", "ALL_REDUCE", "OTHER", "BUSY_OPS"]

COMPUTE, STEP, SEND, RECV, ALL_REDUCE, OTHER = range(6)
BUSY_OPS = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)  # what counts as a rank's busy time
_SEND = {Op.SEND_F: True, Op.SEND_B: False}
_RECV = {Op.RECV_F: True, Op.RECV_B: False}


class _Index(dict):
    """Numbers keys in the order they are first seen."""

    def of(self, key: Any) -> int:
        found = self.get(key)
        if found is None:
            found = self[key] = len(self)
        return found


@dataclass(frozen=True, eq=False)
class Compiled:
    """One lowered schedule as integer programs and the tables they index (see the module docstring)."""

    lowered: Schedule
    programs: tuple[tuple[tuple[int, int, int], ...], ...]
    classes: tuple[Action, ...]  # one representative action per cost class
    sends: tuple[tuple[int, int, bool, int], ...]  # (sender, receiver, forward, stage) per send descriptor
    send_queue: tuple[int, ...]  # per send descriptor, the queue its messages join
    queue_receiver: tuple[int, ...]
    ar_keys: tuple[tuple[int, int | None, int | None], ...]  # (stage, iteration, bucket)
    needs: tuple[tuple[int, ...], ...]  # per step, the all-reduce keys it waits for
    max_stage: int  # the highest stage any action names (-1: none)
    iterations: frozenset  # the iteration numbers the actions carry (None where an action has none)
    memory: MemoryWalk

    @property
    def num_ranks(self) -> int:
        return len(self.programs)


def _step_needs(actions: list[Action], ar_index: _Index) -> dict[tuple, tuple[int, ...]]:
    """(stage, iteration) -> the all-reduces of the rank's program a step of that stage and iteration waits for."""
    needs: dict[tuple, list[int]] = {}
    for a in actions:
        if a.op is Op.ALL_REDUCE:
            needs.setdefault((a.stage, a.iteration), []).append(ar_index.of((a.stage, a.iteration, a.bucket)))
    return {key: tuple(ids) for key, ids in needs.items()}


def _compile(lowered: Schedule) -> Compiled:
    classes, sends, queues, ar_index, need_index = _Index(), _Index(), _Index(), _Index(), _Index()
    programs, max_stage, iterations = [], -1, set()
    for r in range(lowered.num_ranks):
        actions = lowered.actions(r)
        step_needs = _step_needs(actions, ar_index)
        program = []
        for a in actions:
            op = a.op
            if a.stage > max_stage:
                max_stage = a.stage
            iterations.add(a.iteration)
            if op in _SEND:
                queue = queues.of((r, a.peer, _SEND[op]))
                program.append((SEND, sends.of((r, a.peer, _SEND[op], a.stage)), queue))
            elif op in _RECV:
                program.append((RECV, queues.of((a.peer, r, _RECV[op])), 0))
            elif op is Op.ALL_REDUCE:
                program.append((ALL_REDUCE, ar_index.of((a.stage, a.iteration, a.bucket)), 0))
            elif op is Op.STEP or op in BUSY_OPS:
                cls = classes.get((op, a.stage, a.bucket is not None))
                if cls is None:
                    cls = classes[(op, a.stage, a.bucket is not None)] = (len(classes), a)
                if op is Op.STEP:
                    program.append((STEP, cls[0], need_index.of(step_needs.get((a.stage, a.iteration), ()))))
                else:
                    program.append((COMPUTE, cls[0], 0))
            else:
                program.append((OTHER, 0, 0))
        programs.append(tuple(program))
    return Compiled(
        lowered, tuple(programs), tuple(a for _, a in classes.values()), tuple(sends),
        tuple(queues[(src, dst, forward)] for src, dst, forward, _ in sends), tuple(dst for _, dst, _ in queues),
        tuple(ar_index), tuple(need_index), max_stage, frozenset(iterations), MemoryWalk(lowered))


_COMPILED: dict[int, tuple[weakref.ref, Compiled]] = {}


def compiled(schedule: Schedule) -> Compiled:
    """``schedule`` lowered (:func:`~workbench.scheduling.passes.lower`) and compiled, remembered while it lives
    (sweeps simulate one schedule many times)."""
    key = id(schedule)
    hit = _COMPILED.get(key)
    if hit is not None and hit[0]() is schedule:
        return hit[1]
    result = _compile(lower(schedule))
    _COMPILED[key] = (weakref.ref(schedule), result)
    weakref.finalize(schedule, _COMPILED.pop, key, None)
    return result
