"""The collective backend a rank picks: NCCL when each rank has a GPU of its own, staged when ranks share one."""

import pytest
import torch

from workbench.core.plan import ParallelPlan
from workbench.runtime.groups import check_backend_for_plan, choose_backend, gpus_shared_by


@pytest.mark.parametrize(("device_type", "local_world_size", "device_count", "expected"), [
    ("cpu", 1, 0, "gloo"),
    ("cpu", 4, 8, "gloo"),  # a CPU run on a GPU machine stays on gloo
    ("cuda", 1, 1, "nccl"),
    ("cuda", 2, 2, "nccl"),
    ("cuda", 4, 8, "nccl"),
    ("cuda", 2, 1, "staged"),  # two ranks share one GPU: NCCL refuses that, gloo alone cannot send CUDA tensors
    ("cuda", 8, 4, "staged"),
])
def test_auto_uses_nccl_only_when_every_rank_has_its_own_gpu(device_type, local_world_size, device_count, expected):
    assert choose_backend(device_type, local_world_size, device_count) == expected
    assert choose_backend(device_type, local_world_size, device_count, "auto") == expected


def test_a_forced_backend_is_kept_or_refused_with_the_reason():
    assert choose_backend("cuda", 2, 2, "gloo") == "gloo"
    assert choose_backend("cpu", 2, 0, "gloo") == "gloo"
    assert choose_backend("cuda", 2, 2, "nccl") == "nccl"
    assert choose_backend("cpu", 2, 0, "staged") == "staged"  # the shared-GPU path on CPU tensors (the tests)
    assert choose_backend("cuda", 2, 2, "staged") == "staged"
    with pytest.raises(ValueError, match="nccl backend needs CUDA devices"):
        choose_backend("cpu", 2, 0, "nccl")
    with pytest.raises(ValueError, match="needs one GPU per rank, but 4 ranks on this node share 2 GPU"):
        choose_backend("cuda", 4, 2, "nccl")
    with pytest.raises(ValueError, match="collective backend must be one of"):
        choose_backend("cuda", 1, 1, "mpi")
    with pytest.raises(ValueError, match="local_world_size must be >= 1"):
        choose_backend("cuda", 0, 1)


@pytest.mark.parametrize(("local_world_size", "device_count", "shares"), [
    (1, 1, [1]),
    (2, 1, [2, 2]),
    (4, 2, [2, 2, 2, 2]),
    (3, 2, [2, 1, 2]),  # GPU 0 holds local ranks 0 and 2, GPU 1 holds rank 1 alone
    (2, 4, [1, 1]),
])
def test_ranks_take_gpus_round_robin(local_world_size, device_count, shares):
    assert [gpus_shared_by(r, local_world_size, device_count) for r in range(local_world_size)] == shares
    with pytest.raises(ValueError, match="local_rank"):
        gpus_shared_by(local_world_size, local_world_size, device_count)


def test_plain_gloo_with_cuda_tensors_runs_plain_data_parallelism_only():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    for name in ("pp2-1f1b-m4", "gropipe-1x2-1f1b-m4-d1", "async-1x2-m4", "tp1d-2-dp1", "dp2-m2-L[0-1=fsdp;2-3=ddp]"):
        with pytest.raises(ValueError, match="gloo backend does not run on GPUs.*'staged'"):
            check_backend_for_plan("gloo", cuda, ParallelPlan.parse(name))
        check_backend_for_plan("staged", cuda, ParallelPlan.parse(name))
        check_backend_for_plan("gloo", cpu, ParallelPlan.parse(name))
    check_backend_for_plan("gloo", cuda, ParallelPlan.parse("dp2-m2"))  # all-reduce and broadcast work on gloo
    check_backend_for_plan("nccl", cuda, ParallelPlan.parse("pp4-1f1b-m4"))
