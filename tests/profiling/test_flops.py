"""FLOP counts against published figures.

Convention: torch's FlopCounterMode counts a multiply-add as 2 FLOPs. The
published CNN figures (ResNet-50 "4.1 GFLOPs", VGG-16 "15.5 GFLOPs" per
224x224 image) count multiply-accumulates, so they are compared with
``flops / 2``. For BERT-base, forward FLOPs per token are compared with
2 x 110M parameters (each weight does one multiply-add per token; the
embedding lookups do none and the tied output projection does as many), at
sequence length 128 where attention adds under 3%. Models are built on the
meta device: counting needs shapes, not values.
"""

import pytest
import torch
from torch import nn

from workbench.models import LayerSequence, build_model, sample_batch
from workbench.profiling import count_flops


def meta_flops(name, batch_size=1, **overrides):
    with torch.device("meta"):
        seq = build_model(name, **overrides)
    inputs, targets = sample_batch(name, batch_size)
    return count_flops(seq, (inputs.to("meta"), targets.to("meta"))), seq


@pytest.mark.parametrize("name,published_macs", [("resnet50", 4.1e9), ("vgg16", 15.5e9)])
def test_cnn_macs_match_published(name, published_macs):
    flops, _ = meta_flops(name)
    assert abs(sum(flops) / 2 - published_macs) / published_macs < 0.05


def test_bert_base_flops_per_token_about_twice_parameters():
    flops, seq = meta_flops("bert-base", 2)
    per_token = sum(flops) / (2 * 128)
    assert abs(per_token - 2 * 110e6) / (2 * 110e6) < 0.05
    embeddings = sum(p.numel() for p in seq[0].parameters())
    weights_used_per_token = seq.num_parameters() - embeddings  # every matmul weight, untied head included
    assert abs(per_token - 2 * weights_used_per_token) / (2 * weights_used_per_token) < 0.05


def test_attention_is_counted_on_cpu():
    seq = build_model("gpt2-tiny")
    batch = sample_batch(seq, 2)
    flops = count_flops(seq, batch)
    hidden, length = 64, 64
    projections = 2 * 2 * length * (4 * hidden * hidden + 8 * hidden * hidden)  # qkv+out, mlp; batch 2
    attention = 2 * 2 * 2 * length * length * hidden  # scores and weighted sum; batch 2
    assert flops[1] == projections + attention


def test_linear_flops_exact():
    seq = LayerSequence.from_sequential(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    flops = count_flops(seq, (torch.randn(8, 16), torch.zeros(8, dtype=torch.long)))
    assert flops == [2 * 8 * 16 * 32, 0, 2 * 8 * 32 * 4]
