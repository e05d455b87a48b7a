"""Devices and links to plan for: datasheet presets and this machine's CPU, measured.

Researchers plan for an 8-GPU server on a laptop, so the roofline numbers of
common accelerators are kept here (dense peak throughput per dtype from the
vendors' datasheets, SXM parts, memory size and bandwidth), next to
``local-cpu``: this machine's CPU as torch sees it, measured the first time it
is asked for (a float32 matmul for throughput, a large copy for bandwidth)
so that projections can be checked against real profiles taken here.

``LINKS`` holds alpha-beta link presets (effective per-GPU numbers an NCCL
collective reaches, not signalling rates) for NVLink generations, PCIe,
InfiniBand and Ethernet, and the gloo loopback measured on the 2-core
development machines; :mod:`workbench.runtime.commbench` measures real ones.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Iterator

import torch

from ..core.costs import DeviceSpec, LinkSpec
from ..core.devices import DATASHEET_DEVICES, GIB

__all__ = ["DEVICES", "LINKS", "get_device", "get_link", "measure_local_cpu"]

_PRESETS = DATASHEET_DEVICES


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

LINKS: dict[str, LinkSpec] = {link.name: link for link in (
    LinkSpec("nvlink2", latency_us=5.0, bandwidth_gbs=130.0),    # V100 DGX-1 class
    LinkSpec("nvlink3", latency_us=4.0, bandwidth_gbs=230.0),    # A100 SXM, NVSwitch
    LinkSpec("nvlink4", latency_us=3.0, bandwidth_gbs=360.0),    # H100 SXM, NVSwitch
    LinkSpec("pcie4", latency_us=10.0, bandwidth_gbs=22.0),      # x16, through the host
    LinkSpec("pcie5", latency_us=10.0, bandwidth_gbs=45.0),
    LinkSpec("infiniband-hdr", latency_us=6.0, bandwidth_gbs=22.0),   # 200 Gb/s per GPU
    LinkSpec("infiniband-ndr", latency_us=5.0, bandwidth_gbs=45.0),   # 400 Gb/s per GPU
    LinkSpec("ethernet-100g", latency_us=30.0, bandwidth_gbs=10.0),
    LinkSpec("gloo-loopback", latency_us=70.0, bandwidth_gbs=4.4),    # 2 CPU ranks on one small machine
)}


def get_device(device: DeviceSpec | str) -> DeviceSpec:
    if isinstance(device, DeviceSpec):
        return device
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; known devices: {', '.join(DEVICES)} (or pass a DeviceSpec)")
    return DEVICES[device]


def get_link(link: LinkSpec | str) -> LinkSpec:
    if isinstance(link, LinkSpec):
        return link
    if link not in LINKS:
        raise ValueError(f"unknown link {link!r}; known links: {', '.join(LINKS)} (or pass a LinkSpec)")
    return LINKS[link]
