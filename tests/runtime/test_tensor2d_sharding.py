"""Single-process parts of the 2D shard rules: layouts, refusals, and the dense-equality of the 1 x 1 grid."""

from __future__ import annotations

import pytest
import torch

from workbench.runtime.strategies.tensor2d.comm import Grid2D
from workbench.runtime.strategies.tensor2d.sharding import (
    ShardRules2D, ShardRule, from_canonical, parallelize_2d, qkv_permutation, to_canonical)
from workbench.runtime.strategies.tensor2d.train import TensorParallelConfig, dense_gpt2, synthetic_batch


def gpt2(**sizes):
    return dense_gpt2(TensorParallelConfig(mode="dense", **sizes))


def test_qkv_permutation_groups_heads_per_column():
    # h=4, q=2: column 0 holds q0 q1 k0 k1 v0 v1 (units 0-1 of each part), column 1 the units 2-3.
    assert qkv_permutation(4, 2).tolist() == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]


@pytest.mark.parametrize("transform, shapes", [
    ("qkv_fused", [(8, 24)]), ("qkv_fused", [(24,)]), ("qkv_separate", [(8, 8)] * 3),
    ("qkv_separate", [(8,)] * 3), ("transpose", [(6, 8)]), ("none", [(5, 8)])])
def test_canonical_layouts_round_trip(transform, shapes):
    tensors = [torch.randn(*s) for s in shapes]
    rule = ShardRule("x", tuple(f"s{k}" for k in range(len(shapes))), transform)
    back = from_canonical(rule, to_canonical(rule, tensors, 2), 2)
    assert all(torch.equal(a, b) for a, b in zip(back, tensors))


def test_heads_not_divisible_by_q_are_refused_with_nearest_q():
    model = gpt2(n_embd=96, n_head=6, n_layer=1, q=1)
    with pytest.raises(ValueError, match=r"q=4 does not divide num_attention_heads=6; nearest valid q is 3"):
        ShardRules2D.for_model(model, 4)


def test_hidden_not_divisible_by_q_is_refused_with_nearest_q():
    with pytest.raises(ValueError, match=r"nearest valid q is 2"):
        TensorParallelConfig(mode="2d", q=3, n_embd=64, n_head=4)


@pytest.mark.parametrize("field, value", [("mode", "3d"), ("dp", 0), ("optimizer", "lamb"), ("batch_size", 3)])
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TensorParallelConfig(**{field: value})


def test_degenerate_grid_without_process_group_equals_dense():
    config = TensorParallelConfig(mode="2d", q=1, n_embd=32, n_head=2, n_layer=1, vocab_size=64, batch_size=2, seq_len=8)
    dense = dense_gpt2(config)
    module, rules = parallelize_2d(dense, Grid2D.single())
    ids = synthetic_batch(config, 0)
    reference = dense(ids, labels=ids)
    loss = module.loss(ids)
    torch.testing.assert_close(loss, reference.loss, rtol=0, atol=1e-5)
    reference.loss.backward()
    loss.backward()
    grads = rules.gather_dense_state_dict(module, Grid2D.single(), grads=True)
    for name, param in dense.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=0, atol=1e-5)
