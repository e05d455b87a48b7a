"""Zero-bubble schedules: the backward split into input gradients (I) and weight gradients (W).

Problem. In 1F1B the backward wave that drains the pipeline carries each
stage's whole backward, so the first stage waits ``(p - 1)(F + B)``. Only the
input gradient is on that path: the weight gradient is needed by nothing
but the optimizer step, so it can wait and fill the idle slots (Qi et al.,
"Zero Bubble Pipeline Parallelism").

Approach. One greedy list scheduler, :func:`list_schedule`, writes every
schedule here except DualPipeV. It runs the stages' F, I and W in time order
(times from unit costs or from the stages' real costs, messages included),
each rank starting whatever it can start earliest, ties broken by a
priority (I before F before W, later stages first); an F waits while the
rank's saved activations (freed by each micro-batch's W) are at its memory
limit. The limit is what makes the schedules:

* ZB-H1: 1F1B's peak (``p`` micro-batches) on every rank;
* ZB-H2: ``2p - 1``, enough warm-up forwards to leave no bubble inside;
* ZB-V: two chunks per rank in a V, 1F1B's peak in bytes (``2p`` chunks);
* ``zb-auto``: the real F, I, W and message times under a limit in MB,
  keeping the fastest of several priorities and of ZB-H1 / ZB-H2 when they
  fit (so it is never slower than ZB-H1 where ZB-H1 fits);
* torch's interleaved zero bubble is drawn as looped chunks under the same rule.

DualPipeV (DeepSeek's DualPipe cut in half onto a V) has an order of its
own, written phase by phase in :func:`dualpipe_v`: its steady state pairs
one chunk's forward with the other chunk's full backward.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core.fields import check_int
from ..core.ir import Action, Op, Schedule, ScheduleMeta
from .stagecosts import StageCosts

__all__ = ["list_schedule", "zb_h1", "zb_h2", "zb_v", "interleaved_zb", "dualpipe_v", "zb_auto", "v_placement",
           "looped_placement"]

_PRIORITY = {Op.BACKWARD_INPUT: 0, Op.FORWARD: 1, Op.BACKWARD_WEIGHT: 2}
_EPS = 1e-9


def v_placement(num_ranks: int) -> tuple[int, ...]:
    """Virtual stage -> rank for a V: stages ``0 .. p-1`` down the ranks, ``p .. 2p-1`` back up."""
    return tuple(range(num_ranks)) + tuple(reversed(range(num_ranks)))


def looped_placement(num_ranks: int, chunks: int) -> tuple[int, ...]:
    """Virtual stage -> rank when the chunks loop over the ranks (interleaved): stage ``v`` on ``v % p``."""
    return tuple(v % num_ranks for v in range(num_ranks * chunks))


class _State:
    """Progress of one list scheduling: per stage the next F, I and W micro-batch, and when each finished."""

    def __init__(self, placement: Sequence[int], num_microbatches: int) -> None:
        self.placement = tuple(placement)
        self.stages = len(self.placement)
        self.m = num_microbatches
        self.next = {op: [0] * self.stages for op in _PRIORITY}
        self.done: dict[tuple[Op, int, int], float] = {}
        ranks = max(self.placement) + 1
        self.clock = [0.0] * ranks
        self.memory = [0.0] * ranks
        self.of_rank = [[s for s in range(self.stages) if self.placement[s] == r] for r in range(ranks)]
        self.lists: list[list[Action]] = [[] for _ in range(ranks)]

    def ready(self, op: Op, stage: int, message_ms: float) -> float | None:
        """When the next ``op`` of ``stage`` may start (None: it waits for an action not yet placed)."""
        mb = self.next[op][stage]
        if mb >= self.m:
            return None
        if op is Op.FORWARD:
            if stage == 0:
                return 0.0
            return self._after(Op.FORWARD, stage - 1, mb, stage, message_ms)
        if op is Op.BACKWARD_INPUT:
            own = self.done.get((Op.FORWARD, stage, mb))
            if own is None or stage == self.stages - 1:
                return own
            below = self._after(Op.BACKWARD_INPUT, stage + 1, mb, stage, message_ms)
            return None if below is None else max(own, below)
        return self.done.get((Op.BACKWARD_INPUT, stage, mb))

    def _after(self, op: Op, source: int, mb: int, stage: int, message_ms: float) -> float | None:
        end = self.done.get((op, source, mb))
        if end is None:
            return None
        return end + (message_ms if self.placement[source] != self.placement[stage] else 0.0)


def list_schedule(placement: Sequence[int], num_microbatches: int, times: dict[Op, Sequence[float]],
                  memory_limits: Sequence[float], activation: Sequence[float], *, message_ms: float = 0.0,
                  name: str = "list") -> Schedule:
    """A split-backward schedule by greedy list scheduling (see the module docstring).

    ``placement[v]`` is the rank of virtual stage ``v``; ``times[op][v]`` the
    duration of F, I and W of stage ``v``; ``activation[v]`` what one
    micro-batch's forward of stage ``v`` keeps until its W, and
    ``memory_limits[r]`` what rank ``r`` may keep at once (same unit). A
    limit below one micro-batch of a rank's largest stage is refused.
    """
    check_int("num_microbatches", num_microbatches, 1)
    state = _State(placement, num_microbatches)
    for r, stages in enumerate(state.of_rank):
        need = max((activation[s] for s in stages), default=0.0)
        if memory_limits[r] + _EPS < need:
            raise ValueError(f"memory limit of rank {r} ({memory_limits[r]:g}) is below one micro-batch of its "
                             f"stages' activations ({need:g}): no schedule fits")
    for _ in range(3 * state.stages * num_microbatches):
        best = None
        for r, stages in enumerate(state.of_rank):
            for s in stages:
                for op in _PRIORITY:
                    ready = state.ready(op, s, message_ms)
                    if ready is None or (op is Op.FORWARD and
                                         state.memory[r] + activation[s] > memory_limits[r] + _EPS):
                        continue
                    key = (max(ready, state.clock[r]), _PRIORITY[op], -s, r)
                    if best is None or key < best[0]:
                        best = (key, r, s, op)
        if best is None:
            raise ValueError(f"{name}: no action can start (the memory limits {list(memory_limits)} leave the "
                             f"pipeline waiting on itself)")
        (start, _, _, _), r, s, op = best
        mb = state.next[op][s]
        end = start + times[op][s]
        state.done[(op, s, mb)] = end
        state.next[op][s] += 1
        state.clock[r] = end
        state.memory[r] += activation[s] if op is Op.FORWARD else -activation[s] if op is Op.BACKWARD_WEIGHT else 0
        chunk = state.of_rank[r].index(s) if len(state.of_rank[r]) > 1 else None
        state.lists[r].append(Action(s, op, mb, chunk=chunk))
    return _schedule(state.lists, name, placement, num_microbatches)


def _schedule(lists: list[list[Action]], name: str, placement: Sequence[int], m: int) -> Schedule:
    chunks = len(placement) // (max(placement) + 1)
    return Schedule(tuple(tuple(r) for r in lists), name=name, num_stages=len(placement), num_microbatches=m,
                    meta=ScheduleMeta(stage_to_rank=(tuple(placement),), chunks=chunks if chunks > 1 else 1))


def _unit(placement: Sequence[int], m: int, limit: float, name: str) -> Schedule:
    n = len(placement)
    ones = {op: (1.0,) * n for op in _PRIORITY}
    return list_schedule(placement, m, ones, [limit] * (max(placement) + 1), (1.0,) * n, name=name)


def zb_h1(num_stages: int, num_microbatches: int) -> Schedule:
    """ZB-H1: 1F1B's warm-up and memory, the W's of stage ``s`` deferred by ``s`` micro-batches.

    Stage ``s`` runs ``p - 1 - s`` warm-up forwards, then F, I and the W of
    the micro-batch ``s`` places back, so the backward wave carries only I
    and the deferred W's fill the drain; no stage holds more than ``p``
    micro-batches.
    """
    check_int("num_stages", num_stages, 1)
    check_int("num_microbatches", num_microbatches, 1)
    p, m = num_stages, num_microbatches
    lists = []
    for s in range(p):
        warmup = min(p - 1 - s, m)
        out = [Action(s, Op.FORWARD, k) for k in range(warmup)]
        weights = 0
        for i in range(m):
            if warmup + i < m:
                out.append(Action(s, Op.FORWARD, warmup + i))
            out.append(Action(s, Op.BACKWARD_INPUT, i))
            if i - s >= 0:
                out.append(Action(s, Op.BACKWARD_WEIGHT, i - s))
                weights += 1
        out += [Action(s, Op.BACKWARD_WEIGHT, k) for k in range(weights, m)]
        lists.append(out)
    return _schedule(lists, "zbh1", tuple(range(p)), m)


def zb_h2(num_stages: int, num_microbatches: int) -> Schedule:
    """ZB-H2: up to ``2p - 1`` micro-batches in flight, no bubble inside the iteration."""
    check_int("num_stages", num_stages, 1)
    return _unit(tuple(range(num_stages)), num_microbatches, 2 * num_stages - 1, "zbh2")


def zb_v(num_ranks: int, num_microbatches: int) -> Schedule:
    """ZB-V: two chunks per rank in a V (stages ``r`` and ``2p - 1 - r`` on rank ``r``), split backward.

    Rank ``r`` runs ``2(p - r) - 1`` forwards of its first chunk, ``r`` pairs
    of forwards of both, ``p - r`` rounds of F, I, W of its second chunk,
    then the steady rounds (F, I, W of the first chunk, then of the second),
    the remaining I's of both chunks, and the W's it deferred. The rounds
    are written for at least ``2p - 1`` micro-batches; with fewer, the
    actions of the micro-batches that do not exist are left out.
    """
    check_int("num_ranks", num_ranks, 1)
    check_int("num_microbatches", num_microbatches, 1)
    p, m = num_ranks, num_microbatches
    lists = [[a for a in _zb_v_rank(p, max(2 * p - 1, m), r) if a.microbatch < m] for r in range(p)]
    return _schedule(lists, "zbv", v_placement(p), m)


def _zb_v_rank(p: int, n: int, rank: int) -> list[Action]:
    stage = {0: rank, 1: 2 * p - 1 - rank}
    count = {(c, op): 0 for c in (0, 1) for op in _PRIORITY}
    out: list[Action] = []

    def emit(chunk: int, op: Op, mb: int | None = None) -> None:
        if mb is None:
            mb = count[(chunk, op)]
            count[(chunk, op)] += 1
        out.append(Action(stage[chunk], op, mb, chunk=chunk))

    for _ in range(2 * (p - rank) - 1):
        emit(0, Op.FORWARD)
    for _ in range(rank):
        emit(1, Op.FORWARD)
        emit(0, Op.FORWARD)
    for _ in range(p - rank):
        emit(1, Op.FORWARD)
        emit(1, Op.BACKWARD_INPUT)
        emit(1, Op.BACKWARD_WEIGHT)
    while count[(1, Op.FORWARD)] < count[(0, Op.FORWARD)] or count[(0, Op.FORWARD)] < n:
        if count[(0, Op.FORWARD)] < n:
            emit(0, Op.FORWARD)
        for chunk in (0, 1):
            if chunk == 1:
                emit(1, Op.FORWARD)
            emit(chunk, Op.BACKWARD_INPUT)
            emit(chunk, Op.BACKWARD_WEIGHT)
    for _ in range(rank):
        emit(0, Op.BACKWARD_INPUT)
        emit(1, Op.BACKWARD_INPUT)
    for _ in range(p - rank):
        emit(0, Op.BACKWARD_INPUT)
        emit(0, Op.BACKWARD_WEIGHT)
    for chunk in (1, 0):
        while count[(chunk, Op.BACKWARD_WEIGHT)] < count[(chunk, Op.BACKWARD_INPUT)]:
            emit(chunk, Op.BACKWARD_WEIGHT)
    return out


def interleaved_zb(num_ranks: int, num_microbatches: int, chunks: int = 2) -> Schedule:
    """Looped chunks (interleaved) with split backward, under interleaved 1F1B's peak on the first rank."""
    check_int("num_ranks", num_ranks, 1)
    p, v = num_ranks, chunks
    return _unit(looped_placement(p, v), num_microbatches, (p - 1) * 2 + (v - 1) * p + 1, "interleaved-zb")


