"""Follow the per-rank JSONL event files of a run while they are being written.

Ranks append lines to ``events/rank{r}.jsonl`` while the notebook reads them,
so a read can end in the middle of a line, a file can appear late, and a
crash can leave a torn or garbled line. :class:`EventTailer` keeps one byte
offset per file and reads only new bytes; it consumes complete lines only
(a trailing partial line is held back and re-read on the next poll, so
nothing is lost and nothing is parsed twice); a line that does not parse is
skipped and reported in :attr:`EventTailer.corrupt` (file, byte offset,
reason) without stopping the lines after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.rundir import events_dir, parse_event_line

__all__ = ["EventTailer", "CorruptLine", "TextTailer"]

_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")
_MAX_READ = 8 << 20


@dataclass(frozen=True)
class CorruptLine:
    """A line that was skipped: where it starts and why it failed."""

    path: str
    offset: int
    reason: str


class EventTailer:
    """Incremental reader of every ``rank*.jsonl`` under a run's ``events/`` folder."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.offsets: dict[int, int] = {}
        self.corrupt: list[CorruptLine] = []

    def files(self) -> dict[int, Path]:
        folder = events_dir(self.run_dir)
        if not folder.is_dir():
            return {}
        out = {}
        for path in folder.iterdir():
            match = _RANK_FILE.match(path.name)
            if match:
                out[int(match.group(1))] = path
        return dict(sorted(out.items()))

    def poll(self) -> list[dict[str, Any]]:
        """New complete events since the last poll, in file order per rank (ranks in order)."""
        events: list[dict[str, Any]] = []
        for rank, path in self.files().items():
            events.extend(self._read(rank, path))
        return events

    def _read(self, rank: int, path: Path) -> list[dict[str, Any]]:
        offset = self.offsets.get(rank, 0)
        complete = _complete_lines(path, offset)
        if not complete:
            return []
        self.offsets[rank] = offset + len(complete)
        events = []
        position = offset
        for raw in complete.split(b"\n")[:-1]:
            line_start = position
            position += len(raw) + 1
            if not raw.strip():
                continue
            try:
                events.append(parse_event_line(raw.decode("utf-8")))
            except (UnicodeDecodeError, ValueError) as exc:
                self.corrupt.append(CorruptLine(str(path), line_start, str(exc)))
        return events


class TextTailer:
    """Incremental reader of one text log: new complete lines since the last call."""

    def __init__(self, path: str | Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def poll(self) -> list[str]:
        complete = _complete_lines(self.path, self.offset)
        if not complete:
            return []
        self.offset += len(complete)
        return complete[:-1].decode("utf-8", errors="replace").split("\n")


def _complete_lines(path: Path, offset: int) -> bytes:
    """The complete (newline-terminated) lines after ``offset``; a partial last line is held back."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read(_MAX_READ)
    except FileNotFoundError:
        return b""
    return chunk[: chunk.rfind(b"\n") + 1]
