"""Where a run executes: one protocol, four places (this machine, several nodes, Slurm, nowhere).

The :class:`~workbench.jobs.job.Job` handle is the same whatever ran the job;
a backend only knows how to check a spec against its place, start the
processes (or submit the script), tell whether they still run, and stop
them. Everything else (status from events, logs, metrics, the monitor) comes
from the run directory and is shared.
"""

from __future__ import annotations

from .base import Backend, ProcessState, Started

__all__ = ["Backend", "ProcessState", "Started", "get_backend", "BACKENDS"]

BACKENDS = ("local", "multinode", "slurm", "dryrun")


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
