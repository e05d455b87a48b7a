"""Per-layer options of a parallel plan: :class:`LayerPlan`, its short text form and its ``[[plan.layers]]`` ranges.

Standard library only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from .fields import boolean, choice, integer, spec, validate
from .pipelines import plan_error
from .topology import Topology

__all__ = ["LayerPlan", "DP_KINDS", "TP_KINDS"]

DP_KINDS = ("replicate", "zero2", "fsdp")  # DDP; shard gradients + optimizer state; shard everything
TP_KINDS = ("none", "1d", "2d")
_DP_TEXT = {"replicate": "ddp", "zero2": "zero2", "fsdp": "fsdp"}
_TEXT_DP = {v: k for k, v in _DP_TEXT.items()}


# -- per-layer options -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerPlan:
    """How one layer is parallelised inside its pipeline stage.

    ``dp``: ``replicate`` keeps a full copy per data-parallel rank and
    all-reduces gradients (DDP); ``zero2`` shards gradients and optimizer
    state (reduce-scatter, then an all-gather of the updated parameters);
    ``fsdp`` also shards the parameters and gathers them around each use.
    ``tp`` / ``tp_degree``: no tensor parallelism, Megatron-style 1D over
    ``tp_degree`` ranks, or a SUMMA 2D grid of ``tp_degree`` = q x q ranks.
    ``recompute``: keep only the layer's input and re-run its forward in
    backward. ``consecutive``: the tensor-parallel group sits on neighbouring
    ranks of the stage (TP innermost, the fast link), else on strided ranks
    (data parallelism innermost); always True without tensor parallelism.
    """

    dp: str = spec("replicate", choice(DP_KINDS))
    tp: str = spec("none", choice(TP_KINDS))
    tp_degree: int = spec(1, integer(1))
    recompute: bool = spec(False, boolean())
    consecutive: bool = spec(True, boolean())

    def __post_init__(self) -> None:
        validate(self, "layers.", plan_error)
        if self.tp == "none" and not self.consecutive:
            raise plan_error("layers.consecutive", False, "only a tensor-parallel group can sit on strided ranks")
        if self.tp == "none" and self.tp_degree != 1:
            raise plan_error("layers.tp_degree", self.tp_degree, "a layer without tensor parallelism has degree 1")
        if self.tp != "none" and self.tp_degree < 2:
            raise plan_error("layers.tp_degree", self.tp_degree, f"tensor parallelism {self.tp!r} needs degree >= 2")
        if self.tp == "2d" and math.isqrt(self.tp_degree) ** 2 != self.tp_degree:
            raise plan_error("layers.tp_degree", self.tp_degree, "a 2D grid has q x q ranks: use a square")

    @property
    def text(self) -> str:
        """Short form: ``ddp``, ``fsdp.tp1d2``, ``zero2.rc``, ``ddp.tp2d4.rc``, ``ddp.tp1d2.strided``."""
        parts = [_DP_TEXT[self.dp]]
        if self.tp != "none":
            parts.append(f"tp{self.tp}{self.tp_degree}")
            if not self.consecutive:
                parts.append("strided")
        if self.recompute:
            parts.append("rc")
        return ".".join(parts)

    @classmethod
    def parse(cls, text: str) -> "LayerPlan":
        parts = text.strip().split(".")
        if parts[0] not in _TEXT_DP:
            raise plan_error("layers", text, f"a layer option starts with one of {', '.join(_TEXT_DP)}")
        options: dict[str, Any] = {"dp": _TEXT_DP[parts[0]]}
        for part in parts[1:]:
            m = re.fullmatch(r"tp(1d|2d)(\d+)", part)
            if part == "rc":
                options["recompute"] = True
            elif part == "strided":
                options["consecutive"] = False
            elif m:
                options.update(tp=m.group(1), tp_degree=int(m.group(2)))
            else:
                raise plan_error("layers", text, f"unknown layer option {part!r}; expected 'rc', 'strided' or 'tp1dN' / 'tp2dN'")
        return cls(**options)


def _mesh_layer(mesh: Topology) -> LayerPlan:
    """The LayerPlan a mesh implies: its tensor parallelism (2D grid, 1D, or none) over all its tensor ranks.

    A plan name's head and a ``[plan]`` table without layer ranges mean this for every layer."""
    if mesh.size("tp_row") > 1:
        return LayerPlan(tp="2d", tp_degree=mesh.size("tp_row") * mesh.size("tp_col"))
    if mesh.size("tp") > 1:
        return LayerPlan(tp="1d", tp_degree=mesh.size("tp"))
    return LayerPlan()


def _layer_ranges(layers: tuple[LayerPlan, ...]) -> list[dict[str, Any]]:
    """Consecutive equal layers as ``{"layers": "0-3", "dp": ..., ...}`` tables (``"all"`` for one entry)."""
    if len(layers) == 1:
        return [{"layers": "all", **_layer_fields(layers[0])}]
    out, start = [], 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or layers[i] != layers[start]:
            out.append({"layers": f"{start}-{i - 1}", **_layer_fields(layers[start])})
            start = i
    return out


def _layer_fields(layer: LayerPlan) -> dict[str, Any]:
    return {f.name: getattr(layer, f.name) for f in fields(layer) if f.name != "consecutive" or not layer.consecutive}


def _layers_from_ranges(ranges: Any, default: LayerPlan) -> tuple[LayerPlan, ...]:
    if not isinstance(ranges, list) or not ranges:
        raise plan_error("layers", ranges, "expected a list of tables like {layers = '0-3', dp = 'fsdp'}")
    out: list[LayerPlan] = []
    for i, entry in enumerate(ranges):
        if not isinstance(entry, dict) or "layers" not in entry:
            raise plan_error(f"layers[{i}]", entry, "expected a table with 'layers' = 'all' or a range like '0-3'")
        options = {k: v for k, v in entry.items() if k != "layers"}
        known = {f.name for f in fields(LayerPlan)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise plan_error(f"layers[{i}].{unknown[0]}", options[unknown[0]], f"valid fields are {sorted(known)}")
        layer = replace(default, **options) if options else default
        span = str(entry["layers"]).strip()
        if span == "all":
            if len(ranges) != 1:
                raise plan_error(f"layers[{i}].layers", span, "'all' must be the only layer range")
            return (layer,)
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", span)
        if not m:
            raise plan_error(f"layers[{i}].layers", span, "expected 'all', 'N' or 'A-B'")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if first != len(out) or last < first:
            raise plan_error(f"layers[{i}].layers", span, f"ranges must be consecutive from layer 0; "
                             f"expected one starting at {len(out)}")
        out.extend([layer] * (last - first + 1))
    return tuple(out)
