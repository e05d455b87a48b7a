"""Passes: turn a compute schedule into everything a rank has to execute.

Generators say *what* each rank computes and in which order; a real rank
also has to move activations and gradients between stages, all-reduce
gradients across replicas and, in asynchronous pipelines, keep the weight
version each in-flight micro-batch used. Each of those is a pure function
``Schedule -> Schedule`` here, so the runtime and the simulator execute the
same lowered value.

Communication semantics the passes assume (and the validator checks):
sends and all-reduces are *launched* in program order and do not block the
rank (``isend`` / ``async_op=True``); a receive blocks until its data is
there; a ``STEP`` blocks until the all-reduces of its stage and iteration
finished. ``meta.lowered`` records which passes ran, so :func:`lower` is
idempotent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from ..core.fields import check_int
from ..core.ir import Action, Op, Schedule

__all__ = ["add_p2p", "add_grad_sync", "add_weight_stash", "lower", "dp_groups", "LoweredIterations", "p2p_neighbours"]

_BACKWARDS = (Op.BACKWARD, Op.BACKWARD_INPUT)


def p2p_neighbours(schedule: Schedule) -> Callable[[int, Action], tuple | None]:
    """What :func:`add_p2p` puts around action ``a`` of rank ``r``: ``(receive op or None, its peer, send op or None,
    its peer)``, or None for an action it leaves alone (not a forward or backward). ValueError where
    ``meta.stage_to_rank`` is missing or names ranks the schedule does not have."""
    pipes = _stage_to_rank(schedule)
    owner = _pipeline_of_rank(pipes, schedule.num_ranks)

    def around(r: int, a: Action) -> tuple | None:
        if a.op is Op.FORWARD or a.op in _BACKWARDS:
            return _neighbours(a.op is Op.FORWARD, a.stage, pipes[owner[r]], r)
        return None

    return around


def _neighbours(forward: bool, stage: int, pipe: list[int], r: int) -> tuple:
    """(receive op or None, its peer, send op or None, its peer) around a forward or backward of ``stage`` on rank
    ``r`` of pipeline ``pipe``: a neighbouring stage on another rank exchanges its activations or gradients."""
    before = stage - 1 if forward else stage + 1
    after = stage + 1 if forward else stage - 1
    recv = (Op.RECV_F if forward else Op.RECV_B) if 0 <= before < len(pipe) and pipe[before] != r else None
    send = (Op.SEND_F if forward else Op.SEND_B) if 0 <= after < len(pipe) and pipe[after] != r else None
    return recv, pipe[before] if recv is not None else None, send, pipe[after] if send is not None else None


def _with_meta(schedule: Schedule, ranks: list[list[Action]], pass_name: str, **extra: Any) -> Schedule:
    meta = replace(schedule.meta, **extra, lowered=(*schedule.meta.lowered, pass_name))
    return replace(schedule, ranks=tuple(tuple(r) for r in ranks), meta=meta)


def _stage_to_rank(schedule: Schedule) -> list[list[int]]:
    pipes = schedule.meta.stage_to_rank
    if not pipes:
        raise ValueError(f"schedule {schedule.name!r} has no meta.stage_to_rank (stage -> rank per pipeline); "
                         "point-to-point passes need it")
    return [list(p) for p in pipes]


def _pipeline_of_rank(pipes: list[list[int]], num_ranks: int) -> list[int]:
    owner = [-1] * num_ranks
    for i, pipe in enumerate(pipes):
        for r in pipe:
            if not 0 <= r < num_ranks:
                raise ValueError(f"meta.stage_to_rank[{i}] names rank {r}, but the schedule has {num_ranks} ranks")
            owner[r] = i
    return owner


def dp_groups(schedule: Schedule) -> list[list[int]]:
    """Per stage, the ranks holding a replica of it (its gradient all-reduce group)."""
    if schedule.meta.dp_groups:
        return [list(g) for g in schedule.meta.dp_groups]
    pipes = _stage_to_rank(schedule)
    return [[pipe[s] for pipe in pipes] for s in range(len(pipes[0]))]


def add_p2p(schedule: Schedule) -> Schedule:
    """Insert the sends and receives between consecutive stages.

    ``RECV_F`` before a forward (not on the first stage), ``SEND_F`` after it
    (not on the last), ``RECV_B`` before a backward (not on the last stage),
    ``SEND_B`` after it (not on the first). Peers are absolute ranks taken
    from ``meta.stage_to_rank``; stages that share a rank hand over locally.
    """
    around = p2p_neighbours(schedule)
    ranks: list[list[Action]] = []
    for r in range(schedule.num_ranks):
        out: list[Action] = []
        peers: dict[tuple[Op, int], tuple] = {}  # (op, stage) -> the receive before it and the send after it
        for a in schedule.actions(r):
            if a.op is Op.FORWARD or a.op in _BACKWARDS:
                found = peers.get((a.op, a.stage))
                if found is None:
                    found = peers[(a.op, a.stage)] = around(r, a)
                recv, src, send, dst = found
                if recv is not None:
                    out.append(Action.unchecked(a.stage, recv, a.microbatch, a.chunk, a.iteration, None, None, src))
                out.append(a)
                if send is not None:
                    out.append(Action.unchecked(a.stage, send, a.microbatch, a.chunk, a.iteration, None, None, dst))
            else:
                out.append(a)
        ranks.append(out)
    return _with_meta(schedule, ranks, "p2p")


def add_grad_sync(schedule: Schedule, *, delay: int = 0, num_buckets: int = 1, drain: bool = False) -> Schedule:
    """Add each stage's gradient all-reduce and optimizer step, per iteration.

    ``sAR`` (or ``num_buckets`` bucketed ``sARb{k}``) goes right after the
    stage's last backward of the iteration on this rank; the ``STEP``s go at
    the end of the rank's iteration. ``delay=0``: the step of iteration ``t``
    applies iteration ``t``'s gradients. ``delay=1``: it applies iteration
    ``t - 1``'s, so the all-reduce overlaps a whole iteration of compute;
    the last one stays pending unless ``drain``.
    """
    if delay not in (0, 1):
        raise ValueError(f"delay must be 0 (synchronous) or 1 (one-iteration delayed update), got {delay!r}")
    check_int("num_buckets", num_buckets, 1)
    buckets = [None] if num_buckets == 1 else list(range(num_buckets))
    groups = dp_groups(schedule)
    iterations_seen: set[int | None] = set()
    ranks: list[list[Action]] = []
    for r in range(schedule.num_ranks):
        actions = schedule.actions(r)
        last_backward: dict[tuple[int, int | None], int] = {}
        for i, a in enumerate(actions):
            if a.op in _BACKWARDS or a.op is Op.BACKWARD_WEIGHT:
                last_backward[(a.stage, a.iteration)] = i
        last_of_iteration: dict[int | None, int] = {a.iteration: i for i, a in enumerate(actions)}
        stages = sorted({a.stage for a in actions if a.is_compute})
        iterations_seen.update(last_of_iteration)
        after_backward: dict[int, list[tuple[int, int | None]]] = {}  # index -> the (stage, iteration)s it ends
        for key, idx in last_backward.items():
            after_backward.setdefault(idx, []).append(key)
        out: list[Action] = []
        for i, a in enumerate(actions):
            out.append(a)
            for stage, it in after_backward.get(i, ()):
                out += [Action(stage, Op.ALL_REDUCE, iteration=it, bucket=b) for b in buckets]
            if last_of_iteration.get(a.iteration) == i:
                it = a.iteration
                if delay == 0:
                    out += [Action(s, Op.STEP, iteration=it) for s in stages]
                elif it is not None and it >= 1:
                    out += [Action(s, Op.STEP, iteration=it - 1) for s in stages]
        if delay == 1 and drain:
            last = max((it for it in last_of_iteration if it is not None), default=None)
            out += [Action(s, Op.STEP, iteration=last) for s in stages]
        ranks.append(out)
    extra: dict[str, Any] = {"delay": delay, "dp_groups": tuple(tuple(g) for g in groups), "num_buckets": num_buckets,
                             "grad_sync": True}
    numbered = [it for it in iterations_seen if it is not None]
    if delay == 1 and not drain and numbered:
        extra["pending_step_iteration"] = max(numbered)
    return _with_meta(schedule, ranks, "grad_sync", **extra)


def add_weight_stash(schedule: Schedule) -> Schedule:
    """Stash the weights a forward used when a step lands before its backward.

    Walking each rank in order, a micro-batch whose backward would otherwise
    see newer weights than its forward gets ``STASH`` just before the forward
    and ``RESTORE`` just before the backward (PipeDream's weight stashing);
    the restored version is put back to the newest after that backward.
    """
    ranks: list[list[Action]] = []
    for r in range(schedule.num_ranks):
        actions = schedule.actions(r)
        steps: dict[int, int] = {}
        forward_version: dict[tuple, int] = {}
        stale: set[tuple] = set()
        for a in actions:
            key = (a.stage, a.microbatch, a.iteration)
            if a.op is Op.STEP:
                steps[a.stage] = steps.get(a.stage, 0) + 1
            elif a.op is Op.FORWARD:
                forward_version[key] = steps.get(a.stage, 0)
            elif a.op in _BACKWARDS and key in forward_version and forward_version[key] != steps.get(a.stage, 0):
                stale.add(key)
        out: list[Action] = []
        for a in actions:
            key = (a.stage, a.microbatch, a.iteration)
            if key in stale and (a.op is Op.FORWARD or a.op in _BACKWARDS):
                op = Op.STASH if a.op is Op.FORWARD else Op.RESTORE
                out.append(Action(a.stage, op, a.microbatch, chunk=a.chunk, iteration=a.iteration, version=a.version))
            out.append(a)
        ranks.append(out)
    return _with_meta(schedule, ranks, "stash")


def lower(schedule: Schedule) -> Schedule:
    """Everything the runtime interpreter needs: p2p always, stashing where ``meta`` asks for it."""
    done = set(schedule.meta.lowered)
    if "p2p" not in done and schedule.meta.stage_to_rank:
        schedule = add_p2p(schedule)
    if "stash" not in done and schedule.meta.weight_stashing:
        schedule = add_weight_stash(schedule)
    return schedule


class LoweredIterations:
    """The lowered actions of every iteration of a schedule built per iteration, lowered only once.

    GroPipe numbers its iterations: iteration ``t``'s actions carry
    ``iteration=t`` and weight versions counted from the steps applied so
    far, and with a delayed update iteration 0 has no step yet. Past the first
    ``warmup + 1`` iterations every iteration is the previous one with its
    iteration and version numbers one higher. So ``build(i)`` is called and
    lowered for ``i = 0 .. warmup`` when this is made, and :meth:`actions`
    renumbers the last of them, instead of generating and lowering the whole
    schedule again every training step.
    """

    def __init__(self, build: Callable[[int], Schedule], warmup: int = 0) -> None:
        check_int("warmup", warmup, 0)
        self.templates = [lower(build(i)) for i in range(warmup + 1)]

    def actions(self, rank: int, iteration: int) -> list[Action]:
        """``rank``'s lowered actions of ``iteration``."""
        check_int("iteration", iteration, 0)
        base = min(iteration, len(self.templates) - 1)
        shift = iteration - base
        template = self.templates[base].actions(rank)
        if not shift:
            return list(template)
        return [a.with_(iteration=None if a.iteration is None else a.iteration + shift,
                        version=None if a.version is None else a.version + shift) for a in template]
