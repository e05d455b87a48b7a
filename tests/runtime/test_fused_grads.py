"""Fused weight-gradient accumulation gives autograd's gradients, into buffers it keeps across steps."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from workbench.runtime.fused_grads import WeightGradBuffers, fusable, fuse_weight_grads


def _block(bias: bool = True) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16, bias=bias), nn.ReLU(), nn.Linear(16, 8, bias=bias))


def _accumulated(module: nn.Module, inputs: list[torch.Tensor], autocast: bool = False) -> list[torch.Tensor]:
    for x in inputs:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = module(x)
        (out.float() ** 2).mean().backward()
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("shape", [(5, 12), (3, 4, 12)], ids=["2d", "3d"])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_gradients_equal_autograd_over_microbatches(shape, bias):
    plain = _block(bias)
    fused = copy.deepcopy(plain)
    buffers = WeightGradBuffers()
    assert fuse_weight_grads(fused, buffers) == 2
    torch.manual_seed(1)
    inputs = [torch.randn(*shape) for _ in range(3)]
    for got, want in zip(_accumulated(fused, inputs), _accumulated(plain, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert buffers.nbytes == (16 * 12 + 8 * 16) * 4  # one buffer per weight, none for the biases


def test_buffers_are_reused_across_steps_and_overwritten_at_the_first_microbatch():
    plain, fused = _block(), _block()
    buffers = WeightGradBuffers()
    fuse_weight_grads(fused, buffers)
    for step in range(3):
        torch.manual_seed(10 + step)
        inputs = [torch.randn(5, 12) for _ in range(2)]
        want = _accumulated(plain, inputs)
        got = _accumulated(fused, inputs)
        if step == 0:
            first = fused[0].weight.grad
        assert fused[0].weight.grad is first  # the same tensor every step
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        for module in (plain, fused):
            module.zero_grad(set_to_none=True)


def test_accumulates_into_an_existing_gradient_view():
    """GroPipe's ``.grad`` is a view of a zeroed flat buffer: the product adds into that view in place."""
    plain, fused = _block(), _block()
    fuse_weight_grads(fused, WeightGradBuffers())
    flat = torch.zeros(sum(p.numel() for p in fused.parameters()))
    views = [v.view_as(p) for v, p in zip(flat.split([p.numel() for p in fused.parameters()]), fused.parameters())]
    for p, v in zip(fused.parameters(), views):
        p.grad = v
    inputs = [torch.randn(5, 12) for _ in range(2)]
    want = _accumulated(plain, inputs)
    _accumulated(fused, inputs)
    assert all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(fused.parameters(), views))
    for p, w in zip(fused.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-6)


def test_autocast_runs_the_product_in_bf16_and_keeps_fp32_gradients():
    plain, fused = _block(), _block()
    fuse_weight_grads(fused, WeightGradBuffers())
    inputs = [torch.randn(5, 12) for _ in range(2)]
    want = _accumulated(plain, inputs, autocast=True)
    got = _accumulated(fused, inputs, autocast=True)
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)


def test_hugging_face_conv1d_is_fused_with_its_transposed_weight():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    plain = nn.Sequential(Conv1D(10, 6), nn.GELU(), Conv1D(4, 10))
    fused = copy.deepcopy(plain)
    assert len(fusable(fused)) == 2
    fuse_weight_grads(fused, WeightGradBuffers())
    inputs = [torch.randn(2, 3, 6) for _ in range(2)]
    for got, want in zip(_accumulated(fused, inputs), _accumulated(plain, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_frozen_and_other_layers_are_left_alone():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 4), nn.Linear(4, 2))
    block[3].weight.requires_grad_(False)
    assert fusable(block) == [block[2]]


@pytest.mark.parametrize("plan", ["pp2-1f1b-m2", "pp2-interleaved-v2-m4", "gropipe-2x2-1f1b-m2-d1", "pp2-gpipe-m2-rc"])
def test_config_accepts_the_scheduled_pipelines(plan):
    from workbench.core.config import RunConfig

    config = RunConfig.from_dict({"model": "mlp", "plan": plan, "training": {"fused_weight_grads": True}})
    assert config.training.fused_weight_grads


@pytest.mark.parametrize("plan", ["dp2", "pp2-zbh1-m4", "async-1x2-m2", "torchpp2-1f1b-m2", "tp1d-2-dp1"])
def test_config_refuses_runtimes_that_cannot_fuse_before_launch(plan):
    from workbench.core.config import RunConfig

    with pytest.raises(ValueError, match="training.fused_weight_grads"):
        RunConfig.from_dict({"model": "gpt2-tiny", "plan": plan, "training": {"fused_weight_grads": True,
                                                                             "global_batch": 8}})
