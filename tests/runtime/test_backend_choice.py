"""The collective backend a rank picks: NCCL when each rank has a GPU of its own, gloo otherwise."""

import pytest
import torch

from workbench.runtime.groups import check_backend_for_plan, choose_backend


@pytest.mark.parametrize(("device_type", "local_world_size", "device_count", "expected"), [
    ("cpu", 1, 0, "gloo"),
    ("cpu", 4, 8, "gloo"),  # a CPU run on a GPU machine stays on gloo
    ("cuda", 1, 1, "nccl"),
    ("cuda", 2, 2, "nccl"),
    ("cuda", 4, 8, "nccl"),
    ("cuda", 2, 1, "gloo"),  # two ranks share one GPU: NCCL refuses that
    ("cuda", 8, 4, "gloo"),
])
def test_auto_uses_nccl_only_when_every_rank_has_its_own_gpu(device_type, local_world_size, device_count, expected):
    assert choose_backend(device_type, local_world_size, device_count) == expected
    assert choose_backend(device_type, local_world_size, device_count, "auto") == expected


def test_a_forced_backend_is_kept_or_refused_with_the_reason():
    assert choose_backend("cuda", 2, 2, "gloo") == "gloo"
    assert choose_backend("cpu", 2, 0, "gloo") == "gloo"
    assert choose_backend("cuda", 2, 2, "nccl") == "nccl"
    with pytest.raises(ValueError, match="nccl backend needs CUDA devices"):
        choose_backend("cpu", 2, 0, "nccl")
    with pytest.raises(ValueError, match="needs one GPU per rank, but 4 ranks on this node share 2 GPU"):
        choose_backend("cuda", 4, 2, "nccl")
    with pytest.raises(ValueError, match="collective backend must be one of"):
        choose_backend("cuda", 1, 1, "mpi")
    with pytest.raises(ValueError, match="local_world_size must be >= 1"):
        choose_backend("cuda", 0, 1)


def test_pipelines_are_refused_on_gloo_with_cuda_tensors_only():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    with pytest.raises(ValueError, match="point to point.*gloo backend cannot do for CUDA tensors"):
        check_backend_for_plan("gloo", cuda, 2)
    check_backend_for_plan("gloo", cuda, 1)  # data parallel: all-reduce and broadcast work on gloo with CUDA
    check_backend_for_plan("gloo", cpu, 4)
    check_backend_for_plan("nccl", cuda, 4)
