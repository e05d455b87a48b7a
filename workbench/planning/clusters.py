"""Named cluster presets: the machines the planner and the simulator reason about.

A preset is a plain :class:`~workbench.core.costs.ClusterSpec` built from
published device numbers (peak dense throughput, memory, memory bandwidth)
and typical *achieved* link numbers (not the marketing peak). Collectives
often reach a different bandwidth than one point-to-point message (gloo's
ring all-reduce on this machine's loopback is ~1.2 GB/s bus bandwidth while
a send reaches ~4.4 GB/s), so a preset may also name a ``collective link``
used for all-reduces (:func:`collective_link`).

To add a machine, add a ``DeviceSpec`` to ``DEVICES`` if needed and one
entry to ``_PRESETS``; ``get_cluster(name)`` and the CLI's ``--cluster``
pick it up. A user's own cluster is a ``ClusterSpec`` JSON file
(:func:`load_cluster` takes a preset name or a path; numbers no real machine
has are refused with the field that holds them). The GPU presets charge an
overlap slowdown of ``DATASHEET_OVERLAP_SLOWDOWN`` (1.2) to compute and
collectives that run at the same time on one GPU.

``local-cpu`` and ``local`` are this machine: gloo processes time-sharing
its cores (``shared_compute``), with the overlap slowdown measured by
``bench/bench_planner.py --overlap-probe`` (compute and a gloo all-reduce
running at once on the 2 cores each slow down by about this factor) and the
cost of one step of a small collective among 4 ranks sharing the 2 cores
(``collective_call_ms``: each step waits until both of its ranks are
scheduled; a ring all-reduce among n ranks takes 2(n - 1) steps). The
planner charges the part of it :func:`collective_wait_fraction` gives for
the ranks it plans and the work beside them (none while each has a core).
A point-to-point message is one such step: under processor sharing the
simulator delays it by the same cost, scaled by how oversubscribed the
receiver's cores are when it arrives.
``local`` reads a calibration file written by the communication benchmark
(``workbench.runtime.commbench``, then :func:`save_local_calibration`) when
there is one, else it is ``local-cpu``. :func:`shared_cores` says how many
cores a node's processes share, so the planner can slow compute that runs on
more ranks than cores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..core.costs import ClusterSpec, DeviceSpec, LinkSpec
from ..core.devices import DATASHEET_DEVICES, GIB
from ..scheduling.sharing import CoreSharing, sharing_slowdown, wait_fraction

__all__ = ["DEVICES", "get_cluster", "share_gpus", "HOST_STAGED_LINK", "cluster_names", "collective_link", "collective_wait_fraction", "core_sharing",
           "get_device", "load_cluster",
           "shared_cores", "time_sharing_slowdown", "save_local_calibration", "LOCAL_CALIBRATION", "LOCAL_OVERLAP_SLOWDOWN",
           "LOCAL_COLLECTIVE_CALL_MS", "DATASHEET_OVERLAP_SLOWDOWN"]

# Measured on the 2-core project machine at load 3 (bench/bench_planner.py --parts overlap; bench/RESULTS.md).
LOCAL_OVERLAP_SLOWDOWN = 1.7
# What one small gloo collective of one step (a broadcast between 2 ranks) costs a rank of 4 time-sharing the
# 2 cores (same probe, quiet machine: 0.81 and 0.86 ms in two runs; 1.21 ms with other work on the cores;
# bench/RESULTS.md); charged per step of a collective (a 4-rank ring all-reduce has 6).
LOCAL_COLLECTIVE_CALL_MS = 0.85
# GPU presets: compute and an NCCL collective running at once on one GPU share its SMs and memory bandwidth, and
# each slows down. The coefficient Galvatron profiles for this lies in 1.1-1.3; the presets take the middle.
# A measured value belongs in a cluster JSON file (``overlap_slowdown``).
DATASHEET_OVERLAP_SLOWDOWN = 1.2
LOCAL_CALIBRATION = Path(os.environ.get("WORKBENCH_LOCAL_CLUSTER", Path.home() / ".cache" / "workbench" /
                                        "local-cluster.json"))

DEVICES: dict[str, DeviceSpec] = {
    "cpu-2core": DeviceSpec("cpu-2core", {"float32": 0.2}, 8 * GIB, 20.0, efficiency=0.5),
    **DATASHEET_DEVICES,
}

# name -> (nodes, devices per node, device, intra-node link, inter-node link, collective link or None).
# local-cpu allows up to 8 gloo processes on this one machine (beyond 2 they share its cores).
_PRESETS: dict[str, tuple] = {
    "local-cpu": (1, 8, "cpu-2core", LinkSpec("gloo-loopback", 70.0, 4.4), None,
                  LinkSpec("gloo-allreduce", 70.0, 1.2)),
    "local": (1, 8, "cpu-2core", LinkSpec("gloo-loopback", 70.0, 4.4), None, LinkSpec("gloo-allreduce", 70.0, 1.2)),
    "8xV100-PCIe": (1, 8, "V100-PCIe", LinkSpec("pcie3", 10.0, 10.0), None, None),
    "4xV100-NVLink": (1, 4, "V100", LinkSpec("nvlink2", 5.0, 45.0), None, None),
    "8xA100-NVLink": (1, 8, "A100", LinkSpec("nvlink3", 5.0, 200.0), None, None),
    "2x8xH100-IB": (2, 8, "H100", LinkSpec("nvlink4", 5.0, 350.0), LinkSpec("ib-ndr", 10.0, 45.0), None),
    # one GPU: with more ranks than GPUs, plan on share_gpus(get_cluster(...), ranks_per_gpu)
    "1xH100": (1, 1, "H100", LinkSpec("nvlink4", 5.0, 350.0), None, None),
    "1xH200": (1, 1, "H200", LinkSpec("nvlink4", 5.0, 350.0), None, None),
}

# Ranks sharing a GPU exchange tensors through host memory over gloo (workbench.runtime.staging): until a GPU
# machine's bench/bench_gpu.py figure is put in a cluster file, the gloo loopback link measured on the CPU
# project machine, the copies between the GPU and host memory not counted.
HOST_STAGED_LINK = LinkSpec("host-staged", 70.0, 4.4)


_LOCAL = ("local-cpu", "local")
# What no real machine reaches; a spec beyond these is a typo (GB/s, us, TFLOP/s, bytes).
_LIMITS = {"bandwidth_gbs": 10_000.0, "latency_us": 1e6, "peak_tflops": 100_000.0, "memory_bytes": 16 * 1024 * GIB,
           "memory_bandwidth_gbs": 100_000.0, "devices_per_node": 1024, "num_nodes": 100_000}


def cluster_names() -> list[str]:
    return list(_PRESETS)


def get_device(name: str) -> DeviceSpec:
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    return DEVICES[name]


def get_cluster(name: str) -> ClusterSpec:
    """The preset called ``name`` (see :func:`cluster_names`)."""
    if name not in _PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; known presets: {', '.join(_PRESETS)}")
    if name == "local" and LOCAL_CALIBRATION.is_file():
        return _local_calibration()[0]
    nodes, per_node, device, intra, inter, _ = _PRESETS[name]
    local = name in _LOCAL
    return ClusterSpec(name, nodes, per_node, get_device(device), intra, inter,
                       overlap_slowdown=LOCAL_OVERLAP_SLOWDOWN if local else DATASHEET_OVERLAP_SLOWDOWN,
                       shared_compute=local,
                       collective_call_ms=LOCAL_COLLECTIVE_CALL_MS if local else 0.0)


def share_gpus(cluster: ClusterSpec, ranks_per_gpu: int, link: LinkSpec = HOST_STAGED_LINK) -> ClusterSpec:
    """``cluster`` with ``ranks_per_gpu`` ranks on each GPU, as the runtime runs more ranks than GPUs.

    Each rank is a device of the result: ``ranks_per_gpu`` times as many per
    node, each with that fraction of the GPU's memory (the runtime caps each
    rank's allocator at the same fraction) and of its throughput (the ranks
    time-share its SMs: the planner charges every rank as if all computed at
    once, which a pipeline's idle ranks do not), talking over ``link``
    (host-staged gloo) inside a node. 1 returns ``cluster`` itself.
    """
    if isinstance(ranks_per_gpu, bool) or not isinstance(ranks_per_gpu, int) or ranks_per_gpu < 1:
        raise ValueError(f"ranks_per_gpu must be an int >= 1, got {ranks_per_gpu!r}")
    if ranks_per_gpu == 1:
        return cluster
    if cluster.shared_compute:
        raise ValueError(f"cluster {cluster.name!r} is CPU processes sharing cores; ranks_per_gpu applies to GPUs")
    k = ranks_per_gpu
    device = cluster.device
    share = DeviceSpec(f"{device.name}/{k}", {dtype: peak / k for dtype, peak in device.peak_tflops.items()},
                       device.memory_bytes // k, device.memory_bandwidth_gbs / k, efficiency=device.efficiency,
                       winograd=dict(device.winograd))
    return ClusterSpec(f"{cluster.name}-shared{k}", cluster.num_nodes, cluster.devices_per_node * k, share, link,
                       cluster.inter_node, overlap_slowdown=cluster.overlap_slowdown,
                       collective_call_ms=cluster.collective_call_ms)


def collective_link(name: str) -> LinkSpec | None:
    """The link all-reduces reach on preset ``name`` when it differs from point-to-point (else None)."""
    if name not in _PRESETS:
        return None
    if name == "local" and LOCAL_CALIBRATION.is_file():
        return _local_calibration()[1]
    return _PRESETS[name][5]


def shared_cores(cluster: ClusterSpec) -> int | None:
    """Cores the ranks of one node time-share (None: every rank has its own device).

    The planner probe measured two processes computing at once on this
    machine's two cores at 1.01 of their speed alone, so a core counts whole.
    """
    if not cluster.shared_compute:
        return None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def collective_wait_fraction(ranks_on_node: int, cores: int, background_load: float = 0.0) -> float:
    """How much of ``collective_call_ms`` a collective step pays when ``ranks_on_node`` ranks and
    ``background_load`` other runnable processes share ``cores``.

    The step waits until both of its ranks hold a core. While every runnable
    process has one there is no wait (2 ranks on the 2 cores: a 2-rank
    all-reduce of 1-64 KiB took 0.3-0.45 ms, about 0.2 ms a step, link
    latency included); the wait grows with the processes queued for a core,
    to the whole measured cost (4 ranks on 2 cores: 0.85 ms a step) once
    the cores are oversubscribed twice.
    """
    return wait_fraction(ranks_on_node, cores, background_load)


def core_sharing(cluster: ClusterSpec | None, background_load: float = 0.0) -> CoreSharing | None:
    """The simulator's processor sharing for ``cluster`` (None: every rank has its own device)."""
    cores = shared_cores(cluster) if cluster is not None else None
    return CoreSharing(cores, background_load, cluster.devices_per_node) if cores else None


