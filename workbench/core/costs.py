"""What things cost: per-layer model costs, devices, links and clusters.

These are the numbers the partitioner, the simulator and the planner reason
with. They are deliberately plain values with a JSON form, because a
``ModelCosts`` file is a public format: the profiler writes it, researchers
write it by hand or from other tools, and every downstream room reads it.

Units, everywhere: milliseconds for time, bytes for sizes, FLOPs as integer
counts, link bandwidth in GB/s (1e9 bytes per second) and latency in
microseconds (the alpha-beta model: ``t = latency + bytes / bandwidth``).

``ModelCosts`` JSON (version 2)::

    {"version": 2, "model": "resnet18", "batch_size": 32, "device": "cpu",
     "layers": [{"name": "stem", "forward_ms": 3.1, "backward_ms": 6.0,
                 "input_grad_ms": 2.9, "weight_grad_ms": 3.4,
                 "flops": 118013952, "param_bytes": 37888,
                 "activation_bytes": 6422528, "saved_bytes": 12845056}, ...]}

Required per layer: ``name``, ``forward_ms``, ``backward_ms``. Everything
else defaults sensibly (0 bytes, gradient bytes = parameter bytes).

Version 2 adds the split backward of zero-bubble pipeline schedules:
``backward_ms`` stays the fused backward as measured; the optional
``input_grad_ms`` (I: the input gradient the previous stage waits for) and
``weight_grad_ms`` (W: the parameter gradients only the optimizer step needs)
are the two timed apart, both or neither. They need not add up to
``backward_ms`` (each walks the part of the graph it needs, the fused pass
walks it once). :attr:`LayerCost.split_backward_ms` reads them, or falls back.
Version 3 adds the optional ``batch_fit``: every layer's times at several
batch sizes, interpolated between them (:class:`~workbench.core.batch_fit.
BatchFit`), read for a micro-batch of any size; the layers are the profile at
``batch_size``, one of its sizes. Without it (every version 1 and 2 file)
times scale linearly with the batch. Versions 1 (no split fields) and 2
still load; files are written as version 3.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

from .batch_fit import BatchFit, check_fit, rebase
from .fields import (ErrorForm, at_least, check, check_bool, check_int, check_number, check_str, field_error, integer,
                     is_int, number, optional, reject_unknown, spec, validate)
from .fields import from_dict as _from_dict
from .fields import to_dict as _to_dict

__all__ = ["LayerCost", "ModelCosts", "DeviceSpec", "LinkSpec", "ClusterSpec", "COSTS_VERSION",
           "READABLE_VERSIONS"]

COSTS_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # 1: no split backward (input_grad_ms, weight_grad_ms); 1 and 2: no batch_fit
_SPLIT_FIELDS = ("input_grad_ms", "weight_grad_ms", "input_grad_ms_spread", "weight_grad_ms_spread")


costs_error: ErrorForm = field_error("costs")
# a time or size of a costs file: the type first, then the bound, each refused with its own words
_TIME = number(finite=True).then(at_least(0))
_POSITIVE = number(finite=True).then(at_least(0, strict=True))
_BYTES = integer(expected="a finite int").then(at_least(0))
_COUNT = integer(expected="a finite int").then(at_least(0, strict=True))


@dataclass(frozen=True)
class LayerCost:
    """Cost of one partitionable layer at the profile's batch size.

    ``activation_bytes`` is the layer's output for the whole batch (what a
    stage boundary after this layer sends), ``saved_bytes`` what autograd keeps
    for the backward pass, ``optimizer_bytes`` the optimizer state (None: let
    the consumer derive it from its optimizer choice).

    ``backward_ms`` is the fused backward; ``input_grad_ms`` (I) and
    ``weight_grad_ms`` (W) its two parts timed apart, together or not at all
    (None: not measured). Read them through :attr:`split_backward_ms`.
    """

    name: str
    forward_ms: float = spec(rule=_TIME)
    backward_ms: float = spec(rule=_TIME)
    flops: int = spec(0, _BYTES)
    param_bytes: int = spec(0, _BYTES)
    activation_bytes: int = spec(0, _BYTES)
    saved_bytes: int = spec(0, _BYTES)
    grad_bytes: int | None = spec(None, optional(_BYTES))
    optimizer_bytes: int | None = spec(None, optional(_BYTES))
    forward_ms_spread: float = spec(0.0, _TIME)
    backward_ms_spread: float = spec(0.0, _TIME)
    peak_bytes: int = spec(0, _BYTES)
    num_params: int = spec(0, _BYTES)
    input_grad_ms: float | None = spec(None, optional(_TIME))
    weight_grad_ms: float | None = spec(None, optional(_TIME))
    input_grad_ms_spread: float = spec(0.0, _TIME)
    weight_grad_ms_spread: float = spec(0.0, _TIME)

    def __post_init__(self) -> None:
        check_str("LayerCost.name", self.name, empty=False, expected="a non-empty str")
        owner = f"LayerCost[{self.name}]"
        validate(self, f"{owner}.")
        self._check_split(owner)
        if self.grad_bytes is None:
            object.__setattr__(self, "grad_bytes", self.param_bytes)

    def _check_split(self, owner: str) -> None:
        pair = ("input_grad_ms", "weight_grad_ms")
        for name, other in (pair, pair[::-1]):
            if getattr(self, name) is not None:
                continue
            if getattr(self, other) is not None:
                raise ValueError(f"{owner}.{name} is missing: input_grad_ms and weight_grad_ms are given "
                                 f"together or not at all, got only {other}")
            elif getattr(self, f"{name}_spread") != 0:
                raise ValueError(f"{owner}.{name}_spread is {getattr(self, f'{name}_spread')!r} but {name} was "
                                 "not measured")

    @property
    def compute_ms(self) -> float:
        """Forward plus backward time."""
        return self.forward_ms + self.backward_ms

    @property
    def has_split_backward(self) -> bool:
        """Whether I and W were measured (rather than derived by :attr:`split_backward_ms`)."""
        return self.input_grad_ms is not None

    @property
    def split_backward_ms(self) -> tuple[float, float]:
        """``(I, W)``: the measured input- and weight-gradient times, else a fallback from ``backward_ms``.

        Fallback: a layer without trainable parameters (``grad_bytes`` 0, as
        is a hand-written layer that gives no ``param_bytes``) is all I,
        ``(backward_ms, 0)``; one with them splits ``backward_ms`` in half,
        because a linear layer's backward is two matrix products of the same
        size (output gradient times weight for I, times input for W), the best
        guess without a measurement. A measured pair need not sum to
        ``backward_ms``; the fallback does.
        """
        if self.input_grad_ms is not None and self.weight_grad_ms is not None:
            return float(self.input_grad_ms), float(self.weight_grad_ms)
        if not self.grad_bytes:
            return float(self.backward_ms), 0.0
        return self.backward_ms / 2, self.backward_ms / 2

    def to_dict(self) -> dict[str, Any]:
        drop = set(_SPLIT_FIELDS) if self.input_grad_ms is None else set()  # unmeasured: no split fields at all
        return {k: v for k, v in asdict(self).items() if v is not None and k not in drop}

    @classmethod
    def from_dict(cls, data: dict[str, Any], version: int = COSTS_VERSION) -> "LayerCost":
        """A layer from its JSON object in file format ``version`` (version 1 has no split fields)."""
        if not isinstance(data, dict):
            raise ValueError(f"a layer must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("name", "forward_ms", "backward_ms") if k not in data]
        if missing:
            raise ValueError(f"layer {data.get('name', '?')!r} is missing required fields {missing}")
        reject_unknown(data, [f.name for f in fields(cls)], f"LayerCost[{data['name']}].", costs_error)
        split = sorted(set(data) & set(_SPLIT_FIELDS))
        if version == 1 and split:
            raise ValueError(f"layer {data.get('name', '?')!r} of a version 1 file has the version 2 fields {split}; "
                             f"write it as version {COSTS_VERSION}")
        return cls(**data)


@dataclass(frozen=True)
class ModelCosts:
    """Per-layer costs of a model at one batch size on one device (``batch_fit``: also at others)."""

    model: str
    batch_size: int
    device: str
    layers: tuple[LayerCost, ...]
    dtype: str = "float32"
    input_bytes: int = 0
    version: int = COSTS_VERSION
    meta: dict[str, Any] = field(default_factory=dict)
    batch_fit: BatchFit | None = None

    def __post_init__(self) -> None:
        if self.version != COSTS_VERSION:  # older files are upgraded by from_dict
            raise ValueError(f"ModelCosts.version must be {COSTS_VERSION}, got {self.version!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"ModelCosts.model must be a non-empty str, got {self.model!r}")
        check("ModelCosts.batch_size", self.batch_size, _COUNT)
        check("ModelCosts.input_bytes", self.input_bytes, _BYTES)
        layers = tuple(LayerCost.from_dict(l) if isinstance(l, dict) else l for l in self.layers)
        if not layers:
            raise ValueError("ModelCosts.layers must hold at least one layer, got none")
        for i, layer in enumerate(layers):
            if not isinstance(layer, LayerCost):
                raise ValueError(f"ModelCosts.layers[{i}] must be a LayerCost, got {type(layer).__name__}")
        object.__setattr__(self, "layers", layers)
        if isinstance(self.batch_fit, dict):
            object.__setattr__(self, "batch_fit", BatchFit.from_dict(self.batch_fit))
        if self.batch_fit is not None:
            check_fit(self.batch_fit, self.layers, self.batch_size)

    # -- views ------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def names(self) -> list[str]:
        return [l.name for l in self.layers]

    def total(self, attr: str) -> float:
        """Sum of one per-layer field over all layers (``costs.total("flops")``)."""
        return sum(getattr(l, attr) for l in self.layers)

    def column(self, attr: str) -> list[Any]:
        return [getattr(l, attr) for l in self.layers]

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int) -> LayerCost:
        return self.layers[index]

    @property
    def profiled_sizes(self) -> tuple[int, ...]:
        """The batch sizes the times were measured (or projected) at."""
        return self.batch_fit.sizes if self.batch_fit is not None else (self.batch_size,)

    def at_batch(self, batch: int) -> "ModelCosts":
        """This profile as if taken at ``batch`` samples (:func:`~workbench.core.batch_fit.rebase`)."""
        return rebase(self, batch)

    # -- json -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        fit = {"batch_fit": self.batch_fit.to_dict()} if self.batch_fit is not None else {}
        return {"version": self.version, "model": self.model, "batch_size": self.batch_size, "device": self.device,
                "dtype": self.dtype, "input_bytes": self.input_bytes, "meta": self.meta,
                "layers": [l.to_dict() for l in self.layers], **fit}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelCosts":
        if not isinstance(data, dict):
            raise ValueError(f"ModelCosts JSON must be an object, got {type(data).__name__}")
        version = data.get("version")
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            readable = ", ".join(map(str, READABLE_VERSIONS[:-1])) + f" or {READABLE_VERSIONS[-1]}"
            raise ValueError(f"ModelCosts 'version' must be {readable}, got {version!r}")
        missing = [k for k in ("model", "batch_size", "device", "layers") if k not in data]
        if missing:
            raise ValueError(f"ModelCosts JSON is missing required fields {missing}")
        reject_unknown(data, [f.name for f in fields(cls)], "ModelCosts.", costs_error)
        if not isinstance(data["layers"], list):
            raise ValueError("ModelCosts 'layers' must be a list of layer objects")
        layers = tuple(LayerCost.from_dict(l, version) for l in data["layers"])
        if version < 3 and "batch_fit" in data:
            raise ValueError(f"a version {version} ModelCosts file has the version 3 field 'batch_fit'; write it as "
                             f"version {COSTS_VERSION}")
        # an older file is upgraded in memory (its layers have no measured split) and saved as the current version
        return cls(**{**data, "version": COSTS_VERSION, "layers": layers, "meta": dict(data.get("meta") or {})})

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "ModelCosts":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"ModelCosts file is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ModelCosts":
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no ModelCosts file at {str(path)!r}")
        try:
            return cls.from_json(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def uniform(cls, num_layers: int, *, forward_ms: float = 1.0, backward_ms: float = 2.0,
                param_bytes: int = 0, activation_bytes: int = 0, batch_size: int = 1,
                model: str = "uniform", input_grad_ms: float | None = None,
                weight_grad_ms: float | None = None) -> "ModelCosts":
        """Identical layers: the textbook case where bubble formulas are exact.

        ``input_grad_ms`` with ``weight_grad_ms`` give every layer a split
        backward (``forward_ms=1, backward_ms=2, input_grad_ms=1,
        weight_grad_ms=1``: the F = I = W case of zero-bubble schedules).
        """
        check_int("num_layers", num_layers, 1)
        layer = dict(forward_ms=forward_ms, backward_ms=backward_ms, param_bytes=param_bytes,
                     activation_bytes=activation_bytes, saved_bytes=activation_bytes,
                     input_grad_ms=input_grad_ms, weight_grad_ms=weight_grad_ms)
        return cls(model=model, batch_size=batch_size, device="synthetic",
                   layers=tuple(LayerCost(name=f"layer{i}", **layer) for i in range(num_layers)))


@dataclass(frozen=True)
class DeviceSpec:
    """An accelerator (or CPU) as the roofline model sees it.

    ``peak_tflops`` maps a dtype name to peak dense throughput; ``efficiency``
    is the fraction of peak a real layer reaches (used for projection).
    ``winograd`` maps a dtype to how many times fewer multiplies the device's
    library needs for a 3x3 stride-1 convolution than the direct count (cuDNN
    runs them by Winograd F(2x2, 3x3): 2.25); a dtype it does not name runs
    them directly.
    """

    name: str
    peak_tflops: dict[str, float]
    memory_bytes: int
    memory_bandwidth_gbs: float
    efficiency: float = 0.5
    winograd: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DeviceSpec.name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.peak_tflops, dict) or not self.peak_tflops:
            raise ValueError(f"DeviceSpec[{self.name}].peak_tflops must map dtype -> TFLOP/s, got {self.peak_tflops!r}")
        for dtype, value in self.peak_tflops.items():
            check(f"DeviceSpec[{self.name}].peak_tflops[{dtype}]", value, _POSITIVE)
        check(f"DeviceSpec[{self.name}].memory_bytes", self.memory_bytes, _COUNT)
        check(f"DeviceSpec[{self.name}].memory_bandwidth_gbs", self.memory_bandwidth_gbs, _POSITIVE)
        check_number(f"DeviceSpec[{self.name}].efficiency", self.efficiency, 0, 1, strict=True, expected="in (0, 1]")
        if not isinstance(self.winograd, dict):
            raise ValueError(f"DeviceSpec[{self.name}].winograd must map dtype -> reduction, got {self.winograd!r}")
        for dtype, value in self.winograd.items():
            if dtype not in self.peak_tflops:
                raise ValueError(f"DeviceSpec[{self.name}].winograd names dtype {dtype!r}, which has no peak_tflops")
            check_number(f"DeviceSpec[{self.name}].winograd[{dtype}]", value, 1, 4,
                         expected="in [1, 4] (Winograd F(4x4, 3x3) saves at most 4x)")

    def tflops(self, dtype: str = "float32") -> float:
        if dtype not in self.peak_tflops:
            raise ValueError(f"device {self.name} has no peak for dtype {dtype!r}; known: {sorted(self.peak_tflops)}")
        return self.peak_tflops[dtype]

    def winograd_reduction(self, dtype: str = "float32") -> float:
        """How many times fewer multiplies a 3x3 stride-1 convolution needs in ``dtype`` here (1: none)."""
        return float(self.winograd.get(dtype, 1.0))

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DeviceSpec":
        return _from_dict(cls, data, "DeviceSpec.", costs_error, owner="costs")


@dataclass(frozen=True)
class LinkSpec:
    """A communication link in the alpha-beta model."""

    name: str
    latency_us: float
    bandwidth_gbs: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"LinkSpec.name must be a non-empty str, got {self.name!r}")
        check(f"LinkSpec[{self.name}].latency_us", self.latency_us, _TIME)
        check(f"LinkSpec[{self.name}].bandwidth_gbs", self.bandwidth_gbs, _POSITIVE)

    def transfer_ms(self, nbytes: float) -> float:
        """Point-to-point time for one message of ``nbytes``."""
        if nbytes <= 0:
            return 0.0
        return self.latency_us * 1e-3 + nbytes / (self.bandwidth_gbs * 1e9) * 1e3

    def allreduce_ms(self, nbytes: float, group_size: int) -> float:
        """Ring all-reduce: 2(n-1) steps, each moving nbytes/n."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if group_size == 1 or nbytes <= 0:
            return 0.0
        steps = 2 * (group_size - 1)
        return steps * self.latency_us * 1e-3 + steps / group_size * nbytes / (self.bandwidth_gbs * 1e9) * 1e3

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LinkSpec":
        return _from_dict(cls, data, "LinkSpec.", costs_error, owner="costs")


