"""The schedule intermediate representation: what every rank does, in order.

A pipeline schedule is the one value the whole workbench passes around: the
validator checks it, the simulator times it, the timeline figure draws it and
the runtime interpreter executes it. Keeping it as plain data (per-rank lists
of small immutable :class:`Action` values) is what lets one generator serve
all four consumers, so no schedule is ever written twice.

Every action has a short text form that round-trips::

    1F3            stage 1, forward of micro-batch 3
    0B2            stage 0, full backward (input and weight grads) of micro-batch 2
    0I2 / 2W0      backward for the input only / weight gradient only
    0SEND_F3>1     stage 0 sends micro-batch 3's activation to rank 1
    1RECV_F3<0     stage 1 receives it from rank 0
    1SEND_B3>0     gradient sends and receives work the same way
    0AR            stage 0 gradient all-reduce (``0ARb2``: bucket 2 only)
    0STEP          stage 0 optimizer step
    0STASH4 / 0RESTORE4   stash / restore the weight version used by micro-batch 4

Optional modifiers follow the micro-batch, always in this order:
``c<chunk>`` (virtual stage chunk on this rank), ``i<iteration>``,
``v<version>`` (weight version), ``b<bucket>``, then ``><peer>`` or ``<<peer>``.
``None`` in a rank's list is an idle slot, drawn as ``.`` in grids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any, Iterable, Iterator, Sequence

from .fields import (Rule, at_least, boolean, check, from_dict, integer, optional, reject_unknown, spec, string, tuple_of,
                     validate)

__all__ = ["Op", "Action", "Schedule", "ScheduleMeta", "parse_action", "COMPUTE_OPS", "COMM_OPS"]


class Op(str, Enum):
    """The kinds of action a rank can execute."""

    FORWARD = "F"
    BACKWARD = "B"  # full backward: input and weight gradients
    BACKWARD_INPUT = "I"  # input gradient only (zero-bubble split)
    BACKWARD_WEIGHT = "W"  # weight gradient only
    SEND_F = "SEND_F"  # send an activation downstream
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"  # send an activation gradient upstream
    RECV_B = "RECV_B"
    ALL_REDUCE = "AR"  # gradient all-reduce across the data-parallel group
    STEP = "STEP"  # optimizer step (applies the weight update)
    STASH = "STASH"  # keep the current weight version for a micro-batch
    RESTORE = "RESTORE"  # swap a stashed weight version back in

    def __str__(self) -> str:
        return self.value


COMPUTE_OPS = frozenset({Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT})
COMM_OPS = frozenset({Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B, Op.ALL_REDUCE})
_SENDS = frozenset({Op.SEND_F, Op.SEND_B})
_RECVS = frozenset({Op.RECV_F, Op.RECV_B})
_NEEDS_MICROBATCH = COMPUTE_OPS | _SENDS | _RECVS | {Op.STASH, Op.RESTORE}
_OPS_BY_TEXT = {op.value: op for op in Op}
_VALID_OPS = ", ".join(op.value for op in Op)

_ACTION_RE = re.compile(
    r"^(?P<stage>\d+)"
    r"(?P<op>[A-Z][A-Z_]*?)"
    r"(?P<mb>\d+)?"
    r"(?:c(?P<chunk>\d+))?"
    r"(?:i(?P<iteration>\d+))?"
    r"(?:v(?P<version>\d+))?"
    r"(?:b(?P<bucket>\d+))?"
    r"(?:(?P<dir>[<>])(?P<peer>\d+))?$"
)


_INDEX = integer(expected="an int >= 0").then(at_least(0))  # a stage, micro-batch, rank ...: the type, then the bound
_MAYBE_INDEX = optional(_INDEX)
_COUNT = integer(expected="an int >= 1").then(at_least(1))


@dataclass(frozen=True, slots=True)
class Action:
    """One instruction for one rank.

    ``stage`` is the (virtual) pipeline stage the action belongs to;
    ``microbatch`` is the micro-batch index within ``iteration``;
    ``peer`` is the other rank of a send or receive.
    """

    stage: int
    op: Op
    microbatch: int | None = None
    chunk: int | None = None
    iteration: int | None = None
    version: int | None = None
    bucket: int | None = None
    peer: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.op, Op):
            try:
                object.__setattr__(self, "op", Op(self.op))
            except ValueError:
                raise ValueError(f"op must be one of {_VALID_OPS}; got {self.op!r}") from None
        check("stage", self.stage, _INDEX)
        for name in ("microbatch", "chunk", "iteration", "version", "bucket", "peer"):
            check(name, getattr(self, name), _MAYBE_INDEX)
        if self.op in _NEEDS_MICROBATCH and self.microbatch is None:
            raise ValueError(f"op {self.op.value} needs a microbatch index (stage {self.stage})")
        if self.op in _SENDS | _RECVS and self.peer is None:
            raise ValueError(f"op {self.op.value} needs a peer rank (stage {self.stage}, microbatch {self.microbatch})")
        if self.peer is not None and self.op not in _SENDS | _RECVS:
            raise ValueError(f"peer is only meaningful for send/recv ops, not {self.op.value}")

    # -- text form -------------------------------------------------------------------
    def __str__(self) -> str:
        parts = [str(self.stage), self.op.value]
        if self.microbatch is not None:
            parts.append(str(self.microbatch))
        for prefix, value in (("c", self.chunk), ("i", self.iteration), ("v", self.version), ("b", self.bucket)):
            if value is not None:
                parts.append(f"{prefix}{value}")
        if self.peer is not None:
            parts.append((">" if self.op in _SENDS else "<") + str(self.peer))
        return "".join(parts)

    @classmethod
    def parse(cls, text: str) -> "Action":
        return parse_action(text)

    # -- classification ----------------------------------------------------------------
    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_OPS

    @property
    def is_send(self) -> bool:
        return self.op in _SENDS

    @property
    def is_recv(self) -> bool:
        return self.op in _RECVS

    @property
    def is_comm(self) -> bool:
        return self.op in COMM_OPS

    def with_(self, **changes: Any) -> "Action":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def unchecked(cls, stage: int, op: Op, microbatch: int | None = None, chunk: int | None = None,
                  iteration: int | None = None, version: int | None = None, bucket: int | None = None,
                  peer: int | None = None) -> "Action":
        """An action made without ``__init__``'s checks, for code whose fields are valid by construction
        (generators and passes writing tens of thousands of actions); ``op`` must be an :class:`Op`."""
        a = object.__new__(cls)
        put = object.__setattr__
        put(a, "stage", stage)
        put(a, "op", op)
        put(a, "microbatch", microbatch)
        put(a, "chunk", chunk)
        put(a, "iteration", iteration)
        put(a, "version", version)
        put(a, "bucket", bucket)
        put(a, "peer", peer)
        return a

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stage": self.stage, "op": self.op.value}
        for name in ("microbatch", "chunk", "iteration", "version", "bucket", "peer"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Action":
        return from_dict(cls, data, "Action.", owner="schedule")


def parse_action(text: str) -> Action:
    """Parse the short text form (``"1F3"``, ``"0SEND_F3>1"``, ``"0ARb2"`` ...)."""
    if not isinstance(text, str):
        raise ValueError(f"action text must be a str, got {type(text).__name__}")
    m = _ACTION_RE.match(text.strip())
    if not m:
        raise ValueError(
            f"malformed action {text!r}: expected <stage><op>[microbatch][c<chunk>][i<iter>][v<version>][b<bucket>]"
            f"[>peer|<peer], e.g. '1F3', '0SEND_F3>1', '0AR'"
        )
    op_text = m["op"]
    if op_text not in _OPS_BY_TEXT:
        raise ValueError(f"unknown op {op_text!r} in action {text!r}; valid ops: {_VALID_OPS}")
    op = _OPS_BY_TEXT[op_text]
    if m["dir"] is not None:
        expected = ">" if op in _SENDS else "<" if op in _RECVS else None
        if expected is None or m["dir"] != expected:
            raise ValueError(f"action {text!r}: '{m['dir']}' peer marker does not fit op {op.value}")

    def num(key: str) -> int | None:
        return int(m[key]) if m[key] is not None else None

    return Action(
        stage=int(m["stage"]),
        op=op,
        microbatch=num("mb"),
        chunk=num("chunk"),
        iteration=num("iteration"),
        version=num("version"),
        bucket=num("bucket"),
        peer=num("peer"),
    )


Slot = Action | None


def _groups(name: str, value: Any) -> tuple[tuple[int, ...], ...]:
    """Rank groups as a tuple of tuples of ranks (lists from JSON are accepted)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in value):
        raise ValueError(f"meta.{name} must be a list of rank lists, got {value!r}")
    out = tuple(tuple(g) for g in value)
    for g in out:
        for r in g:
            check(f"meta.{name}", r, _INDEX)
    return out