def zb_auto(num_stages: int, num_microbatches: int, stage_costs: StageCosts | None,
            memory_limit_mb: float = 0.0, *, message_ms: float | None = None, cluster: Any = None) -> Schedule:
    """The fastest split-backward schedule found for these stages' real times under ``memory_limit_mb``.

    Messages: on ``cluster`` (a ClusterSpec) each stage's activations and
    gradients take their link's time, the list schedule waits the longest
    boundary's (``message_ms`` overrides it), the one for free messages is
    kept beside it, and the candidates are timed on its links; without one
    messages take ``message_ms`` (default 0).

    The limit bounds each rank's saved activations (``memory_limit_mb``
    MB; 0: the most any rank keeps under 1F1B or ZB-H1, so the default
    schedule is never slower than ZB-H1). Candidates: the list
    schedule (I before F before W among ties), and ZB-H1 and ZB-H2 when they
    fit; each is simulated with the stages' costs and the shortest iteration
    is kept. Without costs every stage costs one
    unit each of F, I and W.
    """
    check_int("num_stages", num_stages, 1)
    check_int("num_microbatches", num_microbatches, 1)
    costs = stage_costs or StageCosts.uniform(num_stages, forward_ms=1.0, backward_ms=2.0, activation_bytes=1)
    if costs.num_stages != num_stages:
        raise ValueError(f"zb-auto: stage_costs has {costs.num_stages} stages, the plan has {num_stages}")
    act = [float(max(b, 1)) for b in costs.activation_bytes]
    one_f_one_b = max(min(num_stages - s, num_microbatches) * act[s] for s in range(num_stages))
    # 0: 1F1B's memory, or ZB-H1's where a later stage holds more per micro-batch and its delayed W
    # keeps one more there, so the default never loses to ZB-H1
    limit = memory_limit_mb * 1e6 if memory_limit_mb else max(
        one_f_one_b, _peak_activation(zb_h1(num_stages, num_microbatches), act))
    if memory_limit_mb and limit + _EPS < max(act):
        raise ValueError(f"plan field 'pipeline.memory_limit_mb' = {memory_limit_mb:g} is invalid: one "
                         f"micro-batch of the largest stage keeps {max(act) / 1e6:.3f} MB of activations, so no "
                         f"schedule fits; raise the limit (0 keeps 1F1B's memory)")
    times = {Op.FORWARD: costs.forward_ms, Op.BACKWARD_INPUT: costs.input_grad_ms,
             Op.BACKWARD_WEIGHT: costs.weight_grad_ms}
    if message_ms is None:
        message_ms = max((cluster.link(s, s + 1).transfer_ms(costs.send_bytes[s]) for s in range(num_stages - 1)),
                         default=0.0) if cluster is not None else 0.0
    placement = tuple(range(num_stages))
    candidates = [list_schedule(placement, num_microbatches, times, [limit] * num_stages, act, message_ms=wait,
                                name="zb-auto") for wait in sorted({message_ms, 0.0})]
    for units, build in ((num_stages, zb_h1), (2 * num_stages - 1, zb_h2)):
        schedule = build(num_stages, num_microbatches)
        if _peak_activation(schedule, act) <= limit + _EPS:
            candidates.append(schedule)
    return min(candidates, key=lambda s: _iteration_ms(s, costs, cluster))


