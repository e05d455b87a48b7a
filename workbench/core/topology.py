"""Rank <-> coordinates on named parallel axes, as pure arithmetic.

A hybrid-parallel job lays its ranks out on a grid of named axes, for example
``Topology(dp=2, pp=4)`` for GroPipe's 2 groups x 4 stages, or
``Topology(dp=2, tp_row=2, tp_col=2)`` for two 2x2 tensor-parallel grids.
Ranks are numbered row-major: the *last* axis varies fastest, so consecutive
ranks share every coordinate but the last one. Put the axis with the heaviest
traffic last to keep its groups on neighbouring ranks (the same node).

Process groups are *not* created here (that is ``runtime.groups``); this
module only answers which ranks belong together, so the simulator, the
planner and the runtime agree on one layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod
from typing import Any, Iterator
from .fields import check_int, integer

__all__ = ["Topology", "KNOWN_AXES"]

KNOWN_AXES = ("dp", "pp", "tp", "tp_row", "tp_col")
_AXIS_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Topology:
    """Named axes with sizes, in order (slowest-varying first)."""

    axes: tuple[tuple[str, int], ...]

    def __init__(self, axes: dict[str, int] | tuple[tuple[str, int], ...] | None = None, **sizes: int) -> None:
        pairs = list((axes.items() if isinstance(axes, dict) else axes) or ()) + list(sizes.items())
        if not pairs:
            raise ValueError("a topology needs at least one axis, e.g. Topology(dp=2, pp=2)")
        seen = set()
        for name, size in pairs:
            if not isinstance(name, str) or not _AXIS_RE.match(name):
                raise ValueError(f"axis name must be a lowercase identifier, got {name!r}")
            if name in seen:
                raise ValueError(f"axis {name!r} given twice")
            seen.add(name)
            check_int(f"axis {name!r} size", size, 1)
        object.__setattr__(self, "axes", tuple((n, s) for n, s in pairs))

    # -- shape ------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def world_size(self) -> int:
        return prod(self.sizes)

    def size(self, axis: str) -> int:
        """Size of an axis; an axis the topology does not have has size 1."""
        self._check_axis(axis, allow_missing=True)
        return dict(self.axes).get(axis, 1)

    def __contains__(self, axis: str) -> bool:
        return axis in self.names

    # -- rank <-> coordinates ----------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """The coordinates of ``rank`` on every axis."""
        self._check_rank(rank)
        out: dict[str, int] = {}
        rest = rank
        for name, size in reversed(self.axes):
            out[name] = rest % size
            rest //= size
        return {n: out[n] for n in self.names}

    def rank(self, **coords: int) -> int:
        """The rank at the given coordinates (every axis must be given)."""
        missing = [n for n in self.names if n not in coords]
        extra = [n for n in coords if n not in self.names]
        if missing or extra:
            raise ValueError(f"coordinates must name exactly the axes {list(self.names)}; missing {missing}, unknown {extra}")
        r = 0
        for name, size in self.axes:
            c = coords[name]
            if not integer(0, size - 1).accepts(c):
                raise ValueError(f"coordinate {name}={c!r} out of range [0, {size - 1}]")
            r = r * size + c
        return r

    def coord(self, rank: int, axis: str) -> int:
        self._check_axis(axis, allow_missing=True)
        return self.coords(rank).get(axis, 0)

    # -- groups -----------------------------------------------------------------------
    def groups(self, axis: str) -> list[list[int]]:
        """All groups along ``axis``: ranks that differ only in that coordinate.

        Groups are ordered by the lowest rank they contain; each group lists its
        ranks in increasing order of the axis coordinate.
        """
        self._check_axis(axis)
        out: dict[tuple, list[int]] = {}
        for r in range(self.world_size):
            c = self.coords(r)
            key = tuple(v for n, v in c.items() if n != axis)
            out.setdefault(key, []).append(r)
        return sorted(out.values(), key=lambda g: g[0])

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The group along ``axis`` that contains ``rank``."""
        self._check_axis(axis)
        c = self.coords(rank)
        return [self.rank(**{**c, axis: i}) for i in range(self.size(axis))]

    def peer(self, rank: int, axis: str, offset: int, *, wrap: bool = False) -> int | None:
        """The rank ``offset`` steps along ``axis`` (None past the edge unless ``wrap``)."""
        self._check_axis(axis)
        c = self.coords(rank)
        target = c[axis] + offset
        size = self.size(axis)
        if wrap:
            target %= size
        elif not 0 <= target < size:
            return None
        return self.rank(**{**c, axis: target})

    def __iter__(self) -> Iterator[dict[str, int]]:
        return (self.coords(r) for r in range(self.world_size))

    # -- text / json ------------------------------------------------------------------
    def __str__(self) -> str:
        return " x ".join(f"{n}={s}" for n, s in self.axes)

    @classmethod
    def parse(cls, text: str) -> "Topology":
        """Parse ``"dp=2,pp=2"`` (commas, spaces or ``x`` separate axes)."""
        parts = [p for p in re.split(r"[,\s]+|\s*x\s*", text.strip()) if p]
        pairs = []
        for p in parts:
            name, sep, value = p.partition("=")
            if not sep or not value.strip().lstrip("-").isdigit():
                raise ValueError(f"malformed axis {p!r} in {text!r}: expected name=size, e.g. 'dp=2,pp=2'")
            pairs.append((name.strip(), int(value)))
        return cls(tuple(pairs))

    def to_dict(self) -> dict[str, Any]:
        return {"axes": [[n, s] for n, s in self.axes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Topology":
        if "axes" not in data:
            raise ValueError("topology JSON needs 'axes': [[name, size], ...]")
        return cls(tuple((str(n), s) for n, s in data["axes"]))

    def describe(self) -> str:
        """A table of every rank's coordinates, for printing."""
        names = self.names
        width = max(4, *(len(n) for n in names))
        lines = ["rank".rjust(6) + "  " + "  ".join(n.rjust(width) for n in names)]
        for r in range(self.world_size):
            c = self.coords(r)
            lines.append(str(r).rjust(6) + "  " + "  ".join(str(c[n]).rjust(width) for n in names))
        return "\n".join(lines)

    # -- checks -----------------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        check_int("rank", rank, 0, self.world_size - 1, expected=f"an int in [0, {self.world_size - 1}]")

    def _check_axis(self, axis: str, *, allow_missing: bool = False) -> None:
        if axis in self.names:
            return
        if allow_missing and isinstance(axis, str) and _AXIS_RE.match(axis):
            return
        raise ValueError(f"unknown axis {axis!r}; this topology has {list(self.names)}")
