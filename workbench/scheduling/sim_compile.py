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
off a schedule. Where lowering would only add sends and receives (every
schedule but the weight-stashing ones), the compiler puts their entries
where :func:`~workbench.scheduling.passes.add_p2p` puts the actions, from
the same :func:`~workbench.scheduling.passes.p2p_neighbours`, and the
lowered schedule itself is made only when it is read.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from ..core.ir import Action, Op, Schedule
from .memory import MemoryWalk
from .passes import lower, p2p_neighbours

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

    source: Schedule  # the schedule compiled (lowered: :attr:`lowered`)
    programs: tuple[tuple[tuple[int, int, int], ...], ...]
    classes: tuple[Action, ...]  # one representative action per cost class
    sends: tuple[tuple[int, int, bool, int], ...]  # (sender, receiver, forward, stage) per send descriptor
    send_queue: tuple[int, ...]  # per send descriptor, the queue its messages join
    queue_receiver: tuple[int, ...]
    ar_keys: tuple[tuple[int, int | None, int | None], ...]  # (stage, iteration, bucket)
    needs: tuple[tuple[tuple[int, ...], int], ...]  # per step, the all-reduce keys it waits for, its iteration
    max_stage: int  # the highest stage any action names (-1: none)
    iterations: frozenset  # the iteration numbers the actions carry (None where an action has none)
    memory: MemoryWalk
    _made: dict = field(default_factory=dict, repr=False)  # what is made from the rest on first use

    @property
    def num_ranks(self) -> int:
        return len(self.programs)

    @property
    def lowered(self) -> Schedule:
        """The schedule lowered, which the programs step through, made on first use (the programs do not need it)."""
        made = self._made.get("lowered")
        if made is None:
            made = self._made["lowered"] = lower(self.source)
        return made

    @property
    def actions(self) -> list[list[Action]]:
        """Per rank, the lowered actions the programs index."""
        made = self._made.get("actions")
        if made is None:
            made = self._made["actions"] = [self.lowered.actions(r) for r in range(self.num_ranks)]
        return made

    def event_fields(self) -> list[list[tuple]]:
        """Per rank and action, what its event carries besides its times: (stage, op, micro-batch, iteration,
        version, chunk, peer, send descriptor or -1), made on first use and kept."""
        made = self._made.get("event_fields")
        if made is None:
            made = self._made["event_fields"] = [
                [(a.stage, a.op.value, a.microbatch, a.iteration or 0, a.version, a.chunk,
                  a.peer if code in (SEND, RECV) else None, x if code == SEND else -1)
                 for a, (code, x, _) in zip(actions, program)]
                for actions, program in zip(self.actions, self.programs)]
        return made


def _step_needs(actions: list[Action], ar_index: _Index) -> dict[tuple, tuple[int, ...]]:
    """(stage, iteration) -> the all-reduces of the rank's program a step of that stage and iteration waits for."""
    needs: dict[tuple, list[int]] = {}
    for a in [a for a in actions if a.op is Op.ALL_REDUCE]:
        needs.setdefault((a.stage, a.iteration), []).append(ar_index.of((a.stage, a.iteration, a.bucket)))
    return {key: tuple(ids) for key, ids in needs.items()}


class _Tables:
    """The tables a compiled schedule's programs index, numbered as the compiler meets their keys."""

    def __init__(self) -> None:
        self.classes, self.sends, self.queues = _Index(), _Index(), _Index()
        self.ar_keys, self.needs = _Index(), _Index()

    def entry(self, r: int, a: Action, step_needs: dict[tuple, tuple[int, ...]]) -> tuple[int, int, int]:
        """The ``(code, x, y)`` of action ``a`` on rank ``r`` (see the module docstring)."""
        op = a.op
        if op in _SEND:
            return SEND, self.sends.of((r, a.peer, _SEND[op], a.stage)), self.queues.of((r, a.peer, _SEND[op]))
        if op in _RECV:
            return RECV, self.queues.of((a.peer, r, _RECV[op])), 0
        if op is Op.ALL_REDUCE:
            return ALL_REDUCE, self.ar_keys.of((a.stage, a.iteration, a.bucket)), 0
        if op is not Op.STEP and op not in BUSY_OPS:
            return OTHER, 0, 0
        cls = self.classes.get((op, a.stage, a.bucket is not None))
        if cls is None:
            cls = self.classes[(op, a.stage, a.bucket is not None)] = (len(self.classes), a)
        if op is Op.STEP:
            return STEP, cls[0], self.needs.of((step_needs.get((a.stage, a.iteration), ()), a.iteration or 0))
        return COMPUTE, cls[0], 0

    def exchange(self, r: int, a: Action, around: tuple) -> tuple[tuple[int, int, int], ...]:
        """The entries of a forward or backward and of the receive before and the send after it that
        :func:`~workbench.scheduling.passes.add_p2p` puts around it (``around``: its ``_neighbours``)."""
        recv, src, send, dst = around
        forward, entries = a.op is Op.FORWARD, []
        if recv is not None:
            entries.append((RECV, self.queues.of((src, r, forward)), 0))
        entries.append(self.entry(r, a, {}))
        if send is not None:
            entries.append((SEND, self.sends.of((r, dst, forward, a.stage)), self.queues.of((r, dst, forward))))
        return tuple(entries)


