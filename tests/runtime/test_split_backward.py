"""A split backward (input gradient now, weight gradients later) equals the whole backward, stage by stage.

For blocks of real zoo models cut as pipeline stages (middle stages that
receive an activation, first stages that receive the input, last stages
that own the loss), with recomputation and with several micro-batches whose
I's run before their W's: the input gradient I returns and the parameter
gradients W leaves equal what one ``backward`` gives, and W runs only the
weight branches when every parameter joins the activation path once.
"""

from __future__ import annotations

import copy

import pytest
import torch

from workbench.models import build_model, sample_batch
from workbench.models.split_backward import SplitBackward
from workbench.runtime.stage import Stage

CASES = [
    ("vgg-tiny", {}),
    ("resnet18", {"image_size": 32}),  # an in-place ReLU at a cut, residual blocks, batch norm
    ("gpt2-tiny", {"n_layer": 2, "seq_len": 16, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}),
]


def _stages(model, bounds, recompute):
    out = []
    for i, (a, b) in enumerate(bounds):
        out.append(Stage(index=i, module=copy.deepcopy(model.stage(a, b)), device=torch.device("cpu"),
                         is_first=i == 0, is_last=i == len(bounds) - 1, loss_fn=model.loss_fn, loss_scale=0.25,
                         recompute=recompute))
    return out


def _run(stages, batches, split):
    """Forward every micro-batch through every stage, then the backwards stage by stage, last first; with
    ``split``, every I of a stage before any of its W's. The first stage's input gradients and every .grad."""
    inputs = []
    for mb, (x, y) in enumerate(batches):
        h = x
        for stage in stages:
            h = stage.forward(mb, h, y if stage.is_last else None)
            inputs.append(h)
    grads = {}
    for stage in reversed(stages):
        for mb in range(len(batches)):
            g = grads.get((stage.index + 1, mb))
            grads[(stage.index, mb)] = (stage.backward_input(mb, g) if split else stage.backward(mb, g))
        if split:
            for mb in range(len(batches)):
                stage.backward_weight(mb)
        assert stage.in_flight == 0
    return {k: v for k, v in grads.items() if v is not None}, \
        {f"{s.index}.{n}": p.grad for s in stages for n, p in s.module.named_parameters()}


def three_stages(name: str, overrides: dict):
    """A zoo model, its cut into three stages (bounds) and two micro-batches of 4 samples."""
    model = build_model(name, **overrides)
    n = len(model)
    bounds = [(0, n // 3 - 1), (n // 3, 2 * n // 3 - 1), (2 * n // 3, n - 1)]
    x, y = sample_batch(model, 8)
    return model, bounds, [(x[i:i + 4], y[i:i + 4]) for i in (0, 4)]


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recomputed"])
@pytest.mark.parametrize(("name", "overrides"), CASES, ids=[c[0] for c in CASES])
def test_split_backward_equals_the_whole_backward(name, overrides, recompute):
    model, bounds, batches = three_stages(name, overrides)
    torch.manual_seed(5)
    whole_inputs, whole = _run(_stages(model, bounds, recompute), batches, split=False)
    torch.manual_seed(5)
    split_inputs, split = _run(_stages(model, bounds, recompute), batches, split=True)
    assert sorted(split_inputs) == sorted(whole_inputs) and len(split_inputs) == 4  # stages 1 and 2, 2 mbs each
    for key in whole_inputs:
        torch.testing.assert_close(split_inputs[key], whole_inputs[key], rtol=1e-5, atol=1e-6, msg=str(key))
    assert sorted(split) == sorted(whole)
    for key, grad in whole.items():
        if grad is None:
            assert split[key] is None, key
        else:
            torch.testing.assert_close(split[key], grad, rtol=1e-5, atol=1e-6, msg=key)


def test_the_weight_pass_starts_where_the_weights_join_the_activation_path():
    """A linear layer's weight joins the activation path at its matmul: W starts there, so it never runs the
    activation gradient of the layer after it again; its bias, a vector, comes with the input gradient."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
    x = torch.randn(5, 3, requires_grad=True)
    h = x.detach().requires_grad_(True) * 1.0  # the stage input's node
    out = second(torch.tanh(first(h)))
    split = SplitBackward(out, torch.autograd.graph.get_gradient_edge(h), list(first.parameters()) +
                          list(second.parameters()))
    grad_input = split.backward_input(torch.ones(5, 2))
    assert [len(params) for _, params in split._joins] == [1, 1]
    assert {id(p) for p in split.eager} == {id(first.bias), id(second.bias)} and first.bias.grad is not None
    assert first.weight.grad is None  # the matrices wait for W
    split.backward_weight()
    reference = [p.grad.clone() for p in (*first.parameters(), *second.parameters())]
    for p in (*first.parameters(), *second.parameters()):
        p.grad = None
    h2 = x.detach().requires_grad_(True)
    second(torch.tanh(first(h2 * 1.0))).backward(torch.ones(5, 2))
    torch.testing.assert_close(grad_input, h2.grad)
    for got, want in zip(reference, (p.grad for p in (*first.parameters(), *second.parameters()))):
        torch.testing.assert_close(got, want)


def test_out_of_order_calls_are_refused():
    model = build_model("mlp")
    stage = Stage(index=0, module=model.stage(0, len(model) - 1), device=torch.device("cpu"), is_first=True,
                  is_last=True, loss_fn=model.loss_fn)
    x, y = sample_batch(model, 4)
    with pytest.raises(RuntimeError, match="before its forward"):
        stage.backward_input(0)
    stage.forward(0, x, y)
    with pytest.raises(RuntimeError, match="weight gradient of micro-batch 0 before its input gradient"):
        stage.backward_weight(0)
    stage.backward_input(0)
    with pytest.raises(RuntimeError, match="twice"):
        stage.backward_input(0)
    stage.backward_weight(0)
    assert stage.in_flight == 0
