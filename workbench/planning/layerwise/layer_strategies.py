"""The per-layer strategy space of a pipeline stage, built as Galvatron builds it: by decision trees.

Problem. A fine-grained planner picks, for every layer, how the devices of
its pipeline stage split the work: over how many ranks its tensors are cut
(tensor parallelism, 1D Megatron or a 2D SUMMA grid), how the rest replicate
it (DDP), shard its gradients and optimizer state (ZeRO-2) or shard
everything (FSDP / ZeRO-3), whether its activations are recomputed, and
whether its tensor-parallel group sits on consecutive ranks (one node, the
fast link) or strided ranks (data parallelism innermost). Enumerated
naively these multiply out; most combinations are never the best.

Approach. Galvatron's three rules (PKU-DAIR, VLDB'23) prune the space:

1. pipeline parallelism moves the least data, so it is the root of the tree
   (its degree is global, one per model);
2. on identical devices every level splits its devices evenly: a tree level
   is one method with a power-of-two fan-out, each method used once;
3. a tree mixing DP and SDP (sharded DP) is never better than pure SDP, so
   such trees are dropped.

:func:`decision_trees` enumerates these trees (each a tuple of levels,
outermost first); for 8 devices there are 34 trees, 22 after rule 3, the
paper's count. Below the PP root the order of the tensor-parallel and the
data-parallel level is the *consecutive* flag: TP innermost means its
groups are neighbouring ranks. :func:`stage_strategies` turns the trees of
one stage into :class:`LayerStrategy` values; the data-parallel level
becomes one strategy per non-sharded kind in ``dp_kinds`` (Galvatron-2
makes DDP-or-ZeRO-2 a search-wide choice, and the per-layer choice is that
kind or ZeRO-3), the SDP level becomes ``fsdp``. :func:`for_layer` drops
the tensor-parallel strategies a layer type cannot run (a convolution gets
none, a 2D grid only where the layer is a transformer block or a linear),
instead of failing later in the runtime.

Pure Python: the planner runs in kernels that never import torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import permutations
from typing import Callable, Iterable, Sequence

from ...core.costs import LayerCost
from ...core.fields import integer, is_int
from ...core.plan import DP_KINDS, LayerPlan, plan_error

__all__ = ["LayerStrategy", "LayerKind", "TRANSFORMER", "LINEAR", "CONV", "OTHER", "guess_layer_kind",
           "decision_trees", "stage_strategies", "galvatron_space", "for_layer", "layer_kinds"]

TREE_METHODS = ("tp", "dp", "sdp")  # below the pipeline root; "sdp" is sharded data parallelism (ZeRO-3)


def _power_of_two(value: object) -> bool:
    return is_int(value) and value >= 1 and value & (value - 1) == 0


@dataclass(frozen=True)
class LayerStrategy:
    """One layer's parallel layout inside a stage; :meth:`to_layer_plan` gives the plan's view.

    ``consecutive`` says whether the tensor-parallel group is made of
    neighbouring ranks (TP innermost) or strided ones (DP innermost); it
    decides which link the group's collectives cross and whether two layers'
    activations line up; the plan's :class:`~workbench.core.plan.LayerPlan`
    carries it too. It is normalised to True where it cannot matter (no
    tensor parallelism, or no data parallelism beside it).
    """

    tp_degree: int = 1
    dp: str = "replicate"
    tp: str = "none"
    consecutive: bool = True
    recompute: bool = False
    devices: int = 1

    def __post_init__(self) -> None:
        if not _power_of_two(self.devices):
            raise plan_error("strategy.devices", self.devices, "a stage has a power-of-two number of devices")
        if not _power_of_two(self.tp_degree) or self.tp_degree > self.devices:
            raise plan_error("strategy.tp_degree", self.tp_degree,
                             f"a power of two dividing the stage's {self.devices} devices")
        if self.dp not in DP_KINDS:
            raise plan_error("strategy.dp", self.dp, f"valid options are {', '.join(DP_KINDS)}")
        if self.tp not in ("none", "1d", "2d") or (self.tp == "none") != (self.tp_degree == 1):
            raise plan_error("strategy.tp", self.tp, "'none' with degree 1, '1d' or '2d' with degree >= 2")
        if self.tp == "2d" and math.isqrt(self.tp_degree) ** 2 != self.tp_degree:
            raise plan_error("strategy.tp_degree", self.tp_degree, "a 2D grid has q x q ranks: use a square")
        for name in ("consecutive", "recompute"):
            if not isinstance(getattr(self, name), bool):
                raise plan_error(f"strategy.{name}", getattr(self, name), "expected true or false")
        if self.tp_degree in (1, self.devices):
            object.__setattr__(self, "consecutive", True)

    @property
    def dp_degree(self) -> int:
        return self.devices // self.tp_degree

    @property
    def layout(self) -> tuple[str, int, bool]:
        """What decides where a layer's activations live: equal layouts need no redistribution between layers."""
        return (self.tp, self.tp_degree, self.consecutive)

    @property
    def text(self) -> str:
        """The plan's short form (``.strided`` when the TP group is not on consecutive ranks)."""
        return self.to_layer_plan().text

    def to_layer_plan(self) -> LayerPlan:
        plan = self.__dict__.get("_plan")  # made once: a search turns the same strategies into plans many times
        if plan is None:
            plan = LayerPlan(dp=self.dp, tp=self.tp, tp_degree=self.tp_degree, recompute=self.recompute,
                             consecutive=self.consecutive)
            object.__setattr__(self, "_plan", plan)
        return plan

    def tp_ranks(self, first_rank: int = 0) -> list[list[int]]:
        """The stage's tensor-parallel groups, as absolute ranks (the stage's ranks start at ``first_rank``)."""
        t, d = self.tp_degree, self.dp_degree
        if self.consecutive:
            return [[first_rank + g * t + i for i in range(t)] for g in range(d)]
        return [[first_rank + j + i * d for i in range(t)] for j in range(d)]

    def dp_ranks(self, first_rank: int = 0) -> list[list[int]]:
        """The stage's data-parallel groups: the ranks holding the same tensor shard."""
        return [list(group) for group in zip(*self.tp_ranks(first_rank))]


