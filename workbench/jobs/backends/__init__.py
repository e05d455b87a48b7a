"""Where a run executes: one protocol, four places (this machine, several nodes, Slurm, nowhere).

The :class:`~workbench.jobs.job.Job` handle is the same whatever ran the job;
a backend only knows how to check a spec against its place, start the
processes (or submit the script), tell whether they still run, and stop
them. Everything else (status from events, logs, metrics, the monitor) comes
from the run directory and is shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..spec import LaunchSpec

__all__ = ["Backend", "ProcessState", "Started", "get_backend", "BACKENDS"]

BACKENDS = ("local", "multinode", "slurm", "dryrun")


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


def get_backend(name: str) -> Backend:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend()
    if name == "multinode":
        from .multinode import MultiNodeBackend

        return MultiNodeBackend()
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend()
    if name == "dryrun":
        from .dryrun import DryRunBackend

        return DryRunBackend()
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
