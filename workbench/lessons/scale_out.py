"""Lesson 08, scaling out: whether a Slurm cluster answers here and with how many usable nodes, and the lesson's
spec made into one that Slurm can run on them."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from ..jobs import SlurmOptions

# node states that can take a job now or soon: idle, partly used, fully allocated, finishing one
USABLE_STATES = ("idle", "mix", "alloc", "comp")


def usable_nodes(sinfo_lines: str) -> int:
    """The nodes in usable states in ``sinfo -h -o "%D %t"`` output (a node count and a state per line; a state
    may end in a flag such as ``*`` for not responding)."""
    total = 0
    for line in sinfo_lines.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].rstrip("*~#") in USABLE_STATES:
            total += int(fields[0])
    return total


def slurm_nodes(timeout_s: float = 30) -> tuple[int, str]:
    """How many usable nodes the Slurm cluster that ``sinfo`` reaches has (0 when none answers), and why none
    answered (empty when one did)."""
    if shutil.which("sinfo") is None:
        return 0, "sinfo is not installed"
    answer = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True, timeout=timeout_s)
    if answer.returncode != 0:
        return 0, (answer.stderr.strip().splitlines() or ["no nodes"])[-1]
    nodes = usable_nodes(answer.stdout)
    return nodes, "" if nodes else "no nodes"


def slurm_spec(spec: Any, available: int, *, shared_run_root: str, run_root: str, time: str = "00:10:00") -> Any:
    """``spec`` for Slurm on this cluster's ``available`` nodes: on as many nodes as it asks for when there are
    enough, else on one node with every process; over gloo (CPUs); its run directory on ``shared_run_root``
    when it spans nodes (every node must see it), else on ``run_root``; in the partition Slurm picks."""
    nodes = spec.nnodes if available >= spec.nnodes else 1
    return spec.replace(nnodes=nodes, nproc_per_node=spec.world_size // nodes, dist_backend="gloo",
                        run_root=shared_run_root if nodes > 1 else run_root, slurm=SlurmOptions(time=time))
