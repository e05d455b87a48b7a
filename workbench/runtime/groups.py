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

from ..core.config import runs_layer_by_layer
from ..core.plan import ParallelPlan
from ..core.rundir import DIST_BACKEND_ENV, DIST_BACKENDS
from ..core.topology import Topology
from .staging import STAGED_BACKEND, register_staged_backend

__all__ = ["ParallelGroups", "build_groups", "pick_device", "init_distributed", "choose_backend",
           "check_backend_for_plan", "gpus_shared_by", "device_share", "node_gpus"]


def pick_device(device: str = "auto") -> torch.device:
    """``auto`` -> this rank's CUDA device when CUDA is present, else CPU.

    ``auto`` and ``cuda`` spread the ranks of a node over its GPUs round-robin
    (local rank ``r`` on GPU ``r % count``, so with fewer GPUs than ranks some
    share one); ``cuda:N`` puts every rank on GPU ``N``.
    """
    if device == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available on this machine; use 'auto' or 'cpu'")
    if device in ("auto", "cuda"):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device(device)


def node_gpus(device: str) -> int:
    """The GPUs the ranks of a node spread over for the requested ``device``: one for ``cuda:N``, else all."""
    return 1 if device.startswith("cuda:") else torch.cuda.device_count()


def gpus_shared_by(local_rank: int, local_world_size: int, device_count: int) -> int:
    """How many ranks of a node use ``local_rank``'s GPU when ranks take the node's GPUs round-robin.

    :func:`pick_device` gives local rank ``r`` GPU ``r % device_count``; 1
    means the GPU is the rank's own.
    """
    if device_count < 1 or local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise ValueError(f"need 0 <= local_rank < local_world_size and device_count >= 1, got local_rank "
                         f"{local_rank}, local_world_size {local_world_size}, device_count {device_count}")
    return len(range(local_rank % device_count, local_world_size, device_count))


def choose_backend(device_type: str, local_world_size: int, device_count: int, requested: str = "auto") -> str:
    """The collective backend for a rank on ``device_type`` among ``local_world_size`` ranks of its node.

    ``auto``: NCCL when every rank of the node has a GPU of its own, gloo on
    CPUs, and ``staged`` (:mod:`~workbench.runtime.staging`: gloo over host
    copies of every tensor) when ranks share GPUs (``local_world_size >
    device_count``), which NCCL refuses. ``gloo``, ``nccl`` or ``staged``
    force that backend; NCCL needs CUDA and a GPU per rank; ``staged`` on CPUs
    runs the shared-GPU path with CPU tensors (how the tests cover it).
    """
    if requested not in DIST_BACKENDS:
        raise ValueError(f"collective backend must be one of {DIST_BACKENDS}, got {requested!r} "
                         f"(from {DIST_BACKEND_ENV} or LaunchSpec.dist_backend)")
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be >= 1, got {local_world_size}")
    shares_gpus = local_world_size > device_count
    if requested in ("gloo", STAGED_BACKEND):
        return requested
    if requested == "nccl":
        if device_type != "cuda":
            raise ValueError(f"the nccl backend needs CUDA devices, but this rank runs on {device_type!r}; "
                             f"use dist_backend 'auto' or 'gloo'")
        if shares_gpus:
            raise ValueError(f"the nccl backend needs one GPU per rank, but {local_world_size} ranks on this node "
                             f"share {device_count} GPU(s); use dist_backend 'auto' (staged through host memory "
                             f"when GPUs are shared) or start at most {device_count} ranks per node")
        return "nccl"
    if device_type != "cuda":
        return "gloo"
    return STAGED_BACKEND if shares_gpus else "nccl"


def check_backend_for_plan(backend: str, device: torch.device, plan: ParallelPlan) -> None:
    """Refuse plain gloo with CUDA tensors for anything but plain data parallelism.

    gloo sends and receives CPU tensors only and lacks some collectives for
    CUDA tensors, so with ``dist_backend = "gloo"`` forced on GPUs only
    replicated data parallelism (all-reduce and broadcast) runs; ``auto`` or
    ``staged`` run every plan.
    """
    if backend != "gloo" or device.type != "cuda":
        return
    if plan.family == "dp" and not runs_layer_by_layer(plan):
        return
    raise ValueError(
        f"plan {plan.name!r} exchanges CUDA tensors point to point or by collectives that the gloo backend does "
        f"not run on GPUs; with dist_backend 'gloo' forced only plain data parallelism runs on CUDA. Use "
        f"dist_backend 'auto' or '{STAGED_BACKEND}' (gloo over host copies), or 'nccl' with one GPU per rank")


def device_share(device: torch.device, requested: str = "auto") -> dict[str, Any]:
    """How this rank holds its device: ``shared_by`` ranks of the node (1: its own) and its ``memory_fraction``.

    ``requested`` is the config's ``device`` (see :func:`node_gpus`). CPU
    ranks report None for both (the operating system shares the cores, see
    ``entry.pin_cpu_rank``).
    """
    if device.type != "cuda":
        return {"shared_by": None, "memory_fraction": None}
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    shared = gpus_shared_by(local, local_world, node_gpus(requested))
    return {"shared_by": shared, "memory_fraction": 1.0 / shared}


def init_distributed(device: torch.device, *, timeout_s: float = 300.0, requested_device: str = "auto") -> str:
    """Initialise the default process group from torchrun's environment; returns the backend used.

    The backend is :func:`choose_backend`'s for this rank: NCCL when each
    rank of the node has its own GPU, gloo on CPUs, staged through host
    memory when ranks share GPUs (``LOCAL_WORLD_SIZE`` above the GPU count),
    unless ``WORKBENCH_DIST_BACKEND`` (the launcher's ``dist_backend``)
    forces one; ``requested_device`` is the config's ``device``. Ranks that
    share a GPU are each capped at an equal fraction of its memory
    (:func:`device_share`), the budget the planner gives them. A finite
    timeout makes a dead peer surface as an error instead of a hang.

    After torchrun restarts the workers it hands them the same rendezvous
    store, which still holds the dead attempt's connection addresses; each
    attempt therefore works under its own key prefix.
    """
    if dist.is_initialized():
        return dist.get_backend()
    device_count = node_gpus(requested_device) if device.type == "cuda" else 0
    backend = choose_backend(device.type, int(os.environ.get("LOCAL_WORLD_SIZE", 1)), device_count,
                             os.environ.get(DIST_BACKEND_ENV, "auto") or "auto")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        fraction = device_share(device, requested_device)["memory_fraction"]
        if fraction < 1.0:  # ranks sharing a GPU each get an equal part of its memory
            torch.cuda.set_per_process_memory_fraction(fraction, device)
    if backend == STAGED_BACKEND:
        register_staged_backend()
    timeout = timedelta(seconds=timeout_s)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None or "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
        return backend
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_store, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"attempt{restart}", store), rank=rank,
                            world_size=world, timeout=timeout)
    return backend


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