@dataclass(frozen=True)
class ClusterSpec:
    """Homogeneous nodes of identical devices; one link inside a node, one between nodes.

    Ranks are numbered node-major: ranks ``[n*d, (n+1)*d)`` live on node ``n``
    where ``d = devices_per_node``.

    ``overlap_slowdown``: how much slower compute and communication run while
    they overlap on one device (1.0: no interference). ``shared_compute``: the
    ranks of a node time-share one compute device (CPU processes), so
    communication on any of them interferes with compute on all of them.
    ``collective_call_ms``: what each step of a collective costs on top of
    its link time (0 on GPUs). On ranks time-sharing cores, each step of a
    collective (a broadcast among q ranks has q - 1, a ring all-reduce among
    n has 2(n - 1)) waits until both of its ranks have been scheduled, about
    a millisecond when there are more ranks than cores; so does a
    point-to-point message, as far as its receiver's cores are oversubscribed
    when it arrives (the simulator's processor sharing). ``collective_link``:
    the link gradient all-reduces reach when it differs from point-to-point
    (gloo's ring all-reduce is slower than its sends); None: the node's links.
    """

    name: str
    num_nodes: int
    devices_per_node: int
    device: DeviceSpec
    intra_node: LinkSpec
    inter_node: LinkSpec | None = None
    overlap_slowdown: float = 1.0
    shared_compute: bool = False
    collective_call_ms: float = 0.0
    collective_link: LinkSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ClusterSpec.name must be a non-empty str, got {self.name!r}")
        check(f"ClusterSpec[{self.name}].num_nodes", self.num_nodes, _COUNT)
        check(f"ClusterSpec[{self.name}].devices_per_node", self.devices_per_node, _COUNT)
        if isinstance(self.device, dict):
            object.__setattr__(self, "device", DeviceSpec.from_dict(self.device))
        for name in ("intra_node", "inter_node", "collective_link"):
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, LinkSpec.from_dict(value))
            elif not isinstance(value, LinkSpec) and (value is not None or name == "intra_node"):
                raise ValueError(f"ClusterSpec[{self.name}].{name} must be a link (LinkSpec or JSON object), got {value!r}")
        if self.num_nodes > 1 and self.inter_node is None:
            raise ValueError(f"ClusterSpec[{self.name}] has {self.num_nodes} nodes but no inter_node link")
        check_number(f"ClusterSpec[{self.name}].overlap_slowdown", self.overlap_slowdown, 1.0, 4.0,
                     expected="in [1, 4]")
        check_bool(f"ClusterSpec[{self.name}].shared_compute", self.shared_compute)
        check_number(f"ClusterSpec[{self.name}].collective_call_ms", self.collective_call_ms, 0.0, 1000.0,
                     expected="in [0, 1000] ms")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        check_int("rank", rank, 0, self.world_size - 1, expected=f"in [0, {self.world_size - 1}]")
        return rank // self.devices_per_node

    def link(self, a: int, b: int) -> LinkSpec:
        """The link two ranks talk over."""
        if self.node_of(a) == self.node_of(b):
            return self.intra_node
        assert self.inter_node is not None
        return self.inter_node

    def allreduce_call_ms(self, group_size: int) -> float:
        """What a ring all-reduce among ``group_size`` ranks pays beyond its link time: ``collective_call_ms``
        for each of its 2(n - 1) steps."""
        return 2 * (group_size - 1) * self.collective_call_ms if group_size > 1 else 0.0

    def nodes_of(self, ranks: Sequence[int]) -> set[int]:
        """The nodes ``ranks`` are on (each rank checked as :meth:`node_of` checks it, by one pass when all are)."""
        size = self.world_size
        if not all(is_int(r) and 0 <= r < size for r in ranks):
            for r in ranks:
                self.node_of(r)  # raises, naming the first rank out of range
        return {r // self.devices_per_node for r in ranks}

    def group_link(self, ranks: list[int]) -> LinkSpec:
        """The slowest link a collective over ``ranks`` crosses."""
        nodes = self.nodes_of(ranks)
        return self.intra_node if len(nodes) <= 1 else self.inter_node  # type: ignore[return-value]

    def allreduce_link(self, ranks: list[int]) -> LinkSpec:
        """The link an all-reduce over ``ranks`` reaches: ``collective_link``, else the slowest link crossed."""
        return self.collective_link or self.group_link(ranks)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)  # the device and the links as their own dicts, in field order

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ClusterSpec":
        return _from_dict(cls, data, "ClusterSpec.", costs_error, owner="costs")

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "ClusterSpec":
        return cls.from_dict(json.loads(text))
