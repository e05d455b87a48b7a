"""Suite-wide settings: small thread counts, GPU tests skipped without CUDA (unless rehearsed, see tests/gpu)."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    if os.environ.get("WORKBENCH_GPU_TIER_REHEARSAL") == "1":  # tests/gpu/gpu_tier.py: the tier on CPU ranks
        for item in gpu_items:
            if "cuda_only" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="needs CUDA itself (rehearsal on CPU)"))
        return
    skip = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in gpu_items:
        item.add_marker(skip)
