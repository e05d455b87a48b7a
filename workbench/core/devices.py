"""Datasheet presets of the accelerators people plan for.

Dense peak throughput per dtype (vendor datasheets, SXM parts unless the
name says PCIe), memory size and bandwidth, the fraction of peak real layers
reach, and the dtypes whose 3x3 convolutions run by Winograd. The planner's
cluster presets and the profiler's projection both read this one table;
this machine's own CPU is measured by ``workbench.profiling.devices``.
"""

from __future__ import annotations

from .costs import DeviceSpec

__all__ = ["DATASHEET_DEVICES", "GIB"]

GIB = 1024 ** 3

# cuDNN runs float32 3x3 stride-1 convolutions by Winograd F(2x2, 3x3): 16 multiplies where the direct
# convolution does 36. Tensor-core dtypes run them as implicit GEMMs (direct count).
_WINOGRAD_FP32 = {"float32": 2.25}

DATASHEET_DEVICES: dict[str, DeviceSpec] = {
    "V100": DeviceSpec("V100", {"float32": 15.7, "float16": 125.0}, 32 * GIB, 900.0, efficiency=0.5,
                       winograd=_WINOGRAD_FP32),
    # The PCIe card runs at a lower boost clock (1380 vs 1530 MHz) than the SXM2 module above.
    "V100-PCIe": DeviceSpec("V100-PCIe", {"float32": 14.0, "float16": 112.0}, 32 * GIB, 900.0, efficiency=0.5,
                            winograd=_WINOGRAD_FP32),
    "A100": DeviceSpec("A100", {"float32": 19.5, "tfloat32": 156.0, "float16": 312.0, "bfloat16": 312.0},
                       80 * GIB, 2039.0, efficiency=0.5, winograd=_WINOGRAD_FP32),
    "H100": DeviceSpec("H100", {"float32": 66.9, "tfloat32": 494.7, "float16": 989.4, "bfloat16": 989.4,
                                "float8": 1978.9}, 80 * GIB, 3350.0, efficiency=0.5, winograd=_WINOGRAD_FP32),
    # The H100 SXM's compute with 141 GB of HBM3e at 4.8 TB/s.
    "H200": DeviceSpec("H200", {"float32": 66.9, "tfloat32": 494.7, "float16": 989.4, "bfloat16": 989.4,
                                "float8": 1978.9}, 141 * 10 ** 9, 4800.0, efficiency=0.5, winograd=_WINOGRAD_FP32),
}
