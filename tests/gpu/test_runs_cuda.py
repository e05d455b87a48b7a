"""Every strategy family on the GPU at hand, one GPU included: fp32 runs equal the CPU reference, bf16 runs learn.

Ranks that outnumber the GPUs share them (``gpu_tier``), so no plan here
needs a second GPU. fp32 runs force ``precision = "fp32"`` (``auto`` means
bf16 on CUDA) and must equal, within 1e-4 relative, the single-process CPU
reference: the dense model trained in one process (the stale update of a
delayed GroPipe, the weight-stashing rule of an asynchronous pipeline), or
for the tensor-parallel strategies, whose sharded GPT-2 is built by its own
package, the same run launched on CPUs. bf16 runs train on tasks that learn
(digits, bytes) with finite losses that fall, and record the allocator's
high-water mark (rehearsed on CPU, the same runs take bf16 autocast there).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from gpu_tier import DIGITS, GPT2, MLP, assert_ran_where_expected, launch_run  # noqa: E402
from runtime_launch import dumped_params, plan_id, stashing_reference, step_losses  # noqa: E402
from workbench.core.config import RunConfig, merge_changes  # noqa: E402
from workbench.runtime.events import read_events  # noqa: E402
from workbench.runtime.reference import reference_train  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc, pytest.mark.slow]

RELATIVE = {"rtol": 1e-4, "atol": 1e-6}

# (plan, model fields, what the run must equal)
FP32_RUNS = [
    ("dp2-m2", MLP, "dense"),  # torch DDP
    ("pp2-gpipe-m2", MLP, "dense"),
    ("pp2-1f1b-m4", MLP, "dense"),
    ("pp2-interleaved-v2-m4", MLP, "dense"),
    ("torchpp2-1f1b-m4", MLP, "dense"),  # torch.distributed.pipelining
    ("pp2-zbh1-m4", MLP, "dense"),  # zero bubble: split backward, I before W
    ("pp2-zbv-m4", MLP, "dense"),  # two chunks per rank in a V
    ("pp2-zbauto-m4", MLP, "dense"),  # built from the stages' measured CUDA costs
    ("gropipe-1x2-1f1b-m4-d0", MLP, "dense"),
    ("gropipe-2x2-1f1b-m4-d1", MLP, "dense"),  # 4 ranks; the reference applies the same one-step-stale update
    ("async-1x2-m4", MLP, "stashing"),
    ("async-1x2-m4-2bw-if2", MLP, "stashing"),
    ("async-1x2-m4-split", MLP, "stashing"),  # I and W on the stashed version
    ("dp2-m2-L[0-1=fsdp;2-3=ddp]", MLP, "dense"),  # FSDP2 beside DDP, layer by layer
    ("tp1d-2-dp2-m2-L[0=ddp;1=fsdp.tp1d2.rc;2=ddp.tp1d2;3=zero2]", GPT2, "dense"),  # DTensor TP, FSDP2, ZeRO-2
    ("pp2-zbh1-m4-L[0=fsdp;1=ddp;2=zero2;3=fsdp]", MLP, "dense"),  # FSDP2's reductions after I and W, on streams
    ("tp1d-2-dp1", GPT2, "cpu-run"),
    ("tp2d-2x2-dp1", GPT2, "cpu-run"),  # the SUMMA grid: 4 ranks
]


def cpu_reference(root: Path, config: RunConfig, fields: dict, kind: str
                  ) -> tuple[dict[str, torch.Tensor], list[float] | None]:
    """Final parameters and losses (None where the rule gives none) the run must equal."""
    if kind == "stashing":
        return stashing_reference(config), None
    if kind == "cpu-run":
        on_cpu = launch_run(root / "cpu", {**fields, "_staged": False}, device="cpu")
        return dumped_params(Path(on_cpu.run.dir), list(range(on_cpu.world_size))), step_losses(Path(on_cpu.run.dir))
    reference = reference_train(config)
    return reference.params, reference.losses


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("plan", "base", "kind"), FP32_RUNS, ids=[plan_id(p) for p, _, _ in FP32_RUNS])
def test_fp32_run_equals_the_cpu_reference(tmp_path, plan, base, kind):
    fields = merge_changes(base, {"plan": plan, "training": {"precision": "fp32"}})
    config = launch_run(tmp_path / "gpu", fields)
    params, losses = cpu_reference(tmp_path, config, fields, kind)
    run_dir = Path(config.run.dir)
    if losses is not None:
        torch.testing.assert_close(step_losses(run_dir), losses, **RELATIVE)
    dumped = dumped_params(run_dir, list(range(config.world_size)))
    assert sorted(dumped) == sorted(params)
    for name, value in params.items():
        torch.testing.assert_close(dumped[name].cpu(), value, **RELATIVE, msg=f"parameter {name}")
    assert_ran_where_expected(config)


BF16_RUNS = [
    ("pp2-1f1b-m4", DIGITS),
    ("gropipe-2x2-1f1b-m2-d1", DIGITS),
    ("async-1x2-m4-adapt3", DIGITS),  # the adapting asynchronous pipeline
    ("dp2-m2-L[0-1=fsdp;2-3=ddp]", DIGITS),
    ("tp2d-2x2-dp1", GPT2),
]


def falls(losses: list[float]) -> bool:
    """The mean of the last third of the losses is below the mean of the first third."""
    third = max(1, len(losses) // 3)
    return sum(losses[-third:]) / third < sum(losses[:third]) / third


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("plan", "base"), BF16_RUNS, ids=[plan_id(p) for p, _ in BF16_RUNS])
def test_bf16_run_learns_with_finite_losses(tmp_path, plan, base):
    config = launch_run(tmp_path, merge_changes(base, {"plan": plan, "training": {
        "precision": "bf16", "steps": 9, "optimizer": {"name": "adam", "lr": 3e-3}}}))
    run_dir = Path(config.run.dir)
    losses = step_losses(run_dir)
    assert len(losses) == config.training.steps and all(math.isfinite(x) for x in losses), losses
    assert falls(losses), losses
    for rank in range(config.world_size):
        steps = [e for e in read_events(run_dir, rank) if e["kind"] == "step"]
        assert steps and all(e["memory_bytes"] > 0 for e in steps)  # the allocator's high-water mark on CUDA
    assert_ran_where_expected(config)
    assert json.loads((run_dir / "config.json").read_text())["training"]["precision"] == "bf16"
