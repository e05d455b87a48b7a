"""Prove a schedule can run: matched messages, no deadlock, backward after forward.

A schedule that is wrong fails on a real cluster as a hang with no message,
so every schedule is checked here first, as data. The checks, in order:

1. well-formed: peers are other existing ranks; pipeline actions sit on the
   rank ``meta.stage_to_rank`` gives their stage;
2. per rank, every micro-batch's backward follows its forward on that stage,
   and each forward runs once; every pipeline runs every stage's forward for
   every micro-batch of every iteration it names; a split backward runs its
   weight gradient (``W``) after its input gradient (``I``) and before the
   stage's next optimizer step, and never beside a full backward (``B``);
3. every send has its receive: per channel (sender, receiver, direction) the
   receiver expects the micro-batches in the order they are sent (the
   runtime's isend/irecv pairs messages in order);
4. every member of an all-reduce group issues the same all-reduces in the
   same order (collectives pair up by order too);
5. no deadlock: executing the program with non-blocking sends and
   all-reduce launches, blocking receives, and steps that wait for their
   all-reduce, every rank reaches its end. Pipelines without sends and
   receives are checked with the data dependencies they imply (a stage's
   forward needs the previous stage's, a backward the next stage's).

Failures raise :class:`ScheduleError` (a ``ValueError``) whose message ends
with the step x rank grid.
"""

from __future__ import annotations

from collections import defaultdict

from ..core.ir import Action, Op, Schedule

__all__ = ["validate", "ScheduleError"]

_MAX_GRID_STEPS = 120


class ScheduleError(ValueError):
    """A schedule that cannot run as written."""


def _fail(schedule: Schedule, problem: str) -> None:
    grid = schedule.to_grid(max_steps=_MAX_GRID_STEPS)
    raise ScheduleError(f"schedule {schedule.name!r} is invalid: {problem}\n{grid}")


def _owner(schedule: Schedule) -> dict[int, list[int]] | None:
    pipes = schedule.meta.stage_to_rank
    if not pipes:
        return None
    owner: dict[int, list[int]] = {}
    for pipe in pipes:
        for r in pipe:
            owner[r] = list(pipe)
    return owner


def _check_well_formed(schedule: Schedule, owner: dict[int, list[int]] | None) -> None:
    n = schedule.num_ranks
    for r in range(n):
        for a in schedule.actions(r):
            if a.peer is not None and (a.peer >= n or a.peer == r):
                _fail(schedule, f"rank {r} action {a} names peer {a.peer}; peers must be another rank in [0, {n - 1}]")
            if owner is not None and a.is_compute:
                pipe = owner.get(r)
                if pipe is None or a.stage >= len(pipe) or pipe[a.stage] != r:
                    _fail(schedule, f"rank {r} runs {a}, but meta.stage_to_rank puts stage {a.stage} elsewhere")


def _check_split(schedule: Schedule, r: int) -> None:
    """On rank ``r``: each W after its I, before the stage's next STEP, and no micro-batch both split and whole."""
    inputs: set = set()
    whole: set = set()
    pending: dict[int, set] = defaultdict(set)  # stage -> split backwards whose W has not run
    for a in schedule.actions(r):
        key = (a.stage, a.microbatch, a.iteration)
        if a.op is Op.BACKWARD_INPUT:
            if key in whole or key in inputs:
                _fail(schedule, f"rank {r} runs {a} but micro-batch {a.microbatch} of stage {a.stage} already ran "
                                f"its backward")
            inputs.add(key)
            pending[a.stage].add(key)
        elif a.op is Op.BACKWARD:
            if key in inputs:
                _fail(schedule, f"rank {r} runs the full backward {a} after its input gradient (I)")
            whole.add(key)
        elif a.op is Op.BACKWARD_WEIGHT:
            if key not in pending[a.stage]:
                _fail(schedule, f"rank {r} runs the weight gradient {a} before (or without) its input gradient (I)")
            pending[a.stage].discard(key)
        elif a.op is Op.STEP and pending[a.stage]:
            left = sorted(pending[a.stage], key=str)[0]
            _fail(schedule, f"rank {r} steps stage {a.stage} ({a}) before the weight gradient (W) of micro-batch "
                            f"{left[1]} (iteration {left[2]})")
    if any(pending.values()):
        stage = next(s for s, keys in pending.items() if keys)
        _fail(schedule, f"rank {r} never runs the weight gradient (W) of micro-batch "
                        f"{sorted(pending[stage], key=str)[0][1]} on stage {stage}")


