"""A small model with BatchNorm for the evaluation tests (its running statistics matter in eval mode)."""

from collections import OrderedDict

from torch import nn


def conv_bn(channels: int = 8, classes: int = 10) -> nn.Sequential:
    """Digits (3 x 32 x 32) -> two strided conv + BatchNorm blocks -> a linear head."""
    return nn.Sequential(OrderedDict([
        ("block1", nn.Sequential(nn.Conv2d(3, channels, 3, stride=2, padding=1), nn.BatchNorm2d(channels), nn.ReLU())),
        ("block2", nn.Sequential(nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.BatchNorm2d(channels),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(1))),
        ("head", nn.Linear(channels, classes)),
    ]))