def _peak_activation(schedule: Schedule, act: Sequence[float]) -> float:
    peak = 0.0
    for r in range(schedule.num_ranks):
        live = 0.0
        for a in schedule.actions(r):
            live += act[a.stage] if a.op is Op.FORWARD else -act[a.stage] if a.op is Op.BACKWARD_WEIGHT else 0.0
            peak = max(peak, live)
    return peak


def _iteration_ms(schedule: Schedule, costs: StageCosts, cluster: Any = None) -> float:
    from .simulate import simulate

    renamed = Schedule(schedule.ranks, name="zb-auto", num_stages=schedule.num_stages,
                       num_microbatches=schedule.num_microbatches, meta=schedule.meta)
    return simulate(renamed, costs, cluster).metrics["iteration_ms"]


def dualpipe_v(num_ranks: int, num_microbatches: int) -> Schedule:
    """DualPipeV on ``p`` ranks: stages ``r`` and ``2p - 1 - r`` on rank ``r``, ``m >= 2p`` micro-batches.

    Each rank runs eight phases: forwards of its first chunk; forwards of
    both; zero-bubble I, W, F of its second chunk; the steady state, which
    pairs a forward of one chunk with the full backward (B) of the other;
    backwards of the second chunk paired with forward-backward pairs; the
    backwards of both chunks, the later half split into I and W; and the
    deferred W's. Weight gradients split off are queued and run oldest first.
    """
    check_int("num_ranks", num_ranks, 1)
    check_int("num_microbatches", num_microbatches, 1)
    p, m = num_ranks, num_microbatches
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs at least 2 x ranks = {2 * p} micro-batches, got {m}")
    return _schedule([_dualpipe_v_rank(p, m, r) for r in range(p)], "dualpipev", v_placement(p), m)


