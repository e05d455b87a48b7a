"""What the planner is asked, as typed values: the workload, the budget on the cluster, and how to search.

:func:`~workbench.planning.strategy.search.plan` takes a :class:`Workload`
(what is trained), a cluster (a :class:`~workbench.core.costs.ClusterSpec`,
a preset name or a cluster file), a :class:`Budget` (what the plan may use
of the cluster) and :class:`SearchOptions` (which strategies to consider,
how many to simulate and keep, and the cost model's adjustments)::

    plan(Workload(costs, 64, shape=shape), "8xV100-PCIe", Budget(memory_cap_gib=16, world_size=4),
         SearchOptions(kinds=("dp", "pipeline"), fine_grained=True))

Each value is frozen and checks its fields when it is made: a wrong one is
refused with a one-line ``ValueError`` naming the field. Sequences are kept
as tuples, so a value can be reused and compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ...core.costs import ModelCosts
from ...core.fields import boolean, check_bool, check_int, check_number, integer
from ...core.plan import ParallelPlan
from ...scheduling.stagecosts import OPTIMIZER_STATE_FACTORS, for_optimizer
from ..costs.compute_scaling import RuntimeCalibration
from ..costs.estimate import GIB
from ..costs.tensor_costs import TransformerShape
from ..layerwise.layer_strategies import OTHER, LayerKind, layer_kinds
from .space import STRATEGY_KINDS

__all__ = ["Workload", "Budget", "SearchOptions"]


def _ints(owner: str, name: str, values: Iterable[int] | None) -> tuple[int, ...] | None:
    """``values`` as a non-empty tuple of ints >= 1 (None stays None), else a ValueError naming the field."""
    if values is None:
        return None
    out = tuple(values) if not isinstance(values, (str, bytes)) and isinstance(values, Iterable) else (values,)
    if not out or not all(integer(1).accepts(v) for v in out):
        raise ValueError(f"{owner}.{name} must be ints >= 1, got {list(out)}")
    return out


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # normalising a field of a frozen value while it is made


@dataclass(frozen=True)
class Workload:
    """What is trained: the profiled model, the global batch, and what the cost model needs besides.

    ``costs``: a :class:`~workbench.core.costs.ModelCosts` or its JSON file
    (loaded here). ``shape``: the sizes of a GPT-2, which the uniform
    tensor-parallel plans (``tp1d-*``, ``tp2d-*``) need: the runtime shards
    nothing else whole (:mod:`workbench.core.tensor_support`), so give none
    for another model (:func:`~workbench.planning.strategy.search.
    transformer_shape` reads it from a config). ``tp_limits``: per layer, the
    largest tensor-parallel degree (a power of two) the layer-by-layer runtime
    splits it by, 1 for a layer it does not split
    (``workbench.runtime.layer_parallel.tensor_parallel_limits`` reads them off
    a model); None: the per-layer search judges the layers by their names.
    ``optimizer``: whose state the memory counts (``adam``, ``sgd-momentum``,
    ``sgd``).
    """

    costs: ModelCosts
    global_batch: int
    shape: TransformerShape | None = None
    optimizer: str = "adam"
    tp_limits: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.costs, (str, Path)) and Path(self.costs).is_file():
            _set(self, "costs", ModelCosts.load(self.costs))
        if not isinstance(self.costs, ModelCosts):
            raise ValueError(f"Workload.costs must be a ModelCosts or a ModelCosts JSON file, got {self.costs!r}; "
                             f"profile a zoo model first (workbench profile NAME, or `workbench plan NAME` which "
                             f"profiles it)")
        check_int("Workload.global_batch", self.global_batch, 1)
        if self.shape is not None and not isinstance(self.shape, TransformerShape):
            raise ValueError(f"Workload.shape must be a TransformerShape or None, got {self.shape!r}")
        if self.optimizer not in OPTIMIZER_STATE_FACTORS:
            raise ValueError(f"Workload.optimizer must be one of {sorted(OPTIMIZER_STATE_FACTORS)}, "
                             f"got {self.optimizer!r}")
        _set(self, "costs", for_optimizer(self.costs, self.optimizer))
        limits = _ints("Workload", "tp_limits", self.tp_limits)
        if limits is not None and (len(limits) != self.costs.num_layers or any(v & (v - 1) for v in limits)):
            raise ValueError(f"Workload.tp_limits must be one power of two per layer of the model "
                             f"({self.costs.num_layers}), got {list(limits)}")
        _set(self, "tp_limits", limits)

    def layer_kinds(self) -> list[LayerKind] | None:
        """Each layer's kind for the per-layer search: guessed from its name, with no tensor parallelism where
        ``tp_limits`` says the runtime does not split it; None without ``tp_limits`` (the search guesses)."""
        if self.tp_limits is None:
            return None
        guessed = layer_kinds(self.costs.layers, None)
        return [kind if limit > 1 or not kind.tp_kinds else OTHER for kind, limit in zip(guessed, self.tp_limits)]

    def max_layer_tp(self, devices_per_node: int) -> int | None:
        """The largest tensor-parallel degree the per-layer search may give a layer: the least of the runtime's
        limits over the layers it may split, at most the node's devices (the search's default); 1 when it may split
        none; None without ``tp_limits``."""
        kinds = self.layer_kinds()
        if kinds is None:
            return None
        node = 1 << (devices_per_node.bit_length() - 1)
        return min([node] + [limit for kind, limit in zip(kinds, self.tp_limits) if kind.tp_kinds]) \
            if any(kind.tp_kinds for kind in kinds) else 1


@dataclass(frozen=True)
class Budget:
    """What a plan may use of the cluster: memory per device (GiB; None: the device's own memory) and devices
    (None: all of the cluster's)."""

    memory_cap_gib: float | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        if self.memory_cap_gib is not None:
            check_number("Budget.memory_cap_gib", self.memory_cap_gib, 0, strict=True,
                         expected="a number > 0 (GiB per device)")
        if self.world_size is not None:
            check_int("Budget.world_size", self.world_size, 1, expected="an int >= 1 or None")

    @property
    def memory_cap_bytes(self) -> int | None:
        return int(self.memory_cap_gib * GIB) if self.memory_cap_gib is not None else None

    def devices(self, cluster) -> int:
        """How many of ``cluster``'s devices the plan uses; refused when the cluster has fewer."""
        world = cluster.world_size if self.world_size is None else self.world_size
        if world > cluster.world_size:
            raise ValueError(f"world_size={world} is more devices than cluster {cluster.name!r} has "
                             f"({cluster.world_size})")
        return world


Calibration = RuntimeCalibration | str | Path


@dataclass(frozen=True)
class SearchOptions:
    """How the planner searches, and what it adjusts its cost model by.

    Which strategies: ``kinds`` (families of :data:`~.space.STRATEGY_KINDS`),
    ``recompute`` (with and / or without activation recomputation),
    ``microbatch_options`` (micro-batch counts; None: powers of two and
    multiples of the stage count), ``pipeline_degrees`` (only these; 1 is no
    pipeline; also in the per-layer search), or exactly ``strategies``
    (plan names or :class:`~workbench.core.plan.ParallelPlan`; each is
    simulated, and the other choices are ignored). ``fine_grained``: also
    per-layer plans (and per-layer recomputation of pipelines that miss the
    budget). ``simulate_top``: how many of the fastest projections are
    simulated; ``top``: how many feasible plans to keep (None: all).

    The cost model: ``background_load``, on clusters whose ranks share the
    node's cores (``local``), the other runnable work there (e.g.
    ``os.getloadavg()[0]`` before launching); ``calibration``, one or more
    :class:`~workbench.planning.costs.compute_scaling.RuntimeCalibration` or
    directories of finished runs of the model, whose measured compute scales
    the profile's, each runtime family by its own runs (a family without any
    by the scheduled one's; runs at two or more micro-batch sizes fit its
    per-micro-batch cost). None: the profile's own micro-batch passes, where
    it has them. A tensor-parallel run also needs the workload's ``shape``.

    ``fewer_ranks``: on a cluster whose ranks share the node's cores, the
    budget's world size is an upper bound, and the search also ranks plans on
    every power of two fewer ranks (:mod:`.world_sizes`); False plans exactly
    that many. A search over given ``strategies`` never does.
    """

    kinds: tuple[str, ...] = STRATEGY_KINDS
    recompute: tuple[bool, ...] = (False, True)
    microbatch_options: tuple[int, ...] | None = None
    pipeline_degrees: tuple[int, ...] | None = None
    strategies: tuple[ParallelPlan, ...] | None = None
    fine_grained: bool = False
    simulate_top: int = 12
    top: int | None = None
    background_load: float = 0.0
    calibration: tuple[Calibration, ...] | None = None
    fewer_ranks: bool = True

    def __post_init__(self) -> None:
        self._check_space()
        check_bool("SearchOptions.fine_grained", self.fine_grained)
        check_bool("SearchOptions.fewer_ranks", self.fewer_ranks)
        check_int("SearchOptions.simulate_top", self.simulate_top, 0)
        if self.top is not None:
            check_int("SearchOptions.top", self.top, 1, expected="an int >= 1 or None")
        check_number("SearchOptions.background_load", self.background_load, 0,
                     expected="a number >= 0 (runnable processes)")
        self._check_calibration()

    def _check_space(self) -> None:
        kinds = (self.kinds,) if isinstance(self.kinds, str) else tuple(self.kinds)
        if not kinds or set(kinds) - set(STRATEGY_KINDS):
            raise ValueError(f"SearchOptions.kinds must be some of {STRATEGY_KINDS}, got {list(kinds)}")
        recompute = tuple(self.recompute)
        if not recompute or not all(boolean().accepts(r) for r in recompute):
            raise ValueError(f"SearchOptions.recompute must be one or both of False, True, got {list(recompute)}")
        _set(self, "kinds", kinds)
        _set(self, "recompute", recompute)
        _set(self, "microbatch_options", _ints("SearchOptions", "microbatch_options", self.microbatch_options))
        _set(self, "pipeline_degrees", _ints("SearchOptions", "pipeline_degrees", self.pipeline_degrees))
        if self.strategies is not None:
            given = (self.strategies,) if isinstance(self.strategies, (str, ParallelPlan)) else tuple(self.strategies)
            if not all(isinstance(s, (str, ParallelPlan)) for s in given):
                raise ValueError(f"SearchOptions.strategies must be plan names or ParallelPlans, got {list(given)}")
            _set(self, "strategies", tuple(s if isinstance(s, ParallelPlan) else ParallelPlan.parse(s)
                                           for s in given))

    def _check_calibration(self) -> None:
        if self.calibration is None:
            return
        given = (self.calibration,) if isinstance(self.calibration, (RuntimeCalibration, str, Path)) \
            else tuple(self.calibration)
        if not all(isinstance(c, (RuntimeCalibration, str, Path)) for c in given):
            raise ValueError(f"SearchOptions.calibration must be RuntimeCalibrations or run directories, "
                             f"got {list(given)}")
        _set(self, "calibration", given)