@dataclass(frozen=True)
class ScheduleMeta:
    """What a generator and the passes record about a schedule, for the passes, validator and simulator.

    Layout: ``stage_to_rank`` (per pipeline, the rank of every virtual stage),
    ``replicas`` (model copies), ``chunks`` (virtual stages per rank),
    ``dp_groups`` (ranks that all-reduce one stage's gradients), ``row_groups``
    / ``col_groups`` and ``q`` (a 2D tensor grid; 0 without one). Work:
    ``num_iterations`` from ``first_iteration``, GroPipe's ``inner`` schedule,
    gradient ``num_buckets`` and ``backward_buckets`` (the backward is split
    into that many pieces; 0 when it is not), ``delay`` of the update and the
    iteration whose step is still ``pending_step_iteration`` (None: none), the
    asynchronous pipeline's ``weight_stashing``, ``inflight`` per stage,
    ``mode`` and ``vertical_sync``. ``grad_sync`` and ``lowered`` record the
    passes that ran, in order.
    """

    stage_to_rank: tuple[tuple[int, ...], ...] = ()
    replicas: int = spec(1, _COUNT)
    chunks: int = spec(1, _COUNT)
    dp_groups: tuple[tuple[int, ...], ...] = ()
    row_groups: tuple[tuple[int, ...], ...] = ()
    col_groups: tuple[tuple[int, ...], ...] = ()
    q: int = spec(0, _INDEX)
    num_iterations: int = spec(1, _COUNT)
    first_iteration: int = spec(0, _INDEX)
    inner: str = spec("", string())
    num_buckets: int = spec(1, _COUNT)
    backward_buckets: int = spec(0, _INDEX)
    delay: int = spec(0, Rule(lambda v: not isinstance(v, bool) and v in (0, 1), "0 or 1"))
    pending_step_iteration: int | None = spec(None, _MAYBE_INDEX)
    grad_sync: bool = spec(False, boolean())
    weight_stashing: bool = spec(False, boolean())
    inflight: tuple[int, ...] = spec((), tuple_of(expected="a list"))
    mode: str = spec("", string())
    vertical_sync: bool = spec(False, boolean())
    lowered: tuple[str, ...] = spec((), tuple_of(expected="a list"))

    def __post_init__(self) -> None:
        for name in ("stage_to_rank", "dp_groups", "row_groups", "col_groups"):
            object.__setattr__(self, name, _groups(name, getattr(self, name)))
        validate(self, "meta.")
        for n in self.inflight:
            check("meta.inflight", n, _INDEX)
        for pass_name in self.lowered:
            if not isinstance(pass_name, str) or not pass_name:
                raise ValueError(f"meta.lowered must list pass names, got {pass_name!r} in {list(self.lowered)}")

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from their defaults, JSON-ready (lists, not tuples)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = [list(v) if isinstance(v, tuple) else v for v in value] \
                    if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: "dict[str, Any] | ScheduleMeta | None") -> "ScheduleMeta":
        if isinstance(data, ScheduleMeta):
            return data
        data = dict(data or {})
        reject_unknown(data, [f.name for f in fields(cls)], error=lambda name, _, valid: ValueError(
            f"schedule meta field {name!r} {valid}"), unknown="is unknown; valid fields are")
        return cls(**data)