def time_sharing_slowdown(ranks: int, cores: int, background_load: float = 0.0) -> float:
    """How much slower each of ``ranks`` busy processes computes than one process alone did.

    Processor sharing (:func:`workbench.scheduling.sharing.sharing_slowdown`):
    ``ranks / cores`` on an idle machine, close to 1 on one already crowded.
    """
    return sharing_slowdown(ranks, cores, background_load)


def save_local_calibration(p2p: LinkSpec, allreduce: LinkSpec | None = None,
                           overlap_slowdown: float = LOCAL_OVERLAP_SLOWDOWN) -> Path:
    """Write the ``local`` cluster from measured links (e.g. ``commbench.load_link``) for later plans."""
    cluster = ClusterSpec("local", 1, 8, get_device("cpu-2core"), p2p, overlap_slowdown=overlap_slowdown,
                          shared_compute=True, collective_call_ms=LOCAL_COLLECTIVE_CALL_MS)
    LOCAL_CALIBRATION.parent.mkdir(parents=True, exist_ok=True)
    data = {"cluster": cluster.to_dict(), "collective_link": allreduce.to_dict() if allreduce else None}
    LOCAL_CALIBRATION.write_text(json.dumps(data, indent=1))
    return LOCAL_CALIBRATION


def _local_calibration() -> tuple[ClusterSpec, LinkSpec | None]:
    try:
        data = json.loads(LOCAL_CALIBRATION.read_text())
        link = data.get("collective_link")
        return ClusterSpec.from_dict(data["cluster"]), LinkSpec.from_dict(link) if link else None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"local cluster calibration {str(LOCAL_CALIBRATION)!r} is unreadable ({exc}); delete it "
                         f"or rerun the calibration") from None


