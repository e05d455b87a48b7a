"""A convolutional network behind a fixed front end, for the automatic zero-bubble schedule's benchmark.

Many models start with work that trains nothing: a fixed filter bank, a
spectrogram, a frozen feature extractor. On the first pipeline stage that work
costs forward time and no backward time at all (the stage's input needs no
gradient), so the first stage is forward-heavy, while the convolutions of the
later stage spend more on their weight gradients than on their input
gradients (on this CPU, for many channels on small maps). ZB-H1's fixed
order delays the last stage's weight gradients by a micro-batch whatever the
times; the automatic schedule places them by the profile.

``front_end_net`` builds it as a ``LayerSequence`` of named layers, for
``[model] name = "zb_front_end:front_end_net"`` with this folder on the path.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.sequence import InputSpec, LayerSequence


class FixedFrontEnd(nn.Module):
    """``passes`` fixed 3x3 box blurs of the image (nothing trained), then a trainable stride-2 convolution to
    ``channels`` channels."""

    def __init__(self, passes: int, channels: int) -> None:
        super().__init__()
        self.passes = passes
        self.conv = nn.Conv2d(3, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.passes):
            x = F.avg_pool2d(x, 3, stride=1, padding=1)
        return F.relu(self.conv(x))


def _block(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


def front_end_net(passes: int = 40, num_classes: int = 10, image_size: int = 96) -> LayerSequence:
    """The fixed front end, four convolution blocks (32 to 512 channels, 48x48 down to 6x6 maps for a 96x96
    input) and a linear head, as a classifier of ``image_size`` RGB images (synthetic data can be drawn)."""
    layers = OrderedDict(
        front=FixedFrontEnd(passes, 32),
        block1=_block(32, 128, 2),
        block2=_block(128, 256, 2),
        block3=_block(256, 512, 2),
        block4=_block(512, 512, 1),
        head=nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)),
    )
    return LayerSequence(layers, name="front-end-net", task="image-classification",
                         input_spec=InputSpec((3, image_size, image_size), num_targets=num_classes))
