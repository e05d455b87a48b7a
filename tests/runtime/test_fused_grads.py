"""Fused weight-gradient accumulation gives autograd's gradients, into buffers it keeps across steps."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from workbench.models.fused_grads import WeightGradBuffers, fusable, fuse_weight_grads


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


@pytest.mark.parametrize("plan", ["pp2-1f1b-m2", "pp2-interleaved-v2-m4", "gropipe-2x2-1f1b-m2-d1", "pp2-gpipe-m2-rc",
                                  "pp2-zbh1-m4", "pp2-zbv-m4", "gropipe-2x2-zbh2-m4-d0"])
def test_config_accepts_the_scheduled_pipelines(plan):
    from workbench.core.config import RunConfig

    config = RunConfig.from_dict({"model": "mlp", "plan": plan, "training": {"fused_weight_grads": True}})
    assert config.training.fused_weight_grads


@pytest.mark.parametrize("plan", ["dp2", "async-1x2-m2-split", "async-1x2-m2", "torchpp2-1f1b-m2",
                                  "torchpp2-zbv-m4", "tp1d-2-dp1"])
def test_config_refuses_runtimes_that_cannot_fuse_before_launch(plan):
    from workbench.core.config import RunConfig

    with pytest.raises(ValueError, match="training.fused_weight_grads"):
        RunConfig.from_dict({"model": "gpt2-tiny", "plan": plan, "training": {"fused_weight_grads": True,
                                                                             "global_batch": 8}})


# -- split backward (zero-bubble kinds): I queues the fused products, W runs them ------------------------------------

SPLIT_CASES = [
    ("vgg-tiny", {}),
    ("gpt2-tiny", {"n_layer": 2, "seq_len": 16, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}),
    ("mlp", {"depth": 5}),
]


def _split_stages(model, bounds, recompute, fused):
    from workbench.runtime.stage import Stage

    buffers = WeightGradBuffers() if fused else None
    stages = []
    for i, (a, b) in enumerate(bounds):
        module = copy.deepcopy(model.stage(a, b))
        if fused:
            fuse_weight_grads(module, buffers)
        stages.append(Stage(index=i, module=module, device=torch.device("cpu"), is_first=i == 0,
                            is_last=i == len(bounds) - 1, loss_fn=model.loss_fn, loss_scale=0.5,
                            recompute=recompute, weight_grads=buffers))
    return stages, buffers


def _interleaved_split(stages, batches):
    """Every forward, then per stage (last first) each micro-batch's I, then the W's in reverse order."""
    for mb, (x, y) in enumerate(batches):
        h = x
        for stage in stages:
            h = stage.forward(mb, h, y if stage.is_last else None)
    grads = {}
    for stage in reversed(stages):
        for mb in range(len(batches)):
            grads[(stage.index, mb)] = stage.backward_input(mb, grads.get((stage.index + 1, mb)))
        for mb in reversed(range(len(batches))):
            stage.backward_weight(mb)
    return {k: v for k, v in grads.items() if v is not None}, \
        {f"{s.index}.{n}": p.grad for s in stages for n, p in s.module.named_parameters()}


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recomputed"])
@pytest.mark.parametrize(("name", "overrides"), SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_fused_split_backward_equals_autograds_split(name, overrides, recompute):
    """Fused stages' I and W give the input and weight gradients of the plain split backward."""
    from test_split_backward import three_stages

    model, bounds, batches = three_stages(name, overrides)
    results = []
    for fused in (False, True):
        stages, buffers = _split_stages(model, bounds, recompute, fused)
        torch.manual_seed(5)
        results.append(_interleaved_split(stages, batches))
        if fused:
            assert sum(len(fusable(s.module)) for s in stages) >= 2 and buffers.pending == 0
    (plain_inputs, plain), (fused_inputs, fused_grads) = results
    assert sorted(fused_inputs) == sorted(plain_inputs) and sorted(fused_grads) == sorted(plain)
    for key, value in plain_inputs.items():
        torch.testing.assert_close(fused_inputs[key], value, rtol=1e-5, atol=1e-6, msg=str(key))
    for key, value in plain.items():
        torch.testing.assert_close(fused_grads[key], value, rtol=1e-5, atol=1e-6, msg=key)


class _OffPath(nn.Module):
    """A block whose linear layer also runs on a learned tensor that does not depend on the block's input: that
    call is off the input gradient's path, so I does not pass through it, and ``proj`` is used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(3, 6))
        self.proj = nn.Linear(6, 6, bias=False)  # with a bias, I would pass through both calls for its gradient
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.proj(x)) + self.proj(self.query).sum(0))


def test_a_fused_layer_off_the_inputs_path_gets_its_product_exactly_once():
    from workbench.runtime.stage import Stage

    torch.manual_seed(0)
    plain = _OffPath()
    fused = copy.deepcopy(plain)
    buffers = WeightGradBuffers()
    assert fuse_weight_grads(fused, buffers) == 2
    loss = lambda out, y: ((out - y) ** 2).mean()  # noqa: E731
    stage = Stage(index=1, module=fused, device=torch.device("cpu"), is_first=False, is_last=True, loss_fn=loss,
                  loss_scale=0.5, weight_grads=buffers)
    torch.manual_seed(1)
    batches = [(torch.randn(4, 6), torch.randn(4, 2)) for _ in range(2)]
    for mb, (x, y) in enumerate(batches):
        stage.forward(mb, x, y)
    grads_in = [stage.backward_input(mb) for mb in range(2)]
    assert fused.proj.weight.grad is None and buffers.pending == 2  # the products wait for W
    assert len(buffers.queued_nodes((1, 0))) == 2  # head and the input's proj call; not the query's
    for mb in range(2):
        stage.backward_weight(mb)
    assert buffers.pending == 0
    for mb, (x, y) in enumerate(batches):
        h = x.clone().requires_grad_(True)
        (loss(plain(h), y) * 0.5).backward()
        torch.testing.assert_close(grads_in[mb], h.grad)
    for (name, want), got in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-6, msg=name)