def _check_plausible(cluster: ClusterSpec, origin: str) -> None:
    """Refuse numbers beyond any real machine, naming the field."""
    checks = [("num_nodes", cluster.num_nodes), ("devices_per_node", cluster.devices_per_node),
              ("device.memory_bytes", cluster.device.memory_bytes),
              ("device.memory_bandwidth_gbs", cluster.device.memory_bandwidth_gbs)]
    checks += [(f"device.peak_tflops[{k}]", v) for k, v in cluster.device.peak_tflops.items()]
    for name, link in (("intra_node", cluster.intra_node), ("inter_node", cluster.inter_node)):
        if link is not None:
            checks += [(f"{name}.bandwidth_gbs", link.bandwidth_gbs), (f"{name}.latency_us", link.latency_us)]
    for field_name, value in checks:
        limit = _LIMITS[field_name.split(".")[-1].split("[")[0]]
        if value > limit:
            raise ValueError(f"{origin}: {field_name} = {value:g} is beyond any real machine (at most {limit:g}); "
                             f"check the units (GB/s, microseconds, TFLOP/s, bytes)")


def load_cluster(spec: str | Path | ClusterSpec) -> tuple[ClusterSpec, LinkSpec | None]:
    """A preset name or a ``ClusterSpec`` JSON file -> (cluster, link all-reduces use or None).

    A JSON file may hold a ``collective_link`` object next to the cluster's
    fields, or be ``{"cluster": {...}, "collective_link": {...}}``.
    """
    if isinstance(spec, ClusterSpec):
        _check_plausible(spec, f"cluster {spec.name!r}")
        return spec, collective_link(spec.name)
    text = str(spec)
    if text in _PRESETS:
        return get_cluster(text), collective_link(text)
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"cluster {text!r} is neither a preset ({', '.join(_PRESETS)}) nor a JSON file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"cluster file {text!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"cluster file {text!r} must hold a JSON object, got {type(data).__name__}")
    body = dict(data.get("cluster", data))
    link = data.get("collective_link", body.pop("collective_link", None))
    try:
        cluster = ClusterSpec.from_dict(body)
        coll = LinkSpec.from_dict(link) if link else None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cluster file {text!r}: {exc}") from None
    _check_plausible(cluster, f"cluster file {text!r}")
    if coll is not None:
        _check_plausible(ClusterSpec("collective", 1, 1, cluster.device, coll), f"cluster file {text!r} collective_link")
    return cluster, coll
