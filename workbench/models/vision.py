"""Image classifiers as layer chains: torchvision ResNet and VGG, a tiny VGG, a toy MLP.

Where to cut a CNN is a modelling decision, made once here:

* ResNet: ``stem`` (conv1, bn1, relu, maxpool), one unit per residual block
  (``layer1_0`` ...; the skip connection stays inside its block) and ``head``
  (average pool, flatten, fc).
* VGG: one unit per convolution (with its ReLU and the max-pool that follows
  it; the last also carries the adaptive average pool and the flatten), then
  one unit per classifier layer (``fc6``, ``fc7``, ``fc8`` with their ReLU
  and dropout).

Each ``build_*`` returns the original model (for reference checks) and each
``*_sequence`` wraps the original module objects, never copies.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from .sequence import InputSpec, LayerSequence

__all__ = [
    "build_resnet", "resnet_sequence", "build_vgg", "vgg_sequence",
    "build_vgg_tiny", "build_mlp", "sequential_sequence",
]


def _image_spec(config: dict) -> InputSpec:
    size = config["image_size"]
    return InputSpec(shape=(config["in_channels"], size, size), dtype=torch.float32,
                     num_targets=config["num_classes"])


def build_resnet(depth: int, config: dict) -> nn.Module:
    import torchvision  # on first use: importing it costs every rank seconds at start

    builders = {18: torchvision.models.resnet18, 50: torchvision.models.resnet50, 101: torchvision.models.resnet101}
    model = builders[depth](weights=None, num_classes=config["num_classes"])
    if config["in_channels"] != 3:
        model.conv1 = nn.Conv2d(config["in_channels"], 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def resnet_sequence(model: nn.Module, name: str, config: dict) -> LayerSequence:
    units: list[tuple[str, nn.Module]] = [("stem", nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool))]
    for stage_index in range(1, 5):
        for block_index, block in enumerate(getattr(model, f"layer{stage_index}")):
            units.append((f"layer{stage_index}_{block_index}", block))
    units.append(("head", nn.Sequential(model.avgpool, nn.Flatten(1), model.fc)))
    return LayerSequence(units, name=name, task="image-classification", input_spec=_image_spec(config), config=config)


def build_vgg(depth: int, config: dict) -> nn.Module:
    import torchvision

    builders = {11: torchvision.models.vgg11, 16: torchvision.models.vgg16, 19: torchvision.models.vgg19}
    model = builders[depth](weights=None, num_classes=config["num_classes"])
    if config["in_channels"] != 3:
        first = model.features[0]
        model.features[0] = nn.Conv2d(config["in_channels"], first.out_channels, kernel_size=3, padding=1)
    return model


def vgg_sequence(model: nn.Module, name: str, config: dict) -> LayerSequence:
    conv_units: list[tuple[str, list[nn.Module]]] = []
    block, index_in_block = 1, 0
    for module in model.features:
        if isinstance(module, nn.Conv2d):
            index_in_block += 1
            conv_units.append((f"conv{block}_{index_in_block}", [module]))
        else:
            conv_units[-1][1].append(module)
            if isinstance(module, nn.MaxPool2d):
                block, index_in_block = block + 1, 0
    conv_units[-1][1].extend([model.avgpool, nn.Flatten(1)])
    fc_units: list[tuple[str, list[nn.Module]]] = []
    for module in model.classifier:
        if isinstance(module, nn.Linear):
            fc_units.append((f"fc{6 + len(fc_units)}", [module]))
        else:
            fc_units[-1][1].append(module)
    units = [(unit_name, nn.Sequential(*modules)) for unit_name, modules in conv_units + fc_units]
    return LayerSequence(units, name=name, task="image-classification", input_spec=_image_spec(config), config=config)


def build_vgg_tiny(config: dict) -> nn.Module:
    """Two small conv blocks then large fully connected layers (weight-bound, like VGG's classifier)."""
    channels, size, width = config["in_channels"], config["image_size"], config["fc_width"]
    conv1, conv2 = config["conv_channels"]
    if size % 4:
        raise ValueError(f"image_size must be a multiple of 4 for vgg-tiny, got {size}")
    flat = conv2 * (size // 4) ** 2
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Sequential(nn.Conv2d(channels, conv1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))),
        ("conv2", nn.Sequential(nn.Conv2d(conv1, conv2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(1))),
        ("fc1", nn.Sequential(nn.Linear(flat, width), nn.ReLU())),
        ("fc2", nn.Sequential(nn.Linear(width, width), nn.ReLU())),
        ("fc3", nn.Linear(width, config["num_classes"])),
    ]))


def build_mlp(config: dict) -> nn.Module:
    """``depth`` hidden layers of ``hidden`` units with ReLU; input flattened."""
    layers: list[tuple[str, nn.Module]] = []
    width_in = config["input_dim"]
    for index in range(config["depth"]):
        block: list[nn.Module] = [nn.Flatten(1)] if index == 0 else []
        block += [nn.Linear(width_in, config["hidden"]), nn.ReLU()]
        layers.append((f"fc{index + 1}", nn.Sequential(*block)))
        width_in = config["hidden"]
    layers.append(("out", nn.Linear(width_in, config["num_classes"])))
    return nn.Sequential(OrderedDict(layers))


def sequential_sequence(model: nn.Sequential, name: str, config: dict, spec: InputSpec,
                        task: str = "classification") -> LayerSequence:
    """The zoo's own ``nn.Sequential`` models: their children are already the units."""
    return LayerSequence(list(model.named_children()), name=name, task=task, input_spec=spec, config=config)
