"""Named cluster presets: the machines the planner and the simulator reason about.

The presets, their devices and their links are records of the hardware
catalogue, :mod:`workbench.core.hardware` (datasheet device numbers,
achieved link numbers; its docstring says how to add one). A preset is a
plain :class:`~workbench.core.costs.ClusterSpec`. Collectives often reach a
different bandwidth than one point-to-point message (gloo's ring all-reduce
on this machine's loopback is ~1.2 GB/s bus bandwidth while a send reaches
~4.4 GB/s), so a cluster may carry a ``collective_link`` used for
all-reduces.

``get_cluster(name)`` and the CLI's ``--cluster`` read the catalogue. A
user's own cluster is a ``ClusterSpec`` JSON file or a TOML file of the same
fields (:mod:`~workbench.planning.costs.cluster_toml`; :func:`load_cluster`
takes a preset name or a path; numbers no real machine has are refused with
the field that holds them). A cluster with ``nodes_per_pod`` and
``inter_pod`` has its nodes in pods
(:class:`~workbench.core.pods.PodClusterSpec`). The GPU presets charge an
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
from dataclasses import replace
from pathlib import Path

from ...core.costs import ClusterSpec, DeviceSpec, LinkSpec
from ...core.fields import check_int
from ...core.hardware import (DATASHEET_OVERLAP_SLOWDOWN, DEVICES, GIB, LINKS, LOCAL_COLLECTIVE_CALL_MS,
                              LOCAL_OVERLAP_SLOWDOWN, PRESETS, get_device, get_preset)
from ...core.pods import cluster_from_dict
from ...scheduling.sharing import CoreSharing, sharing_slowdown, wait_fraction
from .cluster_toml import read_cluster_toml

__all__ = ["DEVICES", "get_cluster", "share_gpus", "HOST_STAGED_LINK", "cluster_names", "collective_wait_fraction",
           "core_sharing", "get_device", "load_cluster", "shared_cores", "time_sharing_slowdown",
           "save_local_calibration", "LOCAL_CALIBRATION", "LOCAL_OVERLAP_SLOWDOWN", "LOCAL_COLLECTIVE_CALL_MS",
           "DATASHEET_OVERLAP_SLOWDOWN"]

LOCAL_CALIBRATION = Path(os.environ.get("WORKBENCH_LOCAL_CLUSTER", Path.home() / ".cache" / "workbench" /
                                        "local-cluster.json"))

# Ranks sharing a GPU exchange tensors through host memory over gloo (workbench.runtime.staging).
HOST_STAGED_LINK = LINKS["host-staged"]


# What no real machine reaches; a spec beyond these is a typo (GB/s, us, TFLOP/s, bytes).
_LIMITS = {"bandwidth_gbs": 10_000.0, "latency_us": 1e6, "peak_tflops": 100_000.0, "memory_bytes": 16 * 1024 * GIB,
           "memory_bandwidth_gbs": 100_000.0, "devices_per_node": 1024, "num_nodes": 100_000}


def cluster_names() -> list[str]:
    return list(PRESETS)


def get_cluster(name: str) -> ClusterSpec:
    """The preset called ``name`` (see :func:`cluster_names`)."""
    preset = get_preset(name)
    if name == "local" and LOCAL_CALIBRATION.is_file():
        return _local_calibration()
    return preset.cluster()


def share_gpus(cluster: ClusterSpec, ranks_per_gpu: int, link: LinkSpec = HOST_STAGED_LINK) -> ClusterSpec:
    """``cluster`` with ``ranks_per_gpu`` ranks on each GPU, as the runtime runs more ranks than GPUs.

    Each rank is a device of the result: ``ranks_per_gpu`` times as many per
    node, each with that fraction of the GPU's memory (the runtime caps each
    rank's allocator at the same fraction) and of its throughput (the ranks
    time-share its SMs: the planner charges every rank as if all computed at
    once, which a pipeline's idle ranks do not), talking over ``link``
    (host-staged gloo) inside a node. 1 returns ``cluster`` itself. The
    cluster's other links (between nodes and pods, ``collective_link``) stay.
    """
    check_int("ranks_per_gpu", ranks_per_gpu, 1)
    if ranks_per_gpu == 1:
        return cluster
    if cluster.shared_compute:
        raise ValueError(f"cluster {cluster.name!r} is CPU processes sharing cores; ranks_per_gpu applies to GPUs")
    k = ranks_per_gpu
    device = cluster.device
    share = DeviceSpec(f"{device.name}/{k}", {dtype: peak / k for dtype, peak in device.peak_tflops.items()},
                       device.memory_bytes // k, device.memory_bandwidth_gbs / k, efficiency=device.efficiency,
                       winograd=dict(device.winograd))
    return replace(cluster, name=f"{cluster.name}-shared{k}", devices_per_node=cluster.devices_per_node * k,
                   device=share, intra_node=link)


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
    """Write the ``local`` cluster from measured links (e.g. ``commbench.load_link``) for later plans: a
    ``ClusterSpec`` JSON file whose ``collective_link`` is ``allreduce``."""
    cluster = ClusterSpec("local", 1, 8, get_device("cpu-2core"), p2p, overlap_slowdown=overlap_slowdown,
                          shared_compute=True, collective_call_ms=LOCAL_COLLECTIVE_CALL_MS, collective_link=allreduce)
    LOCAL_CALIBRATION.parent.mkdir(parents=True, exist_ok=True)
    LOCAL_CALIBRATION.write_text(json.dumps(cluster.to_dict(), indent=1))
    return LOCAL_CALIBRATION


def _local_calibration() -> ClusterSpec:
    try:
        return _cluster_from_json(json.loads(LOCAL_CALIBRATION.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"local cluster calibration {str(LOCAL_CALIBRATION)!r} is unreadable ({exc}); delete it "
                         f"or rerun the calibration") from None


def _cluster_from_json(data: object) -> ClusterSpec:
    """A ``ClusterSpec`` JSON object, or ``{"cluster": {...}, "collective_link": {...}}`` (the form files had
    before the collective link was a field of the cluster)."""
    if not isinstance(data, dict):
        raise ValueError(f"a cluster must be a JSON object, got {type(data).__name__}")
    if "cluster" not in data:
        return cluster_from_dict(data)
    body = data["cluster"]
    if not isinstance(body, dict):
        raise ValueError(f"\"cluster\" must be a JSON object, got {type(body).__name__}")
    if data.get("collective_link") is not None:
        if body.get("collective_link") is not None:
            raise ValueError("collective_link is given twice (in \"cluster\" and beside it); give it once")
        body = {**body, "collective_link": data["collective_link"]}
    return cluster_from_dict(body)


def _check_plausible(cluster: ClusterSpec, origin: str) -> None:
    """Refuse numbers beyond any real machine, naming the field."""
    checks = [("num_nodes", cluster.num_nodes), ("devices_per_node", cluster.devices_per_node),
              ("device.memory_bytes", cluster.device.memory_bytes),
              ("device.memory_bandwidth_gbs", cluster.device.memory_bandwidth_gbs)]
    checks += [(f"device.peak_tflops[{k}]", v) for k, v in cluster.device.peak_tflops.items()]
    for name in ("intra_node", "inter_node", "collective_link", "inter_pod"):
        link = getattr(cluster, name, None)
        if link is not None:
            checks += [(f"{name}.bandwidth_gbs", link.bandwidth_gbs), (f"{name}.latency_us", link.latency_us)]
    for field_name, value in checks:
        limit = _LIMITS[field_name.split(".")[-1].split("[")[0]]
        if value > limit:
            raise ValueError(f"{origin}: {field_name} = {value:g} is beyond any real machine (at most {limit:g}); "
                             f"check the units (GB/s, microseconds, TFLOP/s, bytes)")


def load_cluster(spec: str | Path | ClusterSpec) -> ClusterSpec:
    """A preset name, a ``ClusterSpec`` JSON or TOML file or a ``ClusterSpec`` -> the cluster, its numbers checked.

    A JSON file holds the ``ClusterSpec`` fields, its ``collective_link``
    among them (or is ``{"cluster": {...}, "collective_link": {...}}``); a
    file whose name ends in ``.toml`` holds them as TOML
    (:mod:`~workbench.planning.costs.cluster_toml`).
    """
    if isinstance(spec, ClusterSpec):
        _check_plausible(spec, f"cluster {spec.name!r}")
        return spec
    text = str(spec)
    if text in PRESETS:
        return get_cluster(text)
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"cluster {text!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON or TOML file")
    if path.suffix == ".toml":
        cluster = read_cluster_toml(path)
        _check_plausible(cluster, f"cluster file {text!r}")
        return cluster
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"cluster file {text!r} is not valid JSON: {exc}") from None
    try:
        cluster = _cluster_from_json(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cluster file {text!r}: {exc}") from None
    _check_plausible(cluster, f"cluster file {text!r}")
    return cluster
