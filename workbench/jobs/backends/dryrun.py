"""Nowhere: prepare the run directory and show exactly what would run, start nothing.

The place that would run the spec is chosen as ``launch`` would: Slurm when
the spec has Slurm options, several nodes when ``nnodes > 1``, this machine
otherwise. The commands (or the sbatch script) are written to
``command.txt`` and returned, after the same checks a real launch makes, so
a dry run is also the cheapest way to validate a spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..spec import LaunchSpec
from .base import Backend, ProcessState, Started
from .local import LocalBackend
from .multinode import MultiNodeBackend
from .slurm import SlurmBackend

__all__ = ["DryRunBackend", "target_backend"]


def target_backend(spec: LaunchSpec) -> Backend:
    """The place that would run ``spec``, built here rather than by name through ``get_backend``, which
    builds this dry run too (asking it would tie the two modules into a circle)."""
    if spec.slurm is not None:
        return SlurmBackend()
    return MultiNodeBackend() if spec.nnodes > 1 else LocalBackend()


class DryRunBackend:
    """Render the commands of the place that would run the spec."""

    name = "dryrun"

    def check(self, spec: LaunchSpec) -> None:
        target_backend(spec).check(spec)

    def render(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> list[str]:
        return target_backend(spec).render(spec, run_dir, run_id)

    def start(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> Started:
        target = target_backend(spec)
        return Started(launch={"target": target.name}, commands=target.render(spec, run_dir, run_id))

    def poll(self, launch: dict[str, Any], processes: list[Any], run_dir: Path) -> ProcessState:
        return ProcessState(running=False, scheduler_state="UNKNOWN", detail="dry run: nothing was started")

    def cancel(self, launch: dict[str, Any], grace_s: float) -> None:
        return None
