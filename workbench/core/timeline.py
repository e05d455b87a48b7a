"""Timed events: what ran where and when, simulated or measured.

The simulator predicts a list of :class:`Event` and the runtime records the
same kind of list from real processes, so one figure draws either and the
two overlay (the workbench's predicted-vs-measured view). Times are in
milliseconds from the timeline's origin (the start of the first iteration
shown); measured events are shifted there when they are loaded.

``Timeline.to_chrome_trace()`` produces the Chrome trace-event JSON that
Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open: one process per
source, one thread per rank.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from .fields import check, check_int, check_number, from_dict, integer, optional
from .ir import Op

__all__ = ["Event", "Timeline", "SOURCES"]

SOURCES = ("simulated", "measured")
_VALID_OPS = {op.value for op in Op}


@dataclass(frozen=True, slots=True)
class Event:
    """One executed (or predicted) action on one rank, ``start``/``end`` in ms."""

    rank: int
    stage: int
    op: str
    start: float
    end: float
    microbatch: int | None = None
    iteration: int = 0
    version: int | None = None
    source: str = "simulated"
    chunk: int | None = None
    peer: int | None = None
    nbytes: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.op, Op):
            object.__setattr__(self, "op", self.op.value)
        if self.op not in _VALID_OPS:
            raise ValueError(f"Event.op must be one of {sorted(_VALID_OPS)}, got {self.op!r}")
        for name in ("rank", "stage", "iteration"):
            v = getattr(self, name)
            check_int(f"Event.{name}", v, 0)
        for name in ("microbatch", "version", "chunk", "peer", "nbytes"):
            v = getattr(self, name)
            check(f"Event.{name}", v, optional(integer(0)))
        for name in ("start", "end"):
            v = getattr(self, name)
            check_number(f"Event.{name}", v, finite=True, expected="a finite number of ms")
        if self.end < self.start:
            raise ValueError(f"Event.end ({self.end}) is before start ({self.start}) on rank {self.rank} op {self.op}")
        if self.source not in SOURCES:
            raise ValueError(f"Event.source must be one of {SOURCES}, got {self.source!r}")

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        """Short text like the action form, e.g. ``1F3`` or ``0B2v1``."""
        text = f"{self.stage}{self.op}"
        if self.microbatch is not None:
            text += str(self.microbatch)
        if self.version is not None:
            text += f"v{self.version}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Event":
        return from_dict(cls, data, "Event.", owner="timeline")


@dataclass(frozen=True)
class Timeline:
    """An ordered collection of events plus free-form metadata."""

    events: tuple[Event, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        evs = tuple(Event.from_dict(e) if isinstance(e, dict) else e for e in self.events)
        for i, e in enumerate(evs):
            if not isinstance(e, Event):
                raise ValueError(f"Timeline.events[{i}] must be an Event, got {type(e).__name__}")
        object.__setattr__(self, "events", tuple(sorted(evs, key=lambda e: (e.start, e.rank, e.end))))

    @classmethod
    def from_sorted(cls, events: tuple[Event, ...], meta: dict[str, Any] | None = None) -> "Timeline":
        """A timeline of events that are valid and already in a timeline's order (by start, rank and end,
        ties as they came), taken as they are: for producers that build them so (the simulator)."""
        timeline = object.__new__(cls)
        object.__setattr__(timeline, "events", events)
        object.__setattr__(timeline, "meta", dict(meta or {}))
        return timeline

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    # -- views ------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        return sorted({e.rank for e in self.events})

    @property
    def start(self) -> float:
        return min((e.start for e in self.events), default=0.0)

    @property
    def end(self) -> float:
        return max((e.end for e in self.events), default=0.0)

    @property
    def makespan(self) -> float:
        return self.end - self.start

    def on_rank(self, rank: int) -> list[Event]:
        return [e for e in self.events if e.rank == rank]

    def filter(self, *, rank: int | None = None, iteration: int | None = None, source: str | None = None,
               ops: Iterable[str] | None = None) -> "Timeline":
        opset = {o.value if isinstance(o, Op) else o for o in ops} if ops is not None else None
        keep = [
            e for e in self.events
            if (rank is None or e.rank == rank)
            and (iteration is None or e.iteration == iteration)
            and (source is None or e.source == source)
            and (opset is None or e.op in opset)
        ]
        return Timeline(tuple(keep), dict(self.meta))

    def shifted(self, offset_ms: float) -> "Timeline":
        """All events moved by ``offset_ms`` (e.g. to start at 0)."""
        return Timeline(tuple(replace(e, start=e.start + offset_ms, end=e.end + offset_ms) for e in self.events),
                        dict(self.meta))

    def busy_ms(self, rank: int, *, compute_only: bool = True) -> float:
        """Time the rank spends in (compute) events, overlaps merged."""
        from .ir import COMPUTE_OPS

        compute = {o.value for o in COMPUTE_OPS}
        spans = sorted((e.start, e.end) for e in self.on_rank(rank) if not compute_only or e.op in compute)
        total, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            total += cur_e - cur_s
        return total

    def bubble_fraction(self, rank: int) -> float:
        """Idle share of the makespan on ``rank``: 1 - compute busy time / makespan."""
        span = self.makespan
        return 0.0 if span <= 0 else 1.0 - self.busy_ms(rank) / span

    # -- io ---------------------------------------------------------------------------
    def to_dicts(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.events]

    @classmethod
    def from_dicts(cls, rows: Sequence[dict[str, Any]], meta: dict[str, Any] | None = None) -> "Timeline":
        return cls(tuple(Event.from_dict(r) for r in rows), dict(meta or {}))

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps({"version": 1, "meta": self.meta, "events": self.to_dicts()}, **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "Timeline":
        data = json.loads(text)
        if data.get("version") != 1:
            raise ValueError(f"unsupported timeline version {data.get('version')!r}; expected 1")
        return cls.from_dicts(data.get("events", []), data.get("meta"))

    @classmethod
    def merge(cls, timelines: Iterable["Timeline"]) -> "Timeline":
        events: list[Event] = []
        meta: dict[str, Any] = {}
        for t in timelines:
            events.extend(t.events)
            meta.update(t.meta)
        return cls(tuple(events), meta)

    def to_chrome_trace(self) -> dict[str, Any]:
        """Chrome trace-event JSON (open in Perfetto): complete ("X") events in us."""
        trace: list[dict[str, Any]] = []
        pids = {src: i + 1 for i, src in enumerate(SOURCES)}
        for src in sorted({e.source for e in self.events}):
            trace.append({"ph": "M", "name": "process_name", "pid": pids[src], "args": {"name": src}})
            for r in sorted({e.rank for e in self.events if e.source == src}):
                trace.append({"ph": "M", "name": "thread_name", "pid": pids[src], "tid": r, "args": {"name": f"rank {r}"}})
        for e in self.events:
            args = {k: v for k, v in e.to_dict().items() if k not in ("start", "end", "rank", "source")}
            trace.append({
                "name": e.label, "cat": e.op, "ph": "X", "pid": pids[e.source], "tid": e.rank,
                "ts": round(e.start * 1e3, 3), "dur": round(e.duration * 1e3, 3), "args": args,
            })
        return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": {k: str(v) for k, v in self.meta.items()}}

    def save_chrome_trace(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_chrome_trace()))
        return path
