"""Peak memory per rank, read off the schedule's program order.

A rank's memory is its stages' static state (weights, gradients, optimizer
state) plus what the schedule keeps alive: the saved activations of every
micro-batch whose forward ran and whose backward has not (``in flight``),
and, in asynchronous pipelines, the extra weight versions stashed for
in-flight micro-batches that use an older version than the newest (a
forward of a weight-stashing schedule uses ``Action.version``, which may be
older than the newest: PipeDream-2BW's shadow version, vertical sync). Both
depend only on
the order of actions on the rank (a rank runs one compute action at a
time), not on timing, so they are computed by walking each rank's list:
GPipe keeps ``m`` micro-batches in flight, 1F1B at most ``p - s`` on stage
``s``. A micro-batch whose backward is split (zero-bubble schedules) keeps
its activations until its weight gradient (``W``) has run: ``W`` reads the
saved inputs of every layer, so the input gradient (``I``) frees nothing.
A delayed (``delay=1``) gradient all-reduce keeps one more copy of
the gradients: the buffer still being reduced while the next iteration
accumulates into the live one.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

from ..core.ir import Op, Schedule
from .stagecosts import StageCosts

__all__ = ["in_flight_microbatches", "memory_breakdown", "peak_memory_bytes", "in_flight_by_stage",
           "versions_by_stage", "MemoryWalk"]

# the actions that free a micro-batch's saved activations: its full backward, or the W of a split one
_FREES = (Op.BACKWARD, Op.BACKWARD_WEIGHT)


def _walk(schedule: Schedule, rank: int, stage_costs: StageCosts | None):
    """Yield (activation bytes, stashed bytes, in-flight count) after every action on ``rank``."""
    live: dict[tuple, int] = {}
    steps: dict[int, int] = {}
    users: dict[tuple[int, int], int] = {}  # (stage, version) -> in-flight micro-batches using it
    act_bytes = stashed = 0
    stashing = schedule.meta.weight_stashing

    def stash_bytes() -> int:
        return sum(stage_costs.param_bytes[s] for (s, v), n in users.items() if n and v != steps.get(s, 0))

    for a in schedule.actions(rank):
        key = (a.stage, a.microbatch, a.iteration)
        if a.op is Op.FORWARD and a.bucket in (None, 0):
            version = a.version if stashing and a.version is not None else steps.get(a.stage, 0)
            live[key] = version
            users[(a.stage, version)] = users.get((a.stage, version), 0) + 1
            act_bytes += stage_costs.activation_bytes[a.stage] if stage_costs else 0
            if stage_costs and version != steps.get(a.stage, 0):
                stashed = stash_bytes()
        elif a.op in _FREES and key in live and a.bucket in (None, 0):
            version = live.pop(key)
            users[(a.stage, version)] -= 1
            act_bytes -= stage_costs.activation_bytes[a.stage] if stage_costs else 0
            if stashed and stage_costs:
                stashed = stash_bytes()
        elif a.op is Op.STEP:
            steps[a.stage] = steps.get(a.stage, 0) + 1
            if stage_costs:
                stashed = stash_bytes()
        yield act_bytes, stashed, len(live)


def in_flight_microbatches(schedule: Schedule) -> list[int]:
    """Per rank, the most micro-batches alive at once (forward done, backward not yet)."""
    return [max((n for _, _, n in _walk(schedule, r, None)), default=0) for r in range(schedule.num_ranks)]


def in_flight_by_stage(schedule: Schedule) -> dict[int, int]:
    """Per (virtual) stage, the most of its micro-batches alive at once."""
    out: dict[int, int] = {}
    for r in range(schedule.num_ranks):
        live: dict[int, int] = {}
        for a in schedule.actions(r):
            if a.op is Op.FORWARD and a.bucket in (None, 0):
                live[a.stage] = live.get(a.stage, 0) + 1
                out[a.stage] = max(out.get(a.stage, 0), live[a.stage])
            elif a.op in _FREES and a.bucket in (None, 0):
                live[a.stage] = live.get(a.stage, 0) - 1
    return out


def versions_by_stage(schedule: Schedule) -> dict[int, int]:
    """Per (virtual) stage, the most weight versions alive at once: the live one, plus the older ones that
    in-flight micro-batches of a weight-stashing schedule still use (1 without stashing)."""
    out: dict[int, int] = {}
    for r in range(schedule.num_ranks):
        steps: dict[int, int] = {}
        users: dict[tuple[int, int], int] = {}
        live: dict[tuple, int] = {}
        for a in schedule.actions(r):
            key = (a.stage, a.microbatch, a.iteration)
            if a.op is Op.FORWARD and a.bucket in (None, 0):
                version = a.version if schedule.meta.weight_stashing and a.version is not None else steps.get(a.stage, 0)
                live[key] = version
                users[(a.stage, version)] = users.get((a.stage, version), 0) + 1
            elif a.op in _FREES and key in live and a.bucket in (None, 0):
                users[(a.stage, live.pop(key))] -= 1
            elif a.op is Op.STEP:
                steps[a.stage] = steps.get(a.stage, 0) + 1
            if a.is_compute or a.op is Op.STEP:
                now = steps.get(a.stage, 0)
                held = {v for (s, v), n in users.items() if s == a.stage and n and v != now}
                out[a.stage] = max(out.get(a.stage, 1), 1 + len(held))
    return out


def memory_breakdown(schedule: Schedule, stage_costs: StageCosts) -> list[dict[str, int]]:
    """Per rank: weights, gradients, optimizer state, pending gradients, and the activations and stashed weights
    at the peak."""
    out = []
    for r in range(schedule.num_ranks):
        stages = sorted({a.stage for a in schedule.actions(r) if a.is_compute})
        for s in stages:
            if s >= stage_costs.num_stages:
                raise ValueError(f"rank {r} runs stage {s} but stage_costs has only {stage_costs.num_stages} stages")
        weights = sum(stage_costs.param_bytes[s] for s in stages)
        grads = sum(stage_costs.grad_bytes[s] for s in stages)
        opt = sum(stage_costs.optimizer_bytes[s] for s in stages)
        peak_act, peak_stash = max(((a, s) for a, s, _ in _walk(schedule, r, stage_costs)),
                                   key=lambda x: x[0] + x[1], default=(0, 0))
        pending = grads if schedule.meta.delay == 1 else 0
        out.append({"weights": weights, "gradients": grads, "optimizer": opt, "activations": peak_act,
                    "stashed_weights": peak_stash, "pending_gradients": pending,
                    "peak": weights + grads + opt + peak_act + peak_stash + pending})
    return out


def peak_memory_bytes(schedule: Schedule, stage_costs: StageCosts) -> list[int]:
    """Per rank, the peak bytes (see :func:`memory_breakdown`)."""
    return [row["peak"] for row in memory_breakdown(schedule, stage_costs)]


_ALWAYS, _IF_STASHED = 1, 2  # when the walk sums the stashed weights again: at this change / only if it holds some


class MemoryWalk:
    """:func:`memory_breakdown` for many stage costs: the walk's order-only facts gathered once.

    What a rank holds depends on the costs only through the bytes of each
    stage, so the walk over a schedule is recorded once as its changes: per
    rank, after each forward, freeing backward or step, the stage whose
    activations came (+1) or went (-1), and the stages whose stashed weights
    it then holds, in the order :func:`memory_breakdown` sums them.
    :meth:`breakdown` replays only those changes (the sends and receives of a
    lowered schedule change nothing), and a rank that never stashes only
    sums its activations, so the result is :func:`memory_breakdown`'s, value
    for value.
    """

    def __init__(self, schedule: Schedule, inserted_first: Sequence[bool] | None = None) -> None:
        """``inserted_first``: per rank, whether lowering puts an action before the rank's first (a receive), when
        ``schedule`` is walked for its lowered form. Lowering only inserts actions (sends, receives, stash and
        restore), none of which changes what a rank holds, so the walk of the lowered schedule is the walk of
        ``schedule`` with one more state, holding nothing, before the first action where that is so."""
        self.pending = schedule.meta.delay == 1
        self.ranks = [self._rank(schedule, r) for r in range(schedule.num_ranks)]
        for r, inserted in enumerate(inserted_first or ()):
            if inserted:
                stages, _, changes, stashes = self.ranks[r]
                self.ranks[r] = (stages, True, changes, stashes)

    @staticmethod
    def _rank(schedule: Schedule, rank: int) -> tuple:
        """(compute stages, whether a state precedes the first change, changes, whether it ever stashes)."""
        actions = schedule.actions(rank)
        live: dict[tuple, int] = {}
        steps: dict[int, int] = {}
        users: dict[tuple[int, int], int] = {}
        stashing = schedule.meta.weight_stashing
        changes, stashes, lead = [], False, False
        now: tuple[int, ...] = ()  # what held() gives: it can only grow at a step or an older version's forward

        def held() -> tuple[int, ...]:
            return tuple(s for (s, v), n in users.items() if n and v != steps.get(s, 0))

        for a in actions:
            key = (a.stage, a.microbatch, a.iteration)
            if a.op is Op.FORWARD and a.bucket in (None, 0):
                version = a.version if stashing and a.version is not None else steps.get(a.stage, 0)
                live[key] = version
                users[(a.stage, version)] = users.get((a.stage, version), 0) + 1
                older = version != steps.get(a.stage, 0)
                now = held() if older else now
                changes.append((a.stage, 1, _ALWAYS if older else 0, now if older else ()))
            elif a.op in _FREES and key in live and a.bucket in (None, 0):
                users[(a.stage, live.pop(key))] -= 1
                now = held() if now else now
                changes.append((a.stage, -1, _IF_STASHED, now))
            elif a.op is Op.STEP:
                steps[a.stage] = steps.get(a.stage, 0) + 1
                now = held()
                changes.append((a.stage, 0, _ALWAYS, now))
            else:
                lead = lead or not changes
                continue
            stashes = stashes or bool(changes[-1][3])
        stages = sorted({a.stage for a in actions if a.is_compute})
        return stages, lead, changes, stashes

    def breakdown(self, stage_costs: StageCosts) -> list[dict[str, int]]:
        """What :func:`memory_breakdown` gives for the schedule with ``stage_costs``."""
        out = []
        for r, (stages, lead, changes, stashes) in enumerate(self.ranks):
            for s in stages:
                if s >= stage_costs.num_stages:
                    raise ValueError(f"rank {r} runs stage {s} but stage_costs has only {stage_costs.num_stages} "
                                     f"stages")
            weights = sum(stage_costs.param_bytes[s] for s in stages)
            grads = sum(stage_costs.grad_bytes[s] for s in stages)
            opt = sum(stage_costs.optimizer_bytes[s] for s in stages)
            peak_act, peak_stash = (_replay(changes, lead, stage_costs) if stashes
                                    else (_peak_activations(changes, lead, stage_costs.activation_bytes), 0))
            pending = grads if self.pending else 0
            out.append({"weights": weights, "gradients": grads, "optimizer": opt, "activations": peak_act,
                        "stashed_weights": peak_stash, "pending_gradients": pending,
                        "peak": weights + grads + opt + peak_act + peak_stash + pending})
        return out


def _peak_activations(changes: list[tuple], lead: bool, act: tuple) -> int:
    """The first largest running sum of the activations (a rank that never stashes: its walk's peak); the walk
    holds nothing (int 0) before its first forward, and a step changes nothing."""
    deltas = [act[s] if sign > 0 else -act[s] for s, sign, _, _ in changes if sign]
    if not deltas:
        return 0
    sums = list(accumulate(deltas))
    return max([0, *sums]) if lead or changes[0][1] == 0 else max(sums)


def _replay(changes: list[tuple], lead: bool, costs: StageCosts) -> tuple:
    """The walk's (activations, stashed weights) at its first peak, replayed over its changes."""
    act_bytes, stashed, params = 0, 0, costs.param_bytes
    states = [(0, 0)] if lead else []
    for s, sign, when, held in changes:
        if sign > 0:
            act_bytes += costs.activation_bytes[s]
        elif sign < 0:
            act_bytes -= costs.activation_bytes[s]
        if when == _ALWAYS or (when == _IF_STASHED and stashed):
            stashed = sum(params[h] for h in held)
        states.append((act_bytes, stashed))
    return max(states, key=lambda x: x[0] + x[1], default=(0, 0))
