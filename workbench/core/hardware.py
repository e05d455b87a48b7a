"""The hardware catalogue: every device, link and cluster preset the workbench names, one record per name.

The planner (``planning.costs.clusters``), the profiler's projection
(``profiling.devices``, which adds this machine's measured CPU as
``local-cpu``) and the benchmarks all read these tables; no other module
defines a device or a link under one of these names.

**Devices** (:data:`DEVICES`). ``V100``, ``V100-PCIe``, ``A100``, ``H100``
and ``H200`` (:data:`DATASHEET_DEVICES`) carry *datasheet* numbers: dense
peak throughput per dtype from the vendors' datasheets (SXM parts unless the
name says PCIe), memory size and memory bandwidth. Their ``efficiency``
(0.5, the fraction of peak real layers reach) is an assumption the
projection uses, not a datasheet figure, and ``winograd`` says which dtypes
cuDNN runs 3x3 convolutions in by Winograd. ``cpu-2core`` is the 2-core
development machine in round figures (0.2 TFLOP/s, 8 GiB, 20 GB/s); plans on
it time compute from profiles measured there, so its numbers mostly size
memory.

**Links** (:data:`LINKS`) are alpha-beta numbers (latency in microseconds,
bandwidth in GB/s) that are *achieved*, never signalling rates: what one
GPU's messages or a collective reach in practice. ``gloo-loopback`` (a send
between two gloo processes) and ``gloo-allreduce`` (the bus bandwidth of
gloo's ring all-reduce) were measured on the 2-core development machine;
``host-staged`` (ranks sharing a GPU exchanging through host memory over
gloo) takes the loopback figure until a GPU machine's is measured; the GPU
links are typical achieved figures per GPU, below the signalling rates of
their specifications (:data:`LINK_DATASHEETS`, which names each source);
their latencies are assumptions of the order NCCL reaches, no datasheet
gives them. :mod:`workbench.runtime.commbench` measures real ones; a
measured link belongs in a cluster file.

**Cluster presets** (:data:`PRESETS`): :class:`ClusterPreset` records naming
their device and links; :meth:`ClusterPreset.cluster` builds the
:class:`~workbench.core.costs.ClusterSpec`, whose ``collective_link`` is the
preset's ``collective`` (the link all-reduces reach when it differs from
point-to-point). The multi-node H100 presets (``2x8xH100-IB`` to
``128x8xH100-IB``) are DGX H100-like nodes on InfiniBand NDR,
``32x8xA100-IB`` DGX A100-like nodes on HDR, and ``4pod-32x8xH100`` puts
128 H100 nodes in 4 pods joined by a slower link
(:class:`~workbench.core.pods.PodClusterSpec`). GPU presets charge an
overlap slowdown of :data:`DATASHEET_OVERLAP_SLOWDOWN`; the CPU presets
time-share their cores (``shared_compute``) with the overlap slowdown and
per-step collective cost measured on the 2-core machine.

To add a device, a link or a preset, add one record to :data:`DATASHEET_DEVICES`
(or :data:`DEVICES`), :data:`LINKS` or :data:`PRESETS`; a preset names only
devices and links these tables hold (checked when the module loads), and a
name may appear once per table. ``planning.costs.clusters.get_cluster(name)``, the
CLI's ``--cluster`` and ``profiling.projection.project(costs, name)`` pick
them up. ``tests/core/test_hardware.py`` refuses a second definition of a
catalogued name anywhere in the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, TypeVar

from .costs import ClusterSpec, DeviceSpec, LinkSpec
from .pods import PodClusterSpec

__all__ = ["GIB", "DATASHEET_DEVICES", "DEVICES", "LINKS", "LINK_DATASHEETS", "PRESETS", "ClusterPreset", "get_device",
           "get_link", "lookup", "get_preset", "DATASHEET_OVERLAP_SLOWDOWN", "LOCAL_OVERLAP_SLOWDOWN",
           "LOCAL_COLLECTIVE_CALL_MS"]

GIB = 1024 ** 3

_Record = TypeVar("_Record")


def _by_name(*records: _Record) -> dict[str, _Record]:
    """Name -> record, refusing a name given twice."""
    table: dict[str, _Record] = {}
    for record in records:
        name = record.name  # type: ignore[attr-defined]
        if name in table:
            raise ValueError(f"{type(record).__name__} {name!r} is defined twice in the hardware catalogue")
        table[name] = record
    return table


# cuDNN runs float32 3x3 stride-1 convolutions by Winograd F(2x2, 3x3): 16 multiplies where the direct
# convolution does 36. Tensor-core dtypes run them as implicit GEMMs (direct count).
_WINOGRAD_FP32 = {"float32": 2.25}
_HOPPER = {"float32": 66.9, "tfloat32": 494.7, "float16": 989.4, "bfloat16": 989.4, "float8": 1978.9}

DATASHEET_DEVICES: dict[str, DeviceSpec] = _by_name(
    DeviceSpec("V100", {"float32": 15.7, "float16": 125.0}, 32 * GIB, 900.0, efficiency=0.5,
               winograd=_WINOGRAD_FP32),
    # The PCIe card runs at a lower boost clock (1380 vs 1530 MHz) than the SXM2 module above.
    DeviceSpec("V100-PCIe", {"float32": 14.0, "float16": 112.0}, 32 * GIB, 900.0, efficiency=0.5,
               winograd=_WINOGRAD_FP32),
    # A100 SXM 80GB datasheet: 312 TFLOP/s bf16/fp16 dense, 156 tf32, 19.5 fp32; 80 GB HBM2e at 2,039 GB/s.
    DeviceSpec("A100", {"float32": 19.5, "tfloat32": 156.0, "float16": 312.0, "bfloat16": 312.0}, 80 * GIB, 2039.0,
               efficiency=0.5, winograd=_WINOGRAD_FP32),
    # H100 SXM5 datasheet: 989 TFLOP/s bf16/fp16 dense (_HOPPER), 80 GB HBM3 at 3.35 TB/s.
    DeviceSpec("H100", dict(_HOPPER), 80 * GIB, 3350.0, efficiency=0.5, winograd=_WINOGRAD_FP32),
    # The H100 SXM's compute with 141 GB of HBM3e at 4.8 TB/s.
    DeviceSpec("H200", dict(_HOPPER), 141 * 10 ** 9, 4800.0, efficiency=0.5, winograd=_WINOGRAD_FP32),
)

DEVICES: dict[str, DeviceSpec] = _by_name(
    *DATASHEET_DEVICES.values(),
    DeviceSpec("cpu-2core", {"float32": 0.2}, 8 * GIB, 20.0, efficiency=0.5),
)

LINKS: dict[str, LinkSpec] = _by_name(
    # measured on the 2-core development machine
    LinkSpec("gloo-loopback", latency_us=70.0, bandwidth_gbs=4.4),   # a send between 2 gloo processes
    LinkSpec("gloo-allreduce", latency_us=70.0, bandwidth_gbs=1.2),  # gloo's ring all-reduce, bus bandwidth
    # ranks sharing a GPU through host memory (workbench.runtime.staging): the loopback figure, the copies between
    # the GPU and host memory not counted, until a GPU machine's bench/bench_gpu.py figure is put in a cluster file
    LinkSpec("host-staged", latency_us=70.0, bandwidth_gbs=4.4),
    # typical achieved per-GPU figures (what NCCL reaches, not the signalling rate; LINK_DATASHEETS has the rates)
    LinkSpec("pcie3", latency_us=10.0, bandwidth_gbs=10.0),      # x16, through the host
    LinkSpec("pcie4", latency_us=10.0, bandwidth_gbs=22.0),
    LinkSpec("pcie5", latency_us=10.0, bandwidth_gbs=45.0),
    LinkSpec("nvlink2", latency_us=5.0, bandwidth_gbs=45.0),     # V100 SXM2
    LinkSpec("nvlink3", latency_us=5.0, bandwidth_gbs=200.0),    # A100 SXM, NVSwitch
    LinkSpec("nvlink4", latency_us=5.0, bandwidth_gbs=350.0),    # H100 SXM, NVSwitch
    LinkSpec("infiniband-hdr", latency_us=6.0, bandwidth_gbs=22.0),   # 200 Gb/s per GPU
    LinkSpec("infiniband-ndr", latency_us=10.0, bandwidth_gbs=45.0),  # 400 Gb/s per GPU
    # Between the pods of a fabric whose upper tier is tapered 2:1 (an assumption, not a datasheet: a DGX
    # SuperPOD's own compute fabric is a non-blocking fat tree; machines built of several pods often taper the
    # tier that joins them): half the NDR figure per GPU when every GPU sends across at once, and 1 us more for
    # the two further switch hops (a switch's port-to-port latency is well under a microsecond).
    LinkSpec("infiniband-ndr-2to1", latency_us=11.0, bandwidth_gbs=22.5),
    LinkSpec("ethernet-100g", latency_us=30.0, bandwidth_gbs=10.0),
)

# The signalling rate of a link per GPU and direction (GB/s), from its public specification: what an achieved
# figure of LINKS stays below. The latencies of LINKS are no datasheet figure: they are the order of what one
# NCCL message costs (a few microseconds of software and DMA set-up, more across a network adapter), assumed.
LINK_DATASHEETS: dict[str, tuple[float, str]] = {
    "pcie3": (15.75, "PCIe 3.0 x16: 8 GT/s x 16 lanes, 128b/130b"),
    "pcie4": (31.5, "PCIe 4.0 x16: 16 GT/s x 16 lanes"),
    "pcie5": (63.0, "PCIe 5.0 x16: 32 GT/s x 16 lanes"),
    "nvlink2": (150.0, "V100 SXM2 datasheet: NVLink 300 GB/s bidirectional"),
    "nvlink3": (300.0, "A100 SXM datasheet: NVLink 600 GB/s bidirectional, through NVSwitch in an HGX A100 8-GPU"),
    "nvlink4": (450.0, "H100 SXM datasheet: NVLink 900 GB/s bidirectional, through NVSwitch in an HGX H100 8-GPU"),
    "infiniband-hdr": (25.0, "HDR InfiniBand 200 Gb/s per port; DGX A100: one ConnectX-6 port per GPU"),
    "infiniband-ndr": (50.0, "NDR InfiniBand 400 Gb/s per port; DGX H100: one ConnectX-7 port per GPU rail"),
    "infiniband-ndr-2to1": (25.0, "NDR 400 Gb/s per port through a tier tapered 2:1 (assumed, see LINKS)"),
}


def lookup(table: Mapping[str, Any], item: Any, what: str, spec_type: type) -> Any:
    """``table[item]`` for a name, ``item`` itself for a spec; an unknown name lists the known ones."""
    if isinstance(item, spec_type):
        return item
    if item not in table:
        raise ValueError(f"unknown {what} {item!r}; known {what}s: {', '.join(table)} (or pass a "
                         f"{spec_type.__name__})")
    return table[item]


def get_device(device: DeviceSpec | str) -> DeviceSpec:
    """A catalogued device by name (a ``DeviceSpec`` is returned as it is)."""
    return lookup(DEVICES, device, "device", DeviceSpec)


def get_link(link: LinkSpec | str) -> LinkSpec:
    """A catalogued link by name (a ``LinkSpec`` is returned as it is)."""
    return lookup(LINKS, link, "link", LinkSpec)


# GPU presets: compute and an NCCL collective running at once on one GPU share its SMs and memory bandwidth, and
# each slows down. The coefficient Galvatron profiles for this lies in 1.1-1.3; the presets take the middle.
# A measured value belongs in a cluster JSON file (``overlap_slowdown``).
DATASHEET_OVERLAP_SLOWDOWN = 1.2
# Measured on the 2-core project machine at load 3 (bench/bench_planner.py --parts overlap; bench/RESULTS.md).
LOCAL_OVERLAP_SLOWDOWN = 1.7
# What one small gloo collective of one step (a broadcast between 2 ranks) costs a rank of 4 time-sharing the
# 2 cores (same probe, quiet machine: 0.81 and 0.86 ms in two runs; 1.21 ms with other work on the cores;
# bench/RESULTS.md); charged per step of a collective (a 4-rank ring all-reduce has 6).
LOCAL_COLLECTIVE_CALL_MS = 0.85


@dataclass(frozen=True)
class ClusterPreset:
    """A named machine: ``num_nodes`` nodes of ``devices_per_node`` ``device``s, by catalogue names.

    ``intra_node`` / ``inter_node``: the links inside a node and between
    nodes (None for one node); ``collective``: the link all-reduces reach
    when it differs from point-to-point (None: the node's links).
    ``shared_compute``: the ranks are processes time-sharing the node's CPU
    cores. ``overlap_slowdown`` and ``collective_call_ms`` as in
    :class:`~workbench.core.costs.ClusterSpec`. ``nodes_per_pod`` with
    ``inter_pod``: the nodes sit in pods of that many, joined by that link
    (``inter_node`` then joins the nodes of one pod), a
    :class:`~workbench.core.pods.PodClusterSpec`.
    """

    name: str
    num_nodes: int
    devices_per_node: int
    device: str
    intra_node: str
    inter_node: str | None = None
    collective: str | None = None
    shared_compute: bool = False
    overlap_slowdown: float = DATASHEET_OVERLAP_SLOWDOWN
    collective_call_ms: float = 0.0
    nodes_per_pod: int | None = None
    inter_pod: str | None = None

    def __post_init__(self) -> None:
        get_device(self.device)
        for field_name in ("intra_node", "inter_node", "collective", "inter_pod"):
            if getattr(self, field_name) is not None:
                get_link(getattr(self, field_name))

    def cluster(self) -> ClusterSpec:
        """The preset as the ``ClusterSpec`` the planner and the simulator reason with."""
        args = (self.name, self.num_nodes, self.devices_per_node, DEVICES[self.device], LINKS[self.intra_node],
                LINKS[self.inter_node] if self.inter_node else None)
        options = dict(overlap_slowdown=self.overlap_slowdown, shared_compute=self.shared_compute,
                       collective_call_ms=self.collective_call_ms,
                       collective_link=LINKS[self.collective] if self.collective else None)
        if self.nodes_per_pod is None:
            return ClusterSpec(*args, **options)
        return PodClusterSpec(*args, **options, nodes_per_pod=self.nodes_per_pod,
                              inter_pod=LINKS[self.inter_pod] if self.inter_pod else None)


def _local(name: str) -> ClusterPreset:
    """This machine: up to 8 gloo processes (beyond its cores, they share them)."""
    return ClusterPreset(name, 1, 8, "cpu-2core", "gloo-loopback", collective="gloo-allreduce", shared_compute=True,
                         overlap_slowdown=LOCAL_OVERLAP_SLOWDOWN, collective_call_ms=LOCAL_COLLECTIVE_CALL_MS)


PRESETS: dict[str, ClusterPreset] = _by_name(
    _local("local-cpu"),
    _local("local"),  # planning.costs.clusters replaces it by the calibration file commbench's links were saved to
    ClusterPreset("8xV100-PCIe", 1, 8, "V100-PCIe", "pcie3"),
    ClusterPreset("4xV100-NVLink", 1, 4, "V100", "nvlink2"),
    ClusterPreset("8xA100-NVLink", 1, 8, "A100", "nvlink3"),
    ClusterPreset("2x8xH100-IB", 2, 8, "H100", "nvlink4", "infiniband-ndr"),
    # DGX H100-like nodes (8 H100 SXM on NVSwitch, one NDR port per GPU) on a non-blocking NDR fabric
    *(ClusterPreset(f"{n}x8xH100-IB", n, 8, "H100", "nvlink4", "infiniband-ndr") for n in (4, 8, 16, 32, 64, 128)),
    # a DGX SuperPOD of DGX A100-like nodes (8 A100 SXM on NVSwitch, one HDR port per GPU)
    ClusterPreset("32x8xA100-IB", 32, 8, "A100", "nvlink3", "infiniband-hdr"),
    # 4 pods of 32 H100 nodes (the size of a DGX SuperPOD's scalable unit): non-blocking NDR inside a pod, the
    # tier between pods tapered 2:1 (infiniband-ndr-2to1)
    ClusterPreset("4pod-32x8xH100", 128, 8, "H100", "nvlink4", "infiniband-ndr", nodes_per_pod=32,
                  inter_pod="infiniband-ndr-2to1"),
    # one GPU: with more ranks than GPUs, plan on planning.costs.clusters.share_gpus(get_cluster(...), ranks_per_gpu)
    ClusterPreset("1xH100", 1, 1, "H100", "nvlink4"),
    ClusterPreset("1xH200", 1, 1, "H200", "nvlink4"),
)


def get_preset(name: str) -> ClusterPreset:
    """The cluster preset called ``name``."""
    if name not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name]