def _dualpipe_v_rank(p: int, m: int, rank: int) -> list[Action]:
    first, second = rank, 2 * p - 1 - rank
    count = {(s, kind): 0 for s in (first, second) for kind in "FB"}
    weights: list[tuple[int, int]] = []
    out: list[Action] = []

    def emit(stage: int, op: Op) -> None:
        kind = "F" if op is Op.FORWARD else "B"
        mb = count[(stage, kind)]
        count[(stage, kind)] += 1
        out.append(Action(stage, op, mb, chunk=0 if stage == first else 1))
        if op is Op.BACKWARD_INPUT:
            weights.append((stage, mb))

    def weight() -> None:
        if weights:
            stage, mb = weights.pop(0)
            out.append(Action(stage, Op.BACKWARD_WEIGHT, mb, chunk=0 if stage == first else 1))

    for _ in range(2 * (p - rank - 1)):
        emit(first, Op.FORWARD)
    for _ in range(rank + 1):
        emit(first, Op.FORWARD)
        emit(second, Op.FORWARD)
    for _ in range(p - rank - 1):
        emit(second, Op.BACKWARD_INPUT)
        weight()
        emit(second, Op.FORWARD)
    for _ in range(m - 2 * p + rank + 1):
        emit(first, Op.FORWARD)
        emit(second, Op.BACKWARD)
        emit(second, Op.FORWARD)
        emit(first, Op.BACKWARD)
    for _ in range(p - rank - 1):
        emit(second, Op.BACKWARD)
        emit(second, Op.FORWARD)
        emit(first, Op.BACKWARD)
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        emit(second, Op.BACKWARD_INPUT if split else Op.BACKWARD)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        emit(first, Op.BACKWARD_INPUT if split else Op.BACKWARD)
    for _ in range(p - rank - 1):
        weight()
        emit(first, Op.BACKWARD_INPUT if split else Op.BACKWARD)
    for _ in range(rank + 1):
        weight()
    while weights:
        weight()
    return out
