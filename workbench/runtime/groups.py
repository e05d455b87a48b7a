"""The one place process groups are created.

Every parallel strategy needs communicators along some axes of its
:class:`~workbench.core.topology.Topology` (the ranks of one pipeline, the
ranks holding the same stage across pipelines, a tensor-parallel row or
column). ``torch.distributed.new_group`` must be called by *every* rank for
*every* group, in the same order, even for groups the rank is not in; doing
that in one function, from the topology's arithmetic, is what keeps the
strategies from deadlocking on group creation. The resulting handles are
passed to strategies as arguments (no module-level singletons).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..core.topology import Topology

__all__ = ["ParallelGroups", "build_groups", "pick_device", "init_distributed"]


def pick_device(device: str = "auto") -> torch.device:
    """``auto`` -> this rank's CUDA device when CUDA is present, else CPU."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        return torch.device("cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available on this machine; use 'auto' or 'cpu'")
    return torch.device(device)


def init_distributed(device: torch.device, *, timeout_s: float = 300.0) -> None:
    """Initialise the default process group from torchrun's environment.

    NCCL for CUDA devices, gloo otherwise. A finite timeout makes a dead peer
    surface as an error instead of a hang.

    After torchrun restarts the workers it hands them the same rendezvous
    store, which still holds the dead attempt's connection addresses; each
    attempt therefore works under its own key prefix.
    """
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None or "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_store, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"attempt{restart}", store), rank=rank,
                            world_size=world, timeout=timeout)


@dataclass
class ParallelGroups:
    """This rank's view of the layout: its coordinates and its group per axis.

    ``group(axis)`` is the process group of the ranks that differ from this
    rank only along ``axis``; ``ranks(axis)`` lists them (global ranks, in
    axis order). For a topology axis of size 1 the group is ``None`` and
    collectives on it are no-ops for callers that check ``size(axis) == 1``.
    """

    topology: Topology
    rank: int
    _groups: dict[str, Any] = field(default_factory=dict)

    @property
    def coords(self) -> dict[str, int]:
        return self.topology.coords(self.rank)

    def group(self, axis: str) -> Any:
        if axis not in self.topology:
            raise ValueError(f"unknown axis {axis!r}; this layout has {list(self.topology.names)}")
        return self._groups[axis]

    def ranks(self, axis: str) -> list[int]:
        return self.topology.group_of(self.rank, axis)

    def size(self, axis: str) -> int:
        return self.topology.size(axis)

    def coord(self, axis: str) -> int:
        return self.topology.coord(self.rank, axis)


def build_groups(topology: Topology, rank: int | None = None, world_size: int | None = None) -> ParallelGroups:
    """Create one process group per (axis, group) of ``topology``.

    Must be called by every rank of the default group, after
    :func:`init_distributed`. Groups of size 1 are not created.
    """
    rank = dist.get_rank() if rank is None else rank
    world_size = dist.get_world_size() if world_size is None else world_size
    if topology.world_size != world_size:
        raise ValueError(
            f"topology {topology} has {topology.world_size} ranks but the job has {world_size}; "
            f"launch with --nproc {topology.world_size} or change the layout"
        )
    mine: dict[str, Any] = {}
    for axis in topology.names:
        for ranks in topology.groups(axis):
            if len(ranks) == 1:
                if rank in ranks:
                    mine[axis] = None
                continue
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                mine[axis] = group
    return ParallelGroups(topology=topology, rank=rank, _groups=mine)
