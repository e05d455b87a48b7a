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
pick it up.
"""

from __future__ import annotations

from ..core.costs import ClusterSpec, DeviceSpec, LinkSpec
from ..core.devices import DATASHEET_DEVICES, GIB

__all__ = ["DEVICES", "get_cluster", "cluster_names", "collective_link", "get_device"]

DEVICES: dict[str, DeviceSpec] = {
    "cpu-2core": DeviceSpec("cpu-2core", {"float32": 0.2}, 8 * GIB, 20.0, efficiency=0.5),
    **DATASHEET_DEVICES,
}

# name -> (nodes, devices per node, device, intra-node link, inter-node link, collective link or None).
# local-cpu allows up to 8 gloo processes on this one machine (beyond 2 they share its cores).
_PRESETS: dict[str, tuple] = {
    "local-cpu": (1, 8, "cpu-2core", LinkSpec("gloo-loopback", 70.0, 4.4), None,
                  LinkSpec("gloo-allreduce", 70.0, 1.2)),
    "8xV100-PCIe": (1, 8, "V100", LinkSpec("pcie3", 10.0, 10.0), None, None),
    "4xV100-NVLink": (1, 4, "V100", LinkSpec("nvlink2", 5.0, 45.0), None, None),
    "8xA100-NVLink": (1, 8, "A100", LinkSpec("nvlink3", 5.0, 200.0), None, None),
    "2x8xH100-IB": (2, 8, "H100", LinkSpec("nvlink4", 5.0, 350.0), LinkSpec("ib-ndr", 10.0, 45.0), None),
}


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
    nodes, per_node, device, intra, inter, _ = _PRESETS[name]
    return ClusterSpec(name, nodes, per_node, get_device(device), intra, inter)


def collective_link(name: str) -> LinkSpec | None:
    """The link all-reduces reach on preset ``name`` when it differs from point-to-point (else None)."""
    if name not in _PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; known presets: {', '.join(_PRESETS)}")
    return _PRESETS[name][5]
