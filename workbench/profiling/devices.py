"""The hardware catalogue as the profiler sees it: core's devices and links, and this machine's CPU, measured.

Researchers plan for an 8-GPU server on a laptop, so projections read the
devices and links of :mod:`workbench.core.hardware` (datasheet GPUs,
achieved link numbers; its docstring says which is which and how to add
one). This module adds only what needs torch: ``local-cpu``, this machine's
CPU as torch sees it, measured the first time it is asked for (a float32
matmul for throughput, a large copy for bandwidth) so that projections can
be checked against real profiles taken here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Iterator

from ..core.costs import DeviceSpec
from ..core.hardware import DEVICES as _PRESETS
from ..core.hardware import LINKS, get_link, lookup

__all__ = ["DEVICES", "LINKS", "get_device", "get_link", "measure_local_cpu"]


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@lru_cache(maxsize=1)
def measure_local_cpu() -> DeviceSpec:
    """This CPU at torch's current thread count: matmul TFLOP/s and copy bandwidth (about 0.5 s)."""
    import psutil
    import torch

    size = 512
    a, b = torch.randn(size, size), torch.randn(size, size)
    matmul_s = _median_seconds(lambda: [torch.mm(a, b) for _ in range(8)], 5) / 8
    tflops = 2 * size ** 3 / matmul_s / 1e12
    source = torch.empty(16 * 1024 * 1024, dtype=torch.float32).fill_(1.0)  # 64 MiB
    target = torch.empty_like(source)
    copy_s = _median_seconds(lambda: target.copy_(source), 5)
    bandwidth_gbs = 2 * source.numel() * 4 / copy_s / 1e9  # read + write
    return DeviceSpec("local-cpu", {"float32": round(tflops, 4)}, int(psutil.virtual_memory().total),
                      round(bandwidth_gbs, 2), efficiency=0.7)


class _DeviceTable(Mapping):
    """Name -> DeviceSpec; ``local-cpu`` is measured on first access, not at import."""

    def __getitem__(self, name: str) -> DeviceSpec:
        if name == "local-cpu":
            return measure_local_cpu()
        return _PRESETS[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*_PRESETS, "local-cpu"])

    def __len__(self) -> int:
        return len(_PRESETS) + 1


DEVICES: Mapping[str, DeviceSpec] = _DeviceTable()


def get_device(device: DeviceSpec | str) -> DeviceSpec:
    """A catalogued device, or ``local-cpu`` (measured), by name (a ``DeviceSpec`` is returned as it is)."""
    return lookup(DEVICES, device, "device", DeviceSpec)

