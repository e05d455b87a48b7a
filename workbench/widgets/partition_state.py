"""What the partition editor shows for one cut (:class:`EditorState`), and the checks of its arguments.

No ipywidgets here: the state is plain values (the projection, AMPA's
optimum and the simulated pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.partition import Partition
from ..planning.partitioning.ampa import PartitionResult
from ..scheduling.simulate import SimResult

__all__ = ["EditorState"]


@dataclass(frozen=True)
class EditorState:
    """One evaluated partition: its projection, AMPA's optimum and the simulated pipeline."""

    partition: Partition
    result: PartitionResult
    optimum: PartitionResult
    sim: SimResult

    @property
    def bottleneck_ms(self) -> float:
        return self.result.bottleneck_ms

    @property
    def bottleneck_stage(self) -> int:
        return self.result.bottleneck_stage

    @property
    def bubble_fraction(self) -> float:
        """Mean over ranks of the simulated idle share of the iteration."""
        values = self.sim.metrics["bubble_fraction"]
        return sum(values) / len(values)

    @property
    def iteration_ms(self) -> float:
        return self.sim.metrics["iteration_ms"]

    @property
    def peak_memory_bytes(self) -> list[int]:
        """Simulated peak memory per rank."""
        return self.sim.metrics["peak_memory_bytes"]

    @property
    def gap(self) -> float:
        """How much slower the projected pipeline is than AMPA's: ``bottleneck / optimum - 1`` (0 at AMPA's cut)."""
        return self.result.bottleneck_ms / self.optimum.bottleneck_ms - 1.0


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _zoo_names() -> list[str]:
    from ..models import list_models  # torch: imported only when a zoo model is asked for

    return list_models()