def _check_forward_backward(schedule: Schedule, owner: dict[int, list[int]] | None) -> None:
    has_backward = any(a.op in (Op.BACKWARD, Op.BACKWARD_INPUT)
                       for r in range(schedule.num_ranks) for a in schedule.actions(r))
    pipelines_done: dict[tuple, set] = defaultdict(set)
    iterations: set = set()
    for r in range(schedule.num_ranks):
        forwards: set = set()
        backwards: set = set()
        for a in schedule.actions(r):
            key = (a.stage, a.microbatch, a.iteration)
            if a.op is Op.FORWARD:
                if key in forwards and a.bucket is None:
                    _fail(schedule, f"rank {r} runs the forward {a} twice")
                forwards.add(key)
                iterations.add(a.iteration)
                if owner is not None:
                    pipelines_done[(owner[r][0], a.iteration)].add((a.stage, a.microbatch))
            elif a.op in (Op.BACKWARD, Op.BACKWARD_INPUT):
                if key not in forwards:
                    _fail(schedule, f"rank {r} runs backward {a} before (or without) its forward on stage {a.stage}")
                backwards.add(key)
        _check_split(schedule, r)
        if has_backward and schedule.meta.stage_to_rank:
            missing = sorted(forwards - backwards, key=str)
            if missing:
                s, mb, it = missing[0]
                _fail(schedule, f"rank {r} runs the forward of micro-batch {mb} (stage {s}, iteration {it}) "
                                "but never its backward")
    if owner is not None and schedule.num_microbatches:
        for pipe in schedule.meta.stage_to_rank:
            for it in iterations:
                got = pipelines_done.get((pipe[0], it), set())
                for s in range(len(pipe)):
                    for mb in range(schedule.num_microbatches):
                        if (s, mb) not in got:
                            _fail(schedule, f"pipeline on ranks {pipe} never runs the forward of micro-batch {mb} on "
                                            f"stage {s} (iteration {it})")


def _channel(a: Action, rank: int) -> tuple[int, int, str]:
    direction = "F" if a.op in (Op.SEND_F, Op.RECV_F) else "B"
    return (rank, a.peer, direction) if a.is_send else (a.peer, rank, direction)


def _check_matching(schedule: Schedule) -> None:
    sent: dict[tuple, list] = defaultdict(list)
    received: dict[tuple, list] = defaultdict(list)
    for r in range(schedule.num_ranks):
        for a in schedule.actions(r):
            if a.is_send:
                sent[_channel(a, r)].append((a.microbatch, a.iteration))
            elif a.is_recv:
                received[_channel(a, r)].append((a.microbatch, a.iteration))
    for ch in sorted(set(sent) | set(received)):
        src, dst, d = ch
        s, v = sent.get(ch, []), received.get(ch, [])
        if len(s) != len(v):
            _fail(schedule, f"rank {src} sends {len(s)} {d}-messages to rank {dst}, which receives {len(v)}")
        for i, (x, y) in enumerate(zip(s, v)):
            if x != y:
                _fail(schedule, f"message {i} from rank {src} to rank {dst} ({d}) is micro-batch {x[0]} iteration "
                                f"{x[1]} but rank {dst} expects micro-batch {y[0]} iteration {y[1]} (order differs)")


def _ar_groups(schedule: Schedule) -> list[list[int]]:
    groups = schedule.meta.dp_groups
    return [list(g) for g in groups] if groups else []