@dataclass(frozen=True)
class LayerKind:
    """What tensor parallelism a layer type admits, and how many linears it splits.

    ``linears``: Megatron pairs them column / row parallel, so 1D runs one
    all-reduce per pair in each pass; SUMMA broadcasts each one's operands.
    """

    name: str
    tp_kinds: tuple[str, ...]
    linears: int = 0

    def __post_init__(self) -> None:
        if not set(self.tp_kinds) <= {"1d", "2d"}:
            raise plan_error("kind.tp_kinds", self.tp_kinds, "a subset of ('1d', '2d')")
        if self.tp_kinds and not integer(1).accepts(self.linears):
            raise plan_error("kind.linears", self.linears, "a layer that takes tensor parallelism splits >= 1 linear")


TRANSFORMER = LayerKind("transformer", ("1d", "2d"), 4)  # qkv, attention output, MLP up, MLP down
LINEAR = LayerKind("linear", ("1d", "2d"), 1)
CONV = LayerKind("conv", ())
OTHER = LayerKind("other", ())  # embeddings, heads, pooling: replicated or sharded, never split here
_TRANSFORMER_NAME = re.compile(r"(^|[._])(block|layer|h)[._]?\d+$")  # block_3, layer_3 (BERT), h.3; not layer1_0
_LINEAR_NAME = re.compile(r"^(fc|linear|dense|classifier|mlp)\d*([._]|$)")


def guess_layer_kind(layer: LayerCost) -> LayerKind:
    """The kind of the zoo's layers from their names (``block_3`` -> transformer, ``fc6`` -> linear, else
    conv or other); pass kinds explicitly for models named otherwise."""
    name = layer.name.lower()
    if _TRANSFORMER_NAME.search(name):
        return TRANSFORMER
    if _LINEAR_NAME.search(name):
        return LINEAR
    return CONV if "conv" in name or "stem" in name else OTHER


