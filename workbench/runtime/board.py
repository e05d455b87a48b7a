"""TensorBoard scalars of a run, for ``tensorboard --logdir runs`` while it trains.

Rank 0 writes, with ``torch.utils.tensorboard.SummaryWriter``, into
``RUN_DIR/tensorboard/``: per step ``train/loss``, ``train/samples_per_s``
and ``train/step_ms``; per evaluation ``eval/val_loss`` and
``eval/accuracy`` and/or ``eval/perplexity``; ``global_step`` is the step
(steps done). It flushes after every evaluation and at most every
``flush_s`` seconds of steps, so a running TensorBoard sees the run as it
goes; the run directory's events stay the record the workbench itself reads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["ScalarBoard", "TENSORBOARD_DIR"]

TENSORBOARD_DIR = "tensorboard"


class ScalarBoard:
    """One run's TensorBoard writer (rank 0 only)."""

    def __init__(self, run_dir: str | Path, flush_s: float = 2.0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = Path(run_dir) / TENSORBOARD_DIR
        self._writer = SummaryWriter(log_dir=str(self.path), flush_secs=max(1, int(flush_s)))
        self._flush_s = flush_s
        self._flushed = time.monotonic()

    def step(self, step: int, loss: float, samples_per_s: float, step_ms: float) -> None:
        for name, value in (("train/loss", loss), ("train/samples_per_s", samples_per_s), ("train/step_ms", step_ms)):
            self._writer.add_scalar(name, value, global_step=step)
        if time.monotonic() - self._flushed >= self._flush_s:
            self.flush()

    def evaluation(self, step: int, metrics: dict[str, Any]) -> None:
        for name in ("val_loss", "accuracy", "perplexity"):
            if metrics.get(name) is not None:
                self._writer.add_scalar(f"eval/{name}", metrics[name], global_step=step)
        self.flush()

    def flush(self) -> None:
        self._writer.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        self._writer.close()