def _inserts_only_p2p(schedule: Schedule) -> bool:
    """Whether lowering ``schedule`` only puts sends and receives around its forwards and backwards."""
    meta, done = schedule.meta, schedule.meta.lowered
    return bool(meta.stage_to_rank) and "p2p" not in done and not (meta.weight_stashing and "stash" not in done)


def _compile(schedule: Schedule) -> Compiled:
    """Compile ``schedule`` lowered. When lowering would only add sends and receives, the compiler puts their
    entries around each forward and backward itself, where :func:`~.passes.add_p2p` puts the actions
    (:func:`~.passes.p2p_neighbours`), so no lowered action is made until someone reads :attr:`Compiled.lowered`."""
    direct = _inserts_only_p2p(schedule)
    lowered = schedule if direct else lower(schedule)
    around = p2p_neighbours(schedule) if direct else lambda r, a: None
    tables = _Tables()
    programs, max_stage, iterations, inserted_first = [], -1, set(), []
    for r in range(lowered.num_ranks):
        actions = lowered.actions(r)
        step_needs = _step_needs(actions, tables.ar_keys)
        # an action's entries depend on these fields only, and a rank repeats few of them (not the micro-batch)
        seen: dict[tuple, tuple[tuple[int, int, int], ...]] = {}
        program = []
        for a in actions:
            key = (a.op, a.stage, a.peer, a.bucket, a.iteration)
            entries = seen.get(key)
            if entries is None:
                exchange = around(r, a)
                entries = seen[key] = (tables.entry(r, a, step_needs),) if exchange is None else \
                    tables.exchange(r, a, exchange)
                max_stage = max(max_stage, a.stage)
                iterations.add(a.iteration)
            program += entries
        programs.append(tuple(program))
        if direct:  # lowering puts a receive before the rank's first action
            first = around(r, actions[0]) if actions else None
            inserted_first.append(first is not None and first[0] is not None)
    if not direct:
        inserted_first = [bool(low) and (not src or low[0] is not src[0])
                          for low, src in ((lowered.actions(r), schedule.actions(r)) for r in range(lowered.num_ranks))]
    sends, queues = tables.sends, tables.queues
    return Compiled(
        schedule, tuple(programs), tuple(a for _, a in tables.classes.values()), tuple(sends),
        tuple(queues[(src, dst, forward)] for src, dst, forward, _ in sends), tuple(dst for _, dst, _ in queues),
        tuple(tables.ar_keys), tuple(tables.needs), max_stage, frozenset(iterations),
        MemoryWalk(schedule, inserted_first), {} if direct else {"lowered": lowered})


_COMPILED: dict[int, tuple[weakref.ref, Compiled]] = {}


def compiled(schedule: Schedule) -> Compiled:
    """``schedule`` compiled as lowered (:func:`~workbench.scheduling.passes.lower`), remembered while it lives
    (sweeps simulate one schedule many times)."""
    key = id(schedule)
    hit = _COMPILED.get(key)
    if hit is not None and hit[0]() is schedule:
        return hit[1]
    result = _compile(schedule)
    _COMPILED[key] = (weakref.ref(schedule), result)
    weakref.finalize(schedule, _COMPILED.pop, key, None)
    return result
