"""A cluster as a TOML file: the fields of ``ClusterSpec``, each checked, devices and links by name or in full.

The file holds what a ``ClusterSpec`` JSON file holds, as TOML; a device or
a link is either a name of the hardware catalogue (``device = "H100"``,
``intra_node = "nvlink4"``) or a table of its own fields::

    name = "2x8xH100-IB"
    num_nodes = 2
    devices_per_node = 8
    device = "H100"
    intra_node = "nvlink4"
    inter_node = "infiniband-ndr"
    overlap_slowdown = 1.2

    [collective_link]            # optional, like inter_node, nodes_per_pod and inter_pod
    name = "measured-allreduce"
    latency_us = 40.0
    bandwidth_gbs = 30.0

TOML has no null: a link that is not there is left out. ``nodes_per_pod``
with ``inter_pod`` makes a cluster of pods
(:class:`~workbench.core.pods.PodClusterSpec`). Every field is checked
before the cluster is built: a wrong type or value is a one-line
``ValueError`` naming the field (``device.memory_bytes``), an unknown key
is refused with the valid ones. :func:`cluster_to_toml` writes a cluster in
this form (catalogued devices and links by name), so a preset is a file to
start from.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from ...core.costs import ClusterSpec, DeviceSpec, LinkSpec
from ...core.fields import is_int, is_number
from ...core.hardware import DEVICES, LINKS
from ...core.pods import cluster_from_dict
from ...core.toml_text import to_toml

__all__ = ["read_cluster_toml", "cluster_from_toml", "cluster_to_toml", "CLUSTER_FIELDS"]

# field -> what it holds ("int>=1", "number", "bool", "str", "device", "link"); the first five are required
CLUSTER_FIELDS = {"name": "str", "num_nodes": "int>=1", "devices_per_node": "int>=1", "device": "device",
                  "intra_node": "link", "inter_node": "link", "overlap_slowdown": "number", "shared_compute": "bool",
                  "collective_call_ms": "number", "collective_link": "link", "nodes_per_pod": "int>=1",
                  "inter_pod": "link"}
_REQUIRED = ("name", "num_nodes", "devices_per_node", "device", "intra_node")
_DEVICE_FIELDS = {"name": "str", "peak_tflops": "rates", "memory_bytes": "int>=1", "memory_bandwidth_gbs": "number>0",
                  "efficiency": "number>0", "winograd": "rates"}
_LINK_FIELDS = {"name": "str", "latency_us": "number", "bandwidth_gbs": "number>0"}


def _finite_number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def _check_value(field: str, kind: str, value: Any) -> None:
    """One field's value against its kind, or a ValueError naming the field."""
    if kind == "str":
        ok, want = isinstance(value, str) and bool(value), "a non-empty string"
    elif kind == "int>=1":
        ok, want = is_int(value) and value >= 1, "an int >= 1"
    elif kind == "bool":
        ok, want = isinstance(value, bool), "true or false"
    elif kind == "number":
        ok, want = _finite_number(value) and value >= 0, "a number >= 0"
    elif kind == "number>0":
        ok, want = _finite_number(value) and value > 0, "a number > 0"
    else:  # "rates": dtype -> number
        ok = isinstance(value, dict) and bool(value) and all(_finite_number(v) and v > 0 for v in value.values())
        want = "a table of dtype = number > 0, e.g. { float32 = 19.5, bfloat16 = 312.0 }"
    if not ok:
        raise ValueError(f"{field} must be {want}, got {value!r}")


def _check_keys(prefix: str, data: dict[str, Any], fields: dict[str, str], required: tuple[str, ...]) -> None:
    """No key outside ``fields`` and every ``required`` one, or a ValueError naming the first that is not so."""
    unknown = [key for key in data if key not in fields]
    if unknown:
        raise ValueError(f"unknown field {prefix}{unknown[0]}; valid fields: {', '.join(fields)}")
    missing = [key for key in required if key not in data]
    if missing:
        raise ValueError(f"{prefix}{missing[0]} is missing (required: {', '.join(required)})")


def _check_table(prefix: str, data: dict[str, Any], fields: dict[str, str], required: tuple[str, ...]) -> None:
    _check_keys(prefix, data, fields, required)
    for key, value in data.items():
        _check_value(prefix + key, fields[key], value)


def _resolve(field: str, value: Any, kind: str) -> DeviceSpec | LinkSpec:
    """A catalogue name or a table of fields -> the device or link, checked."""
    table, fields, spec = (DEVICES, _DEVICE_FIELDS, DeviceSpec) if kind == "device" else (LINKS, _LINK_FIELDS, LinkSpec)
    if isinstance(value, str):
        if value not in table:
            raise ValueError(f"{field} = {value!r} is no catalogued {kind}; known: {', '.join(table)} (or give a "
                             f"table of its fields: {', '.join(fields)})")
        return table[value]
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be the name of a catalogued {kind} or a table of its fields "
                         f"({', '.join(fields)}), got {value!r}")
    required = ("name", "peak_tflops", "memory_bytes", "memory_bandwidth_gbs") if kind == "device" else tuple(fields)
    _check_table(f"{field}.", value, fields, required)
    try:
        return spec(**value)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


def cluster_from_toml(data: Any) -> ClusterSpec:
    """The cluster a parsed TOML file describes, every field checked (see the module docstring)."""
    if not isinstance(data, dict):
        raise ValueError(f"a cluster must be a table of fields, got {type(data).__name__}")
    _check_keys("", data, CLUSTER_FIELDS, _REQUIRED)
    fields: dict[str, Any] = {}
    for key, value in data.items():
        kind = CLUSTER_FIELDS[key]
        if kind in ("device", "link"):
            fields[key] = _resolve(key, value, kind)
        else:
            _check_value(key, kind, value)
            fields[key] = value
    return cluster_from_dict(fields)


def read_cluster_toml(path: str | Path) -> ClusterSpec:
    """The cluster of a TOML file; any fault is a one-line ValueError naming the file and the field."""
    origin = f"cluster file {str(path)!r}"
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{origin} is not valid TOML: {exc}") from None
    try:
        return cluster_from_toml(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{origin}: {exc}") from None


def _named(record: DeviceSpec | LinkSpec, table: dict[str, Any]) -> Any:
    """A catalogued record by its name, any other as its table of fields."""
    return record.name if table.get(record.name) == record else record.to_dict()


def cluster_to_toml(cluster: ClusterSpec) -> str:
    """``cluster`` as a TOML cluster file (catalogued devices and links by name; absent links left out)."""
    data: dict[str, Any] = {}
    for key, value in cluster.to_dict().items():
        record = getattr(cluster, key)
        if value is None:
            continue
        if isinstance(record, DeviceSpec):
            value = _named(record, DEVICES)
        elif isinstance(record, LinkSpec):
            value = _named(record, LINKS)
        data[key] = value
    return to_toml(data)
