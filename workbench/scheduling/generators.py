"""Pipeline schedules as pure functions of a few small integers.

Every schedule the workbench knows is written exactly once, here, as a
function returning a :class:`~workbench.core.ir.Schedule`: per-rank action
lists in program order (no idle slots: waiting is the simulator's business).
The validator, the simulator, the timeline figure and the runtime interpreter
all consume that value, so none of them re-derives the order.

Conventions shared by every generator:

* Pipelines place stage ``s`` of pipeline ``g`` on rank ``g * S + s``
  (``Topology(dp=G, pp=S)``); ``meta.stage_to_rank`` lists, per pipeline,
  the rank of every (virtual) stage, and ``meta.replicas`` the number of
  model replicas that each take ``num_microbatches`` micro-batches.
* Generators emit compute (``F``/``B``), gradient all-reduce (``AR``) and
  optimizer steps (``STEP``) only; :mod:`workbench.scheduling.passes` adds the
  point-to-point sends and receives and the weight stash/restore actions.
* ``async_1f1b`` and ``gropipe`` number iterations (``Action.iteration``) and
  set ``Action.version``: the number of optimizer steps the stage had applied
  when the action's forward ran (a backward uses its forward's version).

Delayed gradient all-reduce (GroPipe, ``delay=1``): iteration ``t``'s list is
its pipeline actions, then ``sAR i t`` (launched right after the stage's last
backward, asynchronous), then ``sSTEP i t-1`` which waits for the previous
iteration's all-reduce and applies it. The last iteration's all-reduce stays
pending (``meta.pending_step_iteration``) unless ``drain=True`` appends
its step; a caller running one iteration at a time passes
``first_iteration`` so the numbering (and so the delayed step) carries on.
"""

from __future__ import annotations

from functools import lru_cache, wraps
from typing import Callable, Sequence, TypeVar

from ..core.fields import check_int, is_int
from ..core.ir import Action, Op, Schedule, ScheduleMeta
from ..core.topology import Topology

__all__ = [
    "gpipe", "one_f_one_b", "interleaved", "async_1f1b", "async_inflight", "ASYNC_MODES", "gropipe", "data_parallel",
    "tensor2d_step", "pipeline_order", "memoised",
]


_F = TypeVar("_F", bound=Callable[..., Schedule])


def memoised(fn: _F) -> _F:
    """``fn`` remembering the last schedules it built, by their arguments (typed: ``4`` and ``4.0`` differ).

    A schedule is an immutable value, and the simulator keeps a schedule's
    lowered, compiled form while the schedule lives (:mod:`.sim_compile`),
    so a sweep asking for the same kind and shape again (a partition editor,
    a planner trying partitions) pays for neither. A call with an argument
    that cannot be hashed (a list of in-flight caps) is not remembered.
    """
    remembered = lru_cache(maxsize=16, typed=True)(fn)

    @wraps(fn)
    def call(*args, **kwargs):
        try:
            hash((args, tuple(kwargs.items())))
        except TypeError:
            return fn(*args, **kwargs)
        return remembered(*args, **kwargs)

    call.cache_clear = remembered.cache_clear  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


_action = Action.unchecked  # the generators' fields are valid by construction: ints from ranges, Op members
_OPS = {op.value: op for op in Op}


def _versioned(a: Action, version: int | None) -> Action:
    """``a.with_(version=version)`` for a valid action and version (an int >= 0 or None), without re-checking."""
    return _action(a.stage, a.op, a.microbatch, a.chunk, a.iteration, version, a.bucket, a.peer)


# -- per-stage orders ------------------------------------------------------------------
def _fill_drain_order(num_stages: int, stage: int, num_microbatches: int) -> list[tuple[str, int]]:
    """GPipe: every forward, then every backward."""
    return [("F", i) for i in range(num_microbatches)] + [("B", i) for i in range(num_microbatches)]


def _one_f_one_b_order(num_stages: int, stage: int, num_microbatches: int) -> list[tuple[str, int]]:
    """1F1B (PipeDream-flush / DAPPLE): warm-up forwards, alternate, cool-down backwards."""
    return _warmup_order(min(num_stages - 1 - stage, num_microbatches), num_microbatches)


