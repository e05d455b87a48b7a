"""Layouts and device meshes: which batch rows and weight shards a stage rank holds for each layer layout.

One :class:`~torch.distributed.device_mesh.DeviceMesh` per layer layout
(degree, consecutive or strided ranks), with named dims ``pp`` x ``dp`` x
``tp`` built from the plan's topology; a layer takes its stage's
``["dp", "tp"]`` submesh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...core.plan import LayerPlan
from ...core.topology import Topology

__all__ = ["Layout", "layout_of", "StageMeshes"]


@dataclass(frozen=True)
class Layout:
    """Which batch rows and weight shards a stage rank holds for one layer.

    ``size`` ranks in the stage; ``tp`` ranks per tensor-parallel group,
    neighbouring (``consecutive``) or strided. Stage rank ``r`` is in data
    group ``r // tp`` (consecutive) or ``r % (size / tp)`` (strided).
    """

    size: int
    tp: int = 1
    consecutive: bool = True

    @property
    def dp(self) -> int:
        return self.size // self.tp

    @property
    def full(self) -> bool:
        """Every rank holds the whole stage batch (one data group)."""
        return self.dp == 1

    def rank_grid(self) -> list[list[int]]:
        """Stage ranks as a [dp][tp] grid."""
        if self.consecutive:
            return [[d * self.tp + k for k in range(self.tp)] for d in range(self.dp)]
        return [[k * self.dp + d for k in range(self.tp)] for d in range(self.dp)]

    def coords(self, stage_rank: int) -> tuple[int, int]:
        """(data group, index inside the tensor-parallel group) of a stage rank."""
        if self.consecutive:
            return stage_rank // self.tp, stage_rank % self.tp
        return stage_rank % self.dp, stage_rank // self.dp

    def canonical(self) -> "Layout":
        """Layouts that place the same rows on the same ranks compare equal."""
        if self.full:
            return Layout(self.size, self.size, True)
        if self.tp == 1:
            return Layout(self.size, 1, True)
        return self


def layout_of(layer: LayerPlan, stage_size: int) -> Layout:
    return Layout(stage_size, layer.tp_degree, layer.consecutive).canonical()


class StageMeshes:
    """This rank's place in its stage and one ``["dp", "tp"]`` device mesh per layout.

    ``topology`` is the plan's mesh (axes dp, pp, tp); a stage is every rank
    with one ``pp`` coordinate, numbered ``dp * tp_size + tp``. Meshes are
    DeviceMeshes over all stages at once (dims ``pp``, ``dp``, ``tp``), so
    every rank creates the same groups in the same order.
    """

    def __init__(self, topology: Topology, rank: int, device_type: str, layouts: list[Layout]) -> None:
        from torch.distributed.device_mesh import DeviceMesh

        self.topology, self.rank, self.device_type = topology, rank, device_type
        coords = topology.coords(rank)
        self.stage = coords.get("pp", 0)
        tp_size = topology.size("tp")
        self.stage_rank = coords["dp"] * tp_size + coords.get("tp", 0)
        self.stages = [self._stage_ranks(s) for s in range(topology.size("pp"))]
        self.size = len(self.stages[0])
        stage_ids = torch.tensor(self.stages)  # [pp, n] global ranks
        self.stage_mesh = DeviceMesh(device_type, stage_ids, mesh_dim_names=("pp", "stage"))
        self.group = self.stage_mesh.get_group("stage") if self.size > 1 else None
        self._meshes: dict[Layout, Any] = {}
        for layout in dict.fromkeys(layouts):
            grid = torch.tensor([[[self.stages[s][r] for r in row] for row in layout.rank_grid()]
                                 for s in range(len(self.stages))])  # [pp, dp, tp] global ranks
            mesh = DeviceMesh(device_type, grid, mesh_dim_names=("pp", "dp", "tp"))
            self._meshes[layout] = mesh["dp", "tp"]

    def _stage_ranks(self, stage: int) -> list[int]:
        """Global ranks of ``stage`` in stage-rank order (dp-major, tp-minor)."""
        names = self.topology.names

        def rank(d: int, k: int) -> int:
            coords = {"dp": d, "pp": stage, "tp": k}
            return self.topology.rank(**{axis: coords[axis] for axis in names})

        return [rank(d, k) for d in range(self.topology.size("dp")) for k in range(self.topology.size("tp"))]

    def mesh(self, layout: Layout):
        """The ``["dp", "tp"]`` submesh of this rank's stage for ``layout``."""
        return self._meshes[layout]

    def twin(self, stage: int) -> int:
        """The global rank of stage ``stage`` with this rank's stage-rank (its pipeline peer)."""
        return self.stages[stage][self.stage_rank]
