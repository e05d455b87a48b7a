"""What every backend speaks: the protocol and the two values it returns.

These live below the backends (not in the package ``__init__``, which picks
a backend by name and so imports them all), so a backend and the package
that dispatches to it never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..spec import LaunchSpec

__all__ = ["Backend", "ProcessState", "Started"]


@dataclass
class ProcessState:
    """What the place says about the processes: still running, exit codes, scheduler state."""

    running: bool | None
    exit_codes: dict[str, int] | None = None
    scheduler_state: str | None = None
    detail: str = ""


@dataclass
class Started:
    """What ``start`` produced: the facts for ``launch.json`` and any child process objects."""

    launch: dict[str, Any]
    commands: list[str]
    processes: list[Any] = field(default_factory=list)


class Backend(Protocol):
    name: str

    def check(self, spec: LaunchSpec) -> None: ...

    def render(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> list[str]: ...

    def start(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> Started: ...

    def poll(self, launch: dict[str, Any], processes: list[Any], run_dir: Path) -> ProcessState: ...

    def cancel(self, launch: dict[str, Any], grace_s: float) -> None: ...