def _warmup_order(warmup: int, num_microbatches: int) -> list[tuple[str, int]]:
    """``warmup`` forwards, then one forward one backward, then the remaining backwards."""
    order = [("F", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return order


_INNER_ORDERS = {"gpipe": _fill_drain_order, "1f1b": _one_f_one_b_order}


def pipeline_order(kind: str, num_stages: int, stage: int, num_microbatches: int) -> list[tuple[str, int]]:
    """The ``(kind, microbatch)`` order one stage runs, kind ``"F"`` or ``"B"``."""
    if kind not in _INNER_ORDERS:
        raise ValueError(f"inner schedule must be one of {sorted(_INNER_ORDERS)}, got {kind!r}")
    return _INNER_ORDERS[kind](num_stages, stage, num_microbatches)


def _single_pipeline(name: str, num_stages: int, num_microbatches: int) -> Schedule:
    check_int("num_stages", num_stages, 1)
    check_int("num_microbatches", num_microbatches, 1)
    ranks = []
    for s in range(num_stages):
        order = pipeline_order(name, num_stages, s, num_microbatches)
        ranks.append(tuple(_action(s, _OPS[kind], mb) for kind, mb in order))
    return Schedule(tuple(ranks), name=name, num_stages=num_stages, num_microbatches=num_microbatches,
                    meta=ScheduleMeta(stage_to_rank=(tuple(range(num_stages)),)))


@memoised
def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """GPipe fill-drain: all forwards, then all backwards; rank ``r`` runs stage ``r``."""
    return _single_pipeline("gpipe", num_stages, num_microbatches)


@memoised
def one_f_one_b(num_stages: int, num_microbatches: int) -> Schedule:
    """1F1B with a flush per iteration; at most ``num_stages - s`` micro-batches in flight on stage ``s``."""
    return _single_pipeline("1f1b", num_stages, num_microbatches)


@memoised
def interleaved(num_ranks: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """Interleaved 1F1B (Megatron): each rank holds ``num_chunks`` virtual stages.

    Virtual stage ``c * num_ranks + r`` lives on rank ``r`` as chunk ``c``.
    Micro-batches run in rounds of ``num_ranks``, so the count must be a
    multiple of ``num_ranks``; the bubble shrinks to
    ``(p - 1) / (v * m + p - 1)`` of the iteration.
    """
    check_int("num_ranks", num_ranks, 1)
    check_int("num_microbatches", num_microbatches, 1)
    check_int("num_chunks", num_chunks, 1)
    p, v, m = num_ranks, num_chunks, num_microbatches
    if m % p:
        raise ValueError(f"num_microbatches must be a multiple of num_ranks={p} for the interleaved schedule, got {m} "
                         f"(try {max(p, m - m % p)} or {m - m % p + p})")
    total = m * v

    def unit(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // p) % v
        if backward:
            chunk = v - 1 - chunk
        return chunk, (k // (p * v)) * p + k % p

    ranks = []
    for r in range(p):
        warmup = min(total, p - r - 1) if v == 1 else min(total, (p - r - 1) * 2 + (v - 1) * p)
        kinds = [("F", k) for k in range(warmup)]
        for i in range(total - warmup):
            kinds += [("F", warmup + i), ("B", i)]
        kinds += [("B", k) for k in range(total - warmup, total)]
        actions = []
        for kind, k in kinds:
            chunk, mb = unit(k, kind == "B")
            actions.append(_action(chunk * p + r, _OPS[kind], mb, chunk))
        ranks.append(tuple(actions))
    return Schedule(tuple(ranks), name="interleaved", num_stages=p * v, num_microbatches=m,
                    meta=ScheduleMeta(stage_to_rank=(tuple(vs % p for vs in range(p * v)),), chunks=v))


def _with_versions(actions: list[Action], start: int = 0) -> list[Action]:
    """Set each F's version to the steps applied so far (from ``start``) and each B's to its forward's."""
    version, used, out = start, {}, []
    for a in actions:
        key = (a.stage, a.microbatch, a.iteration)
        if a.op is Op.FORWARD:
            used[key] = version
            out.append(_versioned(a, version))
        elif a.op in _BACKWARD_OPS:
            out.append(_versioned(a, used[key]))
        else:
            out.append(a)
            if a.op is Op.STEP:
                version += 1
    return out


ASYNC_MODES = ("stash", "2bw")
_BACKWARD_OPS = (Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)


def async_inflight(num_stages: int, inflight: int | Sequence[int] | None = None) -> tuple[int, ...]:
    """Per stage, the micro-batches it keeps in flight: at most ``S - s``, and never more upstream than downstream.

    ``None`` is plain 1F1B (``S - s`` on stage ``s``); an int ``k`` caps every
    stage at ``k``; a sequence gives one cap per stage. A stage with cap ``k``
    runs ``k - 1`` warm-up forwards, and the caps must not grow along the
    pipeline: stage ``s`` alternates forward ``j + k_s - 1`` with backward
    ``j``, and that backward waits for stage ``s + 1``'s, which comes after its
    forward ``j + k_{s+1} - 1``, so ``k_{s+1} <= k_s`` keeps the order
    deadlock-free.
    """
    check_int("num_stages", num_stages, 1)
    if inflight is None:
        caps = [num_stages - s for s in range(num_stages)]
    elif is_int(inflight):
        check_int("inflight", inflight, 1)
        caps = [min(num_stages - s, inflight) for s in range(num_stages)]
    else:
        caps = list(inflight)
        if len(caps) != num_stages:
            raise ValueError(f"inflight must have one entry per stage ({num_stages}), got {caps!r}")
        for s, k in enumerate(caps):
            check_int(f"inflight[{s}]", k, 1)
        caps = [min(num_stages - s, k) for s, k in enumerate(caps)]
        for s in range(1, num_stages):
            if caps[s] > caps[s - 1]:
                raise ValueError(f"inflight[{s}] = {caps[s]} exceeds inflight[{s - 1}] = {caps[s - 1]}: an upstream "
                                 f"stage must keep at least as many micro-batches in flight as the next one")
    return tuple(caps)


@memoised
def async_1f1b(num_stages: int, num_microbatches: int, num_iterations: int, *,
               inflight: int | Sequence[int] | None = None, mode: str = "stash",
               vertical_sync: bool = False, num_groups: int = 1, split: bool = False) -> Schedule:
    """PipeDream-style 1F1B with no flush between iterations, with weight versions.

    The micro-batches of all iterations form one stream: stage ``s`` runs the
    1F1B order over ``num_microbatches * num_iterations`` of them, with at most
    ``inflight[s]`` in flight (:func:`async_inflight`), and applies
    ``sSTEP i t`` right after its last backward of iteration ``t`` (gradients
    are coalesced over an iteration's micro-batches). ``Action.version`` is the
    weight version (steps applied) a forward uses, and its backward uses the
    same one (``passes.add_weight_stash`` makes the stash explicit):

    * ``mode="stash"``: the newest version at the forward (PipeDream weight
      stashing; stage ``s`` keeps one version per in-flight iteration).
    * ``vertical_sync=True`` (stash mode): every stage uses the version stage 0
      used for that micro-batch, so all stages agree on one version per
      micro-batch (uniform staleness).
    * ``mode="2bw"`` (PipeDream-2BW): every micro-batch of iteration ``t`` on
      every stage uses version ``t - 1`` (0 for the first), so a stage holds two
      versions and ``w(t+1) = w(t) - lr * grad(w(t-1))``; needs
      ``num_microbatches >= num_stages`` (gradients coalesced over at least
      the pipeline depth).

    ``num_groups > 1`` runs that many such pipelines side by side (rank
    ``g * S + s`` holds stage ``s`` of pipeline ``g``, GroPipe's layout), each
    on its share of the batch; each stage all-reduces its gradients across the
    pipelines (``sAR i t``) right before its step.

    ``split=True`` runs each backward as its input gradient (I) and, right
    after it, its weight gradients (W) on the same version: the gradient goes
    upstream before W runs, and a micro-batch's graph is freed where the fused
    backward frees it (the same in-flight memory).
    """
    check_int("num_stages", num_stages, 1)
    check_int("num_microbatches", num_microbatches, 1)
    check_int("num_iterations", num_iterations, 1)
    check_int("num_groups", num_groups, 1)
    if mode not in ASYNC_MODES:
        raise ValueError(f"mode must be one of {', '.join(ASYNC_MODES)}, got {mode!r}")
    if not isinstance(vertical_sync, bool):
        raise ValueError(f"vertical_sync must be True or False, got {vertical_sync!r}")
    if mode == "2bw" and vertical_sync:
        raise ValueError("vertical_sync applies to mode 'stash'; mode '2bw' already uses one version per iteration "
                         "on every stage")
    if mode == "2bw" and num_microbatches < num_stages:
        raise ValueError(f"mode '2bw' coalesces gradients over at least the pipeline depth: num_microbatches "
                         f"({num_microbatches}) must be >= num_stages ({num_stages})")
    caps = async_inflight(num_stages, inflight)
    m, n = num_microbatches, num_microbatches * num_iterations
    ranks = []
    for s in range(num_stages):
        actions = []
        for kind, j in _warmup_order(min(caps[s] - 1, n), n):
            it, mb = divmod(j, m)
            actions.append(_action(s, _OPS[kind], mb, None, it))
            if kind == "B" and mb == m - 1:
                if num_groups > 1:
                    actions.append(Action(s, Op.ALL_REDUCE, iteration=it))
                actions.append(Action(s, Op.STEP, iteration=it))
        ranks.append(_with_versions(actions))
    if mode == "2bw":
        ranks = [[_use_version(a, max(0, a.iteration - 1)) for a in r] for r in ranks]
    elif vertical_sync:
        first = {(a.microbatch, a.iteration): a.version for a in ranks[0] if a.op is Op.FORWARD}
        ranks = [[_use_version(a, first.get((a.microbatch, a.iteration))) for a in r] for r in ranks]
    if split:
        ranks = [[b for a in r for b in _split(a)] for r in ranks]
    S = num_stages
    layout = Topology(dp=num_groups, pp=S)
    meta = ScheduleMeta(stage_to_rank=layout.groups("pp"), replicas=num_groups, num_iterations=num_iterations,
                        weight_stashing=True, inflight=tuple(caps), mode=mode, vertical_sync=vertical_sync,
                        dp_groups=layout.groups("dp") if num_groups > 1 else ())
    return Schedule(tuple(tuple(r) for r in ranks) * num_groups, name="async", num_stages=S, num_microbatches=m,
                    meta=meta)


def _split(action: Action) -> tuple[Action, ...]:
    """A backward as its input gradient then its weight gradients (same micro-batch, iteration and version)."""
    if action.op is not Op.BACKWARD:
        return (action,)
    a = action
    return tuple(_action(a.stage, op, a.microbatch, a.chunk, a.iteration, a.version, a.bucket, a.peer)
                 for op in (Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT))


def _use_version(action: Action, version: int | None) -> Action:
    """The action with ``version`` when it is a forward or backward."""
    if action.op is Op.FORWARD or action.op in _BACKWARD_OPS:
        return _versioned(action, version)
    return action


@memoised
def gropipe(num_groups: int, num_stages: int, num_microbatches: int, *, inner: str | Schedule = "1f1b",
            delay: int = 0, num_iterations: int = 1, first_iteration: int = 0, drain: bool = False) -> Schedule:
    """GroPipe: ``num_groups`` pipelines with a per-stage gradient all-reduce across groups.

    Rank ``g * S + s`` runs stage ``s`` of group ``g``. Each iteration a rank
    runs its pipeline actions, launches ``sAR`` right after its last backward,
    then steps: with ``delay=0`` it waits for this iteration's all-reduce
    (synchronous, exact); with ``delay=1`` it applies the previous iteration's
    (see the module docstring for the encoding). ``inner`` is the schedule
    every group runs: ``gpipe``, ``1f1b`` or a one-pipeline schedule of
    ``num_stages`` ranks (a zero-bubble one, say) whose rank ``s`` list is
    stage ``s``'s order.
    """
    from .passes import add_grad_sync

    check_int("num_groups", num_groups, 1)
    check_int("num_stages", num_stages, 1)
    check_int("num_microbatches", num_microbatches, 1)
    check_int("num_iterations", num_iterations, 1)
    if isinstance(inner, Schedule):
        if inner.num_ranks != num_stages or inner.num_stages != num_stages:
            raise ValueError(f"GroPipe's inner schedule must hold one stage per rank on {num_stages} ranks, got "
                             f"{inner.num_stages} stages on {inner.num_ranks} ranks")
        orders = [[(a.op.value, a.microbatch) for a in inner.actions(s) if a.is_compute] for s in range(num_stages)]
        inner_name = inner.name
    elif inner in _INNER_ORDERS:
        orders = [pipeline_order(inner, num_stages, s, num_microbatches) for s in range(num_stages)]
        inner_name = inner
    else:
        raise ValueError(f"inner must be one of {sorted(_INNER_ORDERS)} or a one-pipeline Schedule, got {inner!r}")
    check_int("first_iteration", first_iteration, 0)
    G, S, m = num_groups, num_stages, num_microbatches
    ranks = []
    for _g in range(G):
        for s in range(S):
            ranks.append(tuple(_action(s, _OPS[kind], mb, None, first_iteration + t)
                               for t in range(num_iterations) for kind, mb in orders[s]))
    base = Schedule(tuple(ranks), name=gropipe.__name__, num_stages=S, num_microbatches=m,
                    meta=ScheduleMeta(stage_to_rank=Topology(dp=G, pp=S).groups("pp"), replicas=G, inner=inner_name,
                                      num_iterations=num_iterations, first_iteration=first_iteration))
    synced = add_grad_sync(base, delay=delay, drain=drain)
    start = max(0, first_iteration - delay)
    return Schedule(tuple(tuple(_with_versions(list(r), start)) for r in synced.ranks), name=gropipe.__name__, num_stages=S,
                    num_microbatches=m, meta=synced.meta)


@memoised
def data_parallel(num_ranks: int, num_buckets: int) -> Schedule:
    """Data parallel: one forward, the backward in buckets, each bucket's all-reduce launched as it is done.

    The backward produces buckets last-layer-first (``0B0b{k}`` for ``k`` from
    ``num_buckets - 1`` down to 0), and ``0ARb{k}`` follows each, so the
    all-reduce of bucket ``k`` overlaps the backward of the buckets before it.
    """
    check_int("num_ranks", num_ranks, 1)
    check_int("num_buckets", num_buckets, 1)
    actions = [Action(0, Op.FORWARD, 0)]
    for k in reversed(range(num_buckets)):
        actions += [Action(0, Op.BACKWARD, 0, bucket=k), Action(0, Op.ALL_REDUCE, bucket=k)]
    actions.append(Action(0, Op.STEP))
    return Schedule(tuple(tuple(actions) for _ in range(num_ranks)), name="dp", num_stages=1, num_microbatches=1,
                    meta=ScheduleMeta(replicas=num_ranks, dp_groups=(tuple(range(num_ranks)),), num_buckets=num_buckets,
                                      backward_buckets=num_buckets))


@memoised
def tensor2d_step(q: int, num_layers: int) -> Schedule:
    """One training step of 2D (SUMMA) tensor parallelism on a ``q x q`` grid.

    Every rank runs the same program: for each layer, ``q`` SUMMA steps
    forward (``lF0b{t}``: broadcast the row's activation block and the
    column's weight block of step ``t``, multiply, accumulate), then the
    backward steps in reverse layer order, then one optimizer step per layer.
    Rank ``i * q + j`` is grid cell (row ``i``, column ``j``).
    """
    check_int("q", q, 1)
    check_int("num_layers", num_layers, 1)
    actions = [Action(l, Op.FORWARD, 0, bucket=t) for l in range(num_layers) for t in range(q)]
    actions += [Action(l, Op.BACKWARD, 0, bucket=t) for l in reversed(range(num_layers)) for t in range(q)]
    actions += [Action(l, Op.STEP) for l in range(num_layers)]
    grid = Topology(tp_row=q, tp_col=q)
    return Schedule(tuple(tuple(actions) for _ in range(q * q)), name="tensor2d", num_stages=num_layers,
                    num_microbatches=1, meta=ScheduleMeta(q=q, row_groups=grid.groups("tp_col"),
                                                          col_groups=grid.groups("tp_row")))
