"""A pipeline partition: which contiguous layers each stage owns.

Pipelines cut an ordered layer sequence into contiguous blocks, one per
stage. This module holds only the value (with its validation and a compact
text form); the algorithms that *choose* a partition (AMPA and the baselines)
live in ``workbench.planning`` so they can use the schedule memory model.

Text form: inclusive layer-index ranges joined by ``|``, e.g.
``"0-3|4-9|10-15"`` is three stages over 16 layers; a one-layer stage may
be written ``"4"`` instead of ``"4-4"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence
from .fields import check_int, is_int

__all__ = ["Partition"]

_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class Partition:
    """Stage ``s`` owns layers ``bounds[s][0] .. bounds[s][1]`` (inclusive)."""

    bounds: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        bounds = tuple(tuple(b) for b in self.bounds)
        if not bounds:
            raise ValueError("a partition needs at least one stage, got none")
        expected = 0
        for s, b in enumerate(bounds):
            if len(b) != 2 or not all(is_int(x) for x in b):
                raise ValueError(f"stage {s} bounds must be two ints (first, last), got {b!r}")
            first, last = b
            if last < first:
                raise ValueError(f"stage {s} is empty or reversed: layers {first}-{last} (first must be <= last)")
            if first != expected:
                what = "overlaps the previous stage" if first < expected else f"leaves layers {expected}-{first - 1} uncovered"
                raise ValueError(f"stage {s} starts at layer {first} but should start at {expected}: it {what}")
            expected = last + 1
        object.__setattr__(self, "bounds", bounds)

    # -- constructors -----------------------------------------------------------------
    @classmethod
    def from_sizes(cls, sizes: Sequence[int]) -> "Partition":
        """From the number of layers per stage, e.g. ``[4, 6, 6]``."""
        bounds, start = [], 0
        for s, n in enumerate(sizes):
            check_int(f"stage {s} size", n, 1)
            bounds.append((start, start + n - 1))
            start += n
        return cls(tuple(bounds))

    @classmethod
    def from_cuts(cls, cuts: Sequence[int], num_layers: int) -> "Partition":
        """From the first layer of every stage after the first (boundaries)."""
        check_int("num_layers", num_layers, 1)
        points = [0, *cuts, num_layers]
        for a, b in zip(points, points[1:]):
            if not (isinstance(b, int) and b > a):
                raise ValueError(f"cuts must be strictly increasing in (0, {num_layers}), got {list(cuts)}")
        return cls(tuple((a, b - 1) for a, b in zip(points, points[1:])))

    @classmethod
    def uniform(cls, num_layers: int, num_stages: int) -> "Partition":
        """Equal layer counts (the first stages take the remainder)."""
        check_int("num_stages", num_stages, 1)
        if num_stages > num_layers:
            raise ValueError(f"cannot split {num_layers} layers into {num_stages} stages: at most {num_layers} stages")
        base, extra = divmod(num_layers, num_stages)
        return cls.from_sizes([base + (1 if s < extra else 0) for s in range(num_stages)])

    @classmethod
    def parse(cls, text: str, num_layers: int | None = None) -> "Partition":
        """Parse ``"0-3|4-9|10-15"``; with ``num_layers`` also check full coverage."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"partition text must be like '0-3|4-9|10-15', got {text!r}")
        bounds = []
        for s, part in enumerate(text.split("|")):
            m = _RANGE_RE.match(part)
            if not m:
                raise ValueError(f"malformed stage {s} {part!r} in partition {text!r}: expected 'first-last' or 'layer'")
            first = int(m[1])
            last = int(m[2]) if m[2] is not None else first
            bounds.append((first, last))
        p = cls(tuple(bounds))
        if num_layers is not None:
            p.check_covers(num_layers)
        return p

    # -- views ------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.bounds)

    @property
    def num_layers(self) -> int:
        return self.bounds[-1][1] + 1

    @property
    def sizes(self) -> list[int]:
        return [b - a + 1 for a, b in self.bounds]

    @property
    def cuts(self) -> list[int]:
        """First layer of each stage after the first."""
        return [a for a, _ in self.bounds[1:]]

    def layers(self, stage: int) -> range:
        if not 0 <= stage < self.num_stages:
            raise ValueError(f"stage must be in [0, {self.num_stages - 1}], got {stage}")
        a, b = self.bounds[stage]
        return range(a, b + 1)

    def stage_of(self, layer: int) -> int:
        for s, (a, b) in enumerate(self.bounds):
            if a <= layer <= b:
                return s
        raise ValueError(f"layer must be in [0, {self.num_layers - 1}], got {layer}")

    def __iter__(self) -> Iterator[range]:
        return (self.layers(s) for s in range(self.num_stages))

    def __len__(self) -> int:
        return self.num_stages

    def check_covers(self, num_layers: int) -> None:
        """Raise unless this partition covers exactly ``num_layers`` layers."""
        if self.num_layers != num_layers:
            raise ValueError(
                f"partition {self} covers layers 0-{self.num_layers - 1} but the model has {num_layers} "
                f"layers (0-{num_layers - 1})"
            )

    def stage_sums(self, values: Sequence[float]) -> list[float]:
        """Sum a per-layer quantity over each stage."""
        self.check_covers(len(values))
        return [sum(values[a : b + 1]) for a, b in self.bounds]

    # -- text / json ------------------------------------------------------------------
    def __str__(self) -> str:
        return "|".join(f"{a}-{b}" for a, b in self.bounds)

    def to_dict(self) -> dict[str, Any]:
        return {"partition": str(self), "stages": [list(b) for b in self.bounds]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Partition":
        if "partition" in data:
            return cls.parse(data["partition"])
        if "stages" in data:
            return cls(tuple(tuple(b) for b in data["stages"]))
        raise ValueError("partition JSON needs 'partition' (text) or 'stages' ([[first, last], ...])")