def decision_trees(devices: int, *, prune_mixed: bool = True, max_pp: int | None = None,
                   methods: Sequence[str] = TREE_METHODS) -> list[tuple[tuple[str, int], ...]]:
    """Every tree over ``devices`` under the rules of the module docstring, levels outermost first.

    A level is ``(method, fan_out)``; the root is ``("pp", p)`` when p > 1.
    ``prune_mixed=False`` keeps the DP+SDP trees rule 3 removes (34 for 8
    devices instead of 22).
    """
    if not _power_of_two(devices):
        raise plan_error("devices", devices, "a power-of-two number of devices (the trees split evenly)")
    unknown = set(methods) - set(TREE_METHODS)
    if unknown:
        raise plan_error("methods", sorted(unknown), f"tree methods are {', '.join(TREE_METHODS)}")
    trees = []
    pp = 1
    while pp <= min(devices, max_pp or devices):
        root = (("pp", pp),) if pp > 1 else ()
        trees += [root + levels for levels in _stage_trees(devices // pp, tuple(methods), prune_mixed)]
        pp *= 2
    return trees


def _stage_trees(devices: int, methods: tuple[str, ...], prune_mixed: bool) -> list[tuple[tuple[str, int], ...]]:
    """Ordered levels of distinct methods whose power-of-two fan-outs (>= 2) multiply to ``devices``."""
    if devices == 1:
        return [()]
    exponent = devices.bit_length() - 1
    out = []
    for depth in range(1, min(len(methods), exponent) + 1):
        for order in permutations(methods, depth):
            if prune_mixed and "dp" in order and "sdp" in order:
                continue
            out += [tuple(zip(order, (1 << e for e in split))) for split in _compositions(exponent, depth)]
    return out


def _compositions(total: int, parts: int) -> Iterable[tuple[int, ...]]:
    """Ordered ways to write ``total`` as ``parts`` positive integers (exponents of the fan-outs)."""
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in _compositions(total - first, parts - 1):
            yield (first, *rest)


def stage_strategies(devices: int, *, dp_kinds: Sequence[str] = ("replicate", "fsdp"),
                     tp_kinds: Sequence[str] = ("1d",), recompute: Sequence[bool] = (False,),
                     max_tp: int | None = None) -> tuple[LayerStrategy, ...]:
    """The strategies of one stage of ``devices`` ranks: its pruned trees (no PP level), each once per
    non-sharded DP kind in ``dp_kinds`` (``fsdp`` for the SDP level), TP kind and recompute option.

    With the defaults a stage of 8 devices has 11 strategies; 22 with
    ``recompute=(False, True)``. A 2D kind applies to the trees whose TP
    fan-out is a square (4, 16, ...).
    """
    _check_subset("dp_kinds", dp_kinds, DP_KINDS)
    _check_subset("tp_kinds", tp_kinds, ("1d", "2d"))
    _check_subset("recompute", recompute, (False, True))
    if max_tp is not None and not _power_of_two(max_tp):
        raise plan_error("max_tp", max_tp, "a power of two (or None for no limit)")
    plain = [k for k in dp_kinds if k != "fsdp"]
    out: list[LayerStrategy] = []
    for levels in _stage_trees(devices, TREE_METHODS, True):
        degree = dict(levels)
        t = degree.get("tp", 1)
        if max_tp is not None and t > max_tp:
            continue
        names = [m for m, _ in levels]
        consecutive = "tp" not in names or names[-1] == "tp"
        kinds = ["fsdp"] if "sdp" in names and "fsdp" in dp_kinds else ([] if "sdp" in names else plain)
        if "dp" not in names and "sdp" not in names:
            kinds = ["replicate"]  # one replica: nothing to shard, so the tree counts once
        tps = ["none"] if t == 1 else [k for k in tp_kinds if k == "1d" or math.isqrt(t) ** 2 == t]
        out += [LayerStrategy(t, dp, tp, consecutive, rc, devices) for tp in tps for dp in kinds for rc in recompute]
    return tuple(dict.fromkeys(out))


def galvatron_space(devices: int, **options) -> dict[int, tuple[LayerStrategy, ...]]:
    """Per pipeline degree p, the strategies of a stage of ``devices // p`` ranks (22 for 8 devices)."""
    if not _power_of_two(devices):
        raise plan_error("devices", devices, "a power-of-two number of devices")
    return {1 << e: stage_strategies(devices >> e, **options) for e in range(devices.bit_length())}


def for_layer(strategies: Sequence[LayerStrategy], kind: LayerKind) -> tuple[LayerStrategy, ...]:
    """The strategies ``kind`` can run: tensor-parallel ones only in the TP kinds it admits."""
    return tuple(s for s in strategies if s.tp == "none" or s.tp in kind.tp_kinds)


def layer_kinds(layers: Sequence[LayerCost], kinds: Sequence[LayerKind] | Callable[[LayerCost], LayerKind] | None
                ) -> list[LayerKind]:
    """One :class:`LayerKind` per layer: given as a list, by a function of the layer, or guessed from names."""
    if kinds is None or callable(kinds):
        fn = kinds or guess_layer_kind
        found = [fn(layer) for layer in layers]
    else:
        found = list(kinds)
        if len(found) != len(layers):
            raise plan_error("kinds", f"{len(found)} kinds", f"one per layer of the stage ({len(layers)})")
    for i, kind in enumerate(found):
        if not isinstance(kind, LayerKind):
            raise plan_error(f"kinds[{i}]", kind, "a LayerKind (TRANSFORMER, LINEAR, CONV, OTHER or your own)")
    return found


def _check_subset(name: str, values: Sequence, valid: Sequence) -> None:
    if isinstance(values, (str, bytes)) or not values or any(v not in valid for v in values) \
            or any(isinstance(v, bool) != isinstance(valid[0], bool) for v in values):
        raise plan_error(name, values, f"a non-empty list drawn from {', '.join(map(str, valid))}")
