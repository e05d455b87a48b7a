"""Write (and read back) a rank's events in the run directory.

Each rank appends JSON lines to ``events/rank{r}.jsonl`` in the schema of
:mod:`workbench.core.rundir` (start, step, stage, heartbeat, checkpoint,
end, error); the notebook tails these files while the job runs. Lines are
flushed as they are written so a crash loses nothing already reported.
Stage events are the interpreter's measured :class:`Event` values, buffered
per step and written in one go, with the ``t0`` (unix seconds) their
millisecond times count from, so ranks can be put on one clock.

:func:`load_measured_timeline` turns the stage lines of all ranks back into
one :class:`~workbench.core.timeline.Timeline` on a shared clock, and
:func:`check_events_follow_schedule` checks that the recorded actions are
the schedule's, in each rank's order.
"""

from __future__ import annotations

import json
import threading
import traceback
from pathlib import Path
from typing import Any, Iterable

from ..core.ir import Schedule
from ..core.rundir import (events_path, load_measured_timeline, make_event, parse_event_line,  # noqa: F401
                           read_events)  # (load_measured_timeline and read_events are re-exported)
from ..core.timeline import Event, Timeline

__all__ = ["EventWriter", "read_events", "load_measured_timeline", "check_events_follow_schedule"]


class EventWriter:
    """Appends one rank's events; thread-safe (a heartbeat thread shares it)."""

    def __init__(self, run_dir: str | Path, rank: int) -> None:
        self.rank = rank
        path = events_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        # earlier attempts of this rank in the same run directory (torchrun restarts, a requeued Slurm job)
        self.previous_starts = _count_starts(path)
        self._file = path.open("a", buffering=1)
        self._lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None
        self._stop = threading.Event()
        self.step = 0

    def write(self, kind: str, **fields: Any) -> None:
        line = json.dumps(make_event(kind, self.rank, **fields), default=str)
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")

    def stage_events(self, events: Iterable[Event], t0: float) -> None:
        lines = [json.dumps(make_event("stage", self.rank, t0=t0, **_without_rank(e.to_dict()))) for e in events]
        if lines:
            with self._lock:
                self._file.write("\n".join(lines) + "\n")

    def error(self, exc: BaseException) -> None:
        self.write("error", message=str(exc) or type(exc).__name__, exc_type=type(exc).__name__,
                   traceback="".join(traceback.format_exception(exc)), step=self.step)

    def start_heartbeat(self, interval_s: float) -> None:
        def beat() -> None:
            while not self._stop.wait(interval_s):
                self.write("heartbeat", step=self.step)

        self._heartbeat = threading.Thread(target=beat, name=f"heartbeat-rank{self.rank}", daemon=True)
        self._heartbeat.start()

    def close(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=1.0)
        with self._lock:
            self._file.close()


def _count_starts(path: Path) -> int:
    """The start events in a rank's file (a line cut short by a killed process is skipped)."""
    if not path.is_file():
        return 0
    count = 0
    with path.open() as lines:
        for line in lines:
            if '"start"' in line:
                try:
                    count += parse_event_line(line)["kind"] == "start"
                except ValueError:
                    continue
    return count


def _without_rank(fields: dict[str, Any]) -> dict[str, Any]:
    fields.pop("rank", None)
    return fields


def check_events_follow_schedule(timeline: Timeline, schedule: Schedule, iteration: int) -> None:
    """Raise ValueError unless each rank recorded exactly its schedule's actions, in order."""
    for rank in range(schedule.num_ranks):
        recorded = sorted((e for e in timeline.events if e.rank == rank and e.iteration == iteration),
                          key=lambda e: (e.start, e.end))
        got = [(e.stage, e.op, e.microbatch, e.peer) for e in recorded]
        want = [(a.stage, a.op.value, a.microbatch, a.peer) for a in schedule.actions(rank)]
        if got != want:
            first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            raise ValueError(f"rank {rank} iteration {iteration}: recorded actions differ from the schedule at "
                             f"position {first}: recorded {got[first:first + 3]}, scheduled {want[first:first + 3]} "
                             f"({len(got)} recorded, {len(want)} scheduled)")