@dataclass(frozen=True)
class Schedule:
    """Per-rank action lists; ``None`` marks an idle time slot.

    ``name`` says which generator built it, ``num_stages`` and
    ``num_microbatches`` its size, ``meta`` (:class:`ScheduleMeta`, or a dict
    of its fields) what the generator and passes recorded about it.
    """

    ranks: tuple[tuple[Slot, ...], ...]
    name: str = "custom"
    num_stages: int | None = None
    num_microbatches: int | None = None
    meta: ScheduleMeta = field(default_factory=ScheduleMeta)

    def __post_init__(self) -> None:
        object.__setattr__(self, "meta", ScheduleMeta.from_dict(self.meta))
        ranks = tuple(tuple(r) for r in self.ranks)
        if not ranks:
            raise ValueError("ranks must hold at least one rank's action list, got none")
        for r, slots in enumerate(ranks):
            for i, slot in enumerate(slots):
                if slot is not None and not isinstance(slot, Action):
                    raise ValueError(f"ranks[{r}][{i}] must be an Action or None, got {type(slot).__name__}")
        object.__setattr__(self, "ranks", ranks)
        check("num_stages", self.num_stages, _MAYBE_INDEX)
        check("num_microbatches", self.num_microbatches, _MAYBE_INDEX)
        if self.num_stages == 0:
            raise ValueError("num_stages must be >= 1, got 0")

    # -- access -----------------------------------------------------------------------
    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    def __getitem__(self, rank: int) -> tuple[Slot, ...]:
        if not 0 <= rank < self.num_ranks:
            raise ValueError(f"rank must be in [0, {self.num_ranks - 1}], got {rank}")
        return self.ranks[rank]

    def __iter__(self) -> Iterator[tuple[Slot, ...]]:
        return iter(self.ranks)

    def actions(self, rank: int) -> list[Action]:
        """The rank's actions in order, idle slots dropped."""
        return [a for a in self[rank] if a is not None]

    def stages_of(self, rank: int) -> list[int]:
        """Stages this rank executes, in first-seen order."""
        seen: dict[int, None] = {}
        for a in self.actions(rank):
            seen.setdefault(a.stage, None)
        return list(seen)

    def compact(self) -> "Schedule":
        """The same schedule with idle slots removed (order per rank kept)."""
        return replace(self, ranks=tuple(tuple(self.actions(r)) for r in range(self.num_ranks)))

    # -- text -------------------------------------------------------------------------
    def to_grid(self, *, max_steps: int | None = None) -> str:
        """Render a step x rank grid, one row per step, one column per rank."""
        steps = max((len(r) for r in self.ranks), default=0)
        if max_steps is not None:
            steps = min(steps, max_steps)
        cells = [[str(r[s]) if s < len(r) and r[s] is not None else "." for r in self.ranks] for s in range(steps)]
        width = max([len(c) for row in cells for c in row] + [len(f"rank{self.num_ranks - 1}")])
        step_w = max(4, len(str(steps)))
        header = " " * step_w + " | " + " ".join(f"rank{r}".ljust(width) for r in range(self.num_ranks))
        lines = [header.rstrip(), "-" * len(header)]
        for s, row in enumerate(cells):
            lines.append((str(s).rjust(step_w) + " | " + " ".join(c.ljust(width) for c in row)).rstrip())
        return "\n".join(lines)

    @classmethod
    def from_text(cls, rank_lines: Sequence[str] | str, **kwargs: Any) -> "Schedule":
        """Build from one whitespace-separated line of actions per rank (``.`` = idle)."""
        if isinstance(rank_lines, str):
            rank_lines = [line for line in rank_lines.strip().splitlines() if line.strip()]
        ranks = []
        for line in rank_lines:
            ranks.append(tuple(None if tok == "." else parse_action(tok) for tok in line.split()))
        return cls(ranks=tuple(ranks), **kwargs)

    def to_text(self) -> list[str]:
        """One line per rank, the inverse of :meth:`from_text`."""
        return [" ".join("." if a is None else str(a) for a in r) for r in self.ranks]

    # -- json -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "name": self.name,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "meta": self.meta.to_dict(),
            "ranks": self.to_text(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Schedule":
        if data.get("version", 1) != 1:
            raise ValueError(f"unsupported schedule version {data.get('version')!r}; this workbench reads version 1")
        if "ranks" not in data:
            raise ValueError("schedule JSON needs a 'ranks' list (one action line per rank)")
        return cls.from_text(
            data["ranks"],
            name=data.get("name", "custom"),
            num_stages=data.get("num_stages"),
            num_microbatches=data.get("num_microbatches"),
            meta=ScheduleMeta.from_dict(data.get("meta")),
        )

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        return cls.from_dict(json.loads(text))


def iter_actions(schedule: Schedule) -> Iterable[tuple[int, int, Action]]:
    """Yield ``(rank, slot, action)`` for every non-idle slot."""
    for r, slots in enumerate(schedule.ranks):
        for i, a in enumerate(slots):
            if a is not None:
                yield r, i, a
