"""How far a search has got, and what it keeps when it is interrupted.

The planner works in phases (projecting every candidate, simulating the
fastest, the per-layer search); each is a list of items done one at a time
through :meth:`SearchProgress.run`, which reports ``(phase, done, total)``
after each item to a callback (a terminal bar, :func:`terminal_bar`; the plan
explorer's progress widget) and turns an interruption (Ctrl-C in a terminal,
"interrupt the kernel" in a notebook: both a ``KeyboardInterrupt``) into the
end of the search: the phase stops where it is, later phases are skipped, and
the planner ranks what it has, saying so in its notes.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Sequence, TextIO, TypeVar

__all__ = ["Progress", "SearchProgress", "terminal_bar"]

Progress = Callable[[str, int, int], None]  # (phase, items done, items in the phase)
_T = TypeVar("_T")


class SearchProgress:
    """Runs a search's phases item by item, reporting each, and remembers an interruption."""

    def __init__(self, report: Progress | None = None) -> None:
        if report is not None and not callable(report):
            raise ValueError(f"progress must be a function of (phase, done, total) or None, got {report!r}")
        self.report = report
        self.interrupted: str | None = None  # where the search stopped, when it was interrupted

    def run(self, phase: str, items: Sequence[_T], work: Callable[[_T], object]) -> None:
        """``work(item)`` for each item, reporting after each; an interruption stops this phase and the later
        ones (nothing is run after it)."""
        if self.interrupted is not None:
            return
        total, done = len(items), 0
        try:
            self._tell(phase, 0, total)
            for item in items:
                work(item)
                done += 1
                self._tell(phase, done, total)
        except KeyboardInterrupt:
            self.interrupted = f"{phase} stopped after {done} of {total}"

    def _tell(self, phase: str, done: int, total: int) -> None:
        if self.report is not None:
            self.report(phase, done, total)


def terminal_bar(stream: TextIO | None = None, width: int = 30, every_s: float = 0.1) -> Progress:
    """A progress bar redrawn in place on ``stream`` (standard error), at most every ``every_s`` seconds and at
    the end of each phase; the line is cleared when a phase ends, so the answer prints on a clean line."""
    out = stream if stream is not None else sys.stderr
    last = [0.0]

    def draw(phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        finished = done >= total
        if not finished and now - last[0] < every_s:
            return
        last[0] = now
        filled = width * done // max(total, 1)
        line = f"{phase:<18} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        out.write("\r" + (" " * len(line) + "\r" if finished else line))
        out.flush()

    return draw
