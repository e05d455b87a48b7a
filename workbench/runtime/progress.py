"""Progress lines for people: rank 0 prints step, loss and throughput every few steps.

The run directory's events carry every number, but a console that stays
silent for a whole run looks like a hung job, and the monitor's log box
shows nothing. So rank 0 prints one short line every few steps (and for the
first and the last step) to its standard output, which torchrun tees into
the run's console log with a ``[rank0]:`` prefix. Errors and warnings are
not filtered: every rank writes them to its standard error, which lands in
the same log. The interval aims at about 20 lines a run, never more than one
line every 10 steps; ``WORKBENCH_LOG_EVERY`` sets it (``0``: no progress
lines).
"""

from __future__ import annotations

import math
import os
import sys
from typing import TextIO

__all__ = ["ProgressLog", "log_interval", "LOG_EVERY_ENV"]

LOG_EVERY_ENV = "WORKBENCH_LOG_EVERY"
_LINES_PER_RUN = 20
_MAX_INTERVAL = 10


def log_interval(steps: int, environ: dict[str, str] | None = None) -> int:
    """Steps between two progress lines for a run of ``steps`` steps (0: none)."""
    value = (os.environ if environ is None else environ).get(LOG_EVERY_ENV, "").strip()
    if value:
        if not value.isdigit():
            raise ValueError(f"{LOG_EVERY_ENV} must be a whole number of steps (0: no progress lines), got {value!r}")
        return int(value)
    return max(1, min(_MAX_INTERVAL, math.ceil(steps / _LINES_PER_RUN)))


class ProgressLog:
    """Prints rank 0's progress lines; the other ranks stay quiet (their errors still reach the log)."""

    def __init__(self, rank: int, steps: int, *, every: int | None = None, stream: TextIO | None = None):
        self.rank = rank
        self.steps = steps
        self.every = log_interval(steps) if every is None else every
        self.stream = stream

    def wants(self, step: int) -> bool:
        """Whether the line of ``step`` (counted from 1 once it is done) is printed."""
        if self.rank != 0 or self.every <= 0:
            return False
        return step == 1 or step == self.steps or step % self.every == 0

    def step(self, step: int, loss: float | None, samples_per_s: float, step_ms: float) -> None:
        if not self.wants(step):
            return
        loss_text = "-" if loss is None or not math.isfinite(loss) else f"{loss:.4f}"
        print(f"step {step}/{self.steps}  loss {loss_text}  {samples_per_s:.1f} samples/s  {step_ms:.1f} ms/step",
              file=self.stream or sys.stdout, flush=True)