def _check_collectives(schedule: Schedule) -> dict[tuple, list[int]]:
    """Per all-reduce (stage, iteration, bucket, occurrence), the group that must issue it."""
    groups = _ar_groups(schedule)
    sequences: dict[int, list[tuple]] = {}
    members: dict[tuple, list[int]] = {}
    for r in range(schedule.num_ranks):
        seq = []
        for a in schedule.actions(r):
            if a.op is Op.ALL_REDUCE:
                group = groups[a.stage] if a.stage < len(groups) else [r]
                if r not in group:
                    _fail(schedule, f"rank {r} issues {a} but is not in stage {a.stage}'s all-reduce group {group}")
                seq.append((a.stage, a.iteration, a.bucket))
                members[(a.stage, a.iteration, a.bucket)] = group
        sequences[r] = seq
    for key, group in members.items():
        for r in group:
            own = [k for k in sequences[r] if k[0] == key[0]]
            ref = [k for k in sequences[group[0]] if k[0] == key[0]]
            if own != ref:
                _fail(schedule, f"ranks {group[0]} and {r} issue stage {key[0]}'s all-reduces in different orders "
                                f"or numbers: {ref} vs {own}")
    return members


def _check_progress(schedule: Schedule, owner: dict[int, list[int]] | None, ar_members: dict[tuple, list[int]]) -> None:
    n = schedule.num_ranks
    programs = [schedule.actions(r) for r in range(n)]
    pointer = [0] * n
    sends_done: dict[tuple, int] = defaultdict(int)
    recvs_done: dict[tuple, int] = defaultdict(int)
    launched: dict[tuple, set] = defaultdict(set)
    computed: set = set()
    pipeline_deps = owner is not None

    def blocker(r: int, a: Action) -> str | None:
        if a.is_recv:
            ch = _channel(a, r)
            return None if sends_done[ch] > recvs_done[ch] else f"the matching send from rank {a.peer}"
        if a.op is Op.STEP:
            for key, group in ar_members.items():
                if key[0] == a.stage and key[1] == a.iteration and r in group and launched[key] != set(group):
                    return f"all-reduce {key} to be launched by ranks {sorted(set(group) - launched[key])}"
            return None
        if pipeline_deps and a.op is Op.FORWARD and a.stage > 0:
            need = ("F", owner[r][0], a.stage - 1, a.microbatch, a.iteration)
            return None if need in computed else f"the forward of micro-batch {a.microbatch} on stage {a.stage - 1}"
        if pipeline_deps and a.op in (Op.BACKWARD, Op.BACKWARD_INPUT) and a.stage + 1 < len(owner[r]):
            need = ("B", owner[r][0], a.stage + 1, a.microbatch, a.iteration)
            return None if need in computed else f"the backward of micro-batch {a.microbatch} on stage {a.stage + 1}"
        return None

    progress = True
    while progress:
        progress = False
        for r in range(n):
            prog = programs[r]
            while pointer[r] < len(prog):
                a = prog[pointer[r]]
                if blocker(r, a) is not None:
                    break
                if a.is_send:
                    sends_done[_channel(a, r)] += 1
                elif a.is_recv:
                    recvs_done[_channel(a, r)] += 1
                elif a.op is Op.ALL_REDUCE:
                    launched[(a.stage, a.iteration, a.bucket)].add(r)
                elif a.op in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT) and pipeline_deps:
                    kind = "F" if a.op is Op.FORWARD else "B"  # an input gradient is what the stage before waits for
                    computed.add((kind, owner[r][0], a.stage, a.microbatch, a.iteration))
                pointer[r] += 1
                progress = True
    stuck = [r for r in range(n) if pointer[r] < len(programs[r])]
    if stuck:
        lines = [f"rank {r} at step {pointer[r]} ({programs[r][pointer[r]]}) waits for "
                 f"{blocker(r, programs[r][pointer[r]])}" for r in stuck]
        _fail(schedule, "deadlock: " + "; ".join(lines))


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` can run to the end (see the module docstring)."""
    if not isinstance(schedule, Schedule):
        raise ValueError(f"validate() needs a Schedule, got {type(schedule).__name__}")
    owner = _owner(schedule)
    _check_well_formed(schedule, owner)
    _check_forward_backward(schedule, owner)
    _check_matching(schedule)
    members = _check_collectives(schedule)
    _check_progress(schedule, owner, members)
