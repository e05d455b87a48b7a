"""Boundary shapes: every block runs once on the run's device and is left where it was."""

import torch
from torch import nn

from workbench.runtime.stage import _home_device, _same_device, output_shapes


def test_shapes_dtypes_and_modes_of_each_block():
    blocks = [nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5)), nn.ReLU(), nn.Linear(5, 3)]
    stats = blocks[0][1].running_mean.clone()
    shapes = output_shapes(blocks, torch.randn(4, 6), torch.device("cpu"), None)
    assert shapes == [((4, 5), torch.float32), ((4, 5), torch.float32), ((4, 3), torch.float32)]
    assert all(b.training for b in blocks)  # eval for the pass, train again after
    assert torch.equal(blocks[0][1].running_mean, stats)  # statistics untouched
    assert all(p.device.type == "cpu" for b in blocks for p in b.parameters())


def test_bf16_autocast_gives_the_dtypes_the_run_sends():
    shapes = output_shapes([nn.Linear(6, 5), nn.Linear(5, 2)], torch.randn(3, 6), torch.device("cpu"),
                           torch.bfloat16)
    assert shapes == [((3, 5), torch.bfloat16), ((3, 2), torch.bfloat16)]


def test_where_a_block_lives():
    assert _home_device(nn.ReLU()) is None  # nothing to move
    assert _home_device(nn.BatchNorm1d(3, affine=False)) == torch.device("cpu")  # buffers only
    assert _same_device(torch.device("cpu"), torch.device("cpu"))
    assert not _same_device(torch.device("cpu"), torch.device("meta"))
