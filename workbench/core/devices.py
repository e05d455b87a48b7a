"""Datasheet presets of the accelerators people plan for.

Dense peak throughput per dtype (vendor datasheets, SXM parts), memory size
and bandwidth, and the fraction of peak real layers reach. The planner's
cluster presets and the profiler's projection both read this one table;
this machine's own CPU is measured by ``workbench.profiling.devices``.
"""

from __future__ import annotations

from .costs import DeviceSpec

__all__ = ["DATASHEET_DEVICES", "GIB"]

GIB = 1024 ** 3

DATASHEET_DEVICES: dict[str, DeviceSpec] = {
    "V100": DeviceSpec("V100", {"float32": 15.7, "float16": 125.0}, 32 * GIB, 900.0, efficiency=0.5),
    "A100": DeviceSpec("A100", {"float32": 19.5, "tfloat32": 156.0, "float16": 312.0, "bfloat16": 312.0},
                       80 * GIB, 2039.0, efficiency=0.5),
    "H100": DeviceSpec("H100", {"float32": 66.9, "tfloat32": 494.7, "float16": 989.4, "bfloat16": 989.4,
                                "float8": 1978.9}, 80 * GIB, 3350.0, efficiency=0.5),
}
