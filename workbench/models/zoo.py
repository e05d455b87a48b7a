"""The model zoo: names -> real models from configs (random weights), as layer chains.

Every entry knows its default config, how to build the original model and
how to cut it into a :class:`LayerSequence`. Nothing is downloaded: weights
are drawn from a seeded generator, so ``build_model(name, seed=s)`` is the
same model on every machine, which is what lets every rank of a pipeline
build the dense model and keep only its stage. Config overrides are checked
against the entry's known keys, so a typo fails with the valid names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import torch
from torch import nn

from ..core.fields import check_int
from . import transformers_models as tm
from . import vision
from .sequence import InputSpec, LayerSequence

__all__ = ["ZooEntry", "ZOO", "build_model", "build_reference", "list_models", "describe_models", "get_entry"]


@dataclass(frozen=True)
class ZooEntry:
    """How to build one named model and cut it into layers."""

    name: str
    family: str
    description: str
    defaults: dict[str, Any]
    build: Callable[[dict], nn.Module]
    to_sequence: Callable[[nn.Module, str, dict], LayerSequence]
    extra_keys: tuple[str, ...] = field(default=())

    def config(self, overrides: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(overrides) - set(self.defaults) - set(self.extra_keys))
        if unknown:
            raise ValueError(f"unknown config keys {unknown} for model {self.name!r}; "
                             f"known keys: {sorted(set(self.defaults) | set(self.extra_keys))}")
        return {**self.defaults, **overrides}


def _image(num_classes: int = 1000, image_size: int = 224, in_channels: int = 3) -> dict[str, Any]:
    return {"num_classes": num_classes, "image_size": image_size, "in_channels": in_channels}


_BERT_BASE = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
              "intermediate_size": 3072, "max_position_embeddings": 512, "tie_word_embeddings": False,
              "seq_len": 128}
_BERT_TINY = {**_BERT_BASE, "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 256, "seq_len": 64}
_GPT2_SMALL = {"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
               "tie_word_embeddings": False, "seq_len": 128}
_GPT2_TINY = {**_GPT2_SMALL, "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 512,
              "bos_token_id": 0, "eos_token_id": 0, "seq_len": 64}
# Extra transformers config keys a user may override (dropout, norm eps, ...).
_BERT_EXTRA = ("hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps", "hidden_act")
_GPT2_EXTRA = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "n_inner", "activation_function")


def _entries() -> list[ZooEntry]:
    entries = []
    for depth in (18, 50, 101):
        entries.append(ZooEntry(
            f"resnet{depth}", "resnet", f"torchvision ResNet-{depth}: stem, one unit per residual block, head",
            _image(), lambda c, d=depth: vision.build_resnet(d, c), vision.resnet_sequence))
    for depth in (11, 16, 19):
        entries.append(ZooEntry(
            f"vgg{depth}", "vgg", f"torchvision VGG-{depth}: one unit per conv, one per classifier layer",
            _image(), lambda c, d=depth: vision.build_vgg(d, c), vision.vgg_sequence))
    entries.append(ZooEntry(
        "vgg-tiny", "vgg", "two conv blocks and large fully connected layers; trains on digits in seconds",
        {**_image(num_classes=10, image_size=32), "conv_channels": (16, 32), "fc_width": 1024},
        vision.build_vgg_tiny,
        lambda m, n, c: vision.sequential_sequence(m, n, c, InputSpec(
            (c["in_channels"], c["image_size"], c["image_size"]), num_targets=c["num_classes"]),
            task="image-classification")))
    entries.append(ZooEntry(
        "mlp", "toy", "multi-layer perceptron on flat features (8x8 digits by default)",
        {"input_dim": 64, "hidden": 256, "depth": 3, "num_classes": 10}, vision.build_mlp,
        lambda m, n, c: vision.sequential_sequence(m, n, c, InputSpec((c["input_dim"],), num_targets=c["num_classes"]))))
    entries.append(ZooEntry(
        "toy-transformer", "toy", "small pre-norm causal transformer written here, byte vocabulary",
        {"vocab_size": 256, "dim": 64, "heads": 4, "layers": 4, "max_len": 512, "seq_len": 64},
        tm.build_toy_transformer, tm.toy_transformer_sequence))
    entries.append(ZooEntry("bert-base", "bert", "transformers BERT-base (110M when tied), masked LM: embeddings, 12 layers, MLM head",
                            _BERT_BASE, tm.build_bert, tm.bert_sequence, _BERT_EXTRA))
    entries.append(ZooEntry("bert-tiny", "bert", "BERT with hidden 64, 2 layers, byte vocabulary",
                            _BERT_TINY, tm.build_bert, tm.bert_sequence, _BERT_EXTRA))
    entries.append(ZooEntry("gpt2-small", "gpt2", "transformers GPT-2 small (124M when tied): embeddings, 12 blocks, head",
                            _GPT2_SMALL, tm.build_gpt2, tm.gpt2_sequence, _GPT2_EXTRA))
    entries.append(ZooEntry("gpt2-tiny", "gpt2", "GPT-2 with hidden 64, 2 blocks, byte vocabulary (256)",
                            _GPT2_TINY, tm.build_gpt2, tm.gpt2_sequence, _GPT2_EXTRA))
    return entries


ZOO: dict[str, ZooEntry] = {entry.name: entry for entry in _entries()}


def list_models() -> list[str]:
    """Names :func:`build_model` accepts."""
    return list(ZOO)


def get_entry(name: str) -> ZooEntry:
    if name not in ZOO:
        raise ValueError(f"unknown model {name!r}; available models: {', '.join(ZOO)}")
    return ZOO[name]


def build_reference(name: str, seed: int = 0, **overrides: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The original model (torchvision / transformers / zoo module) and its resolved config."""
    entry = get_entry(name)
    check_int("seed", seed)
    config = entry.config(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = entry.build(config)
    return model, config


def build_model(name: str, seed: int = 0, **overrides: Any) -> LayerSequence:
    """Build zoo model ``name`` with seeded random weights, as a :class:`LayerSequence`."""
    model, config = build_reference(name, seed, **overrides)
    return get_entry(name).to_sequence(model, name, config)


@lru_cache(maxsize=None)
def _num_params(name: str) -> int:
    entry = get_entry(name)
    with torch.device("meta"):
        model = entry.build(entry.config({}))
    return sum(p.numel() for p in model.parameters())


def describe_models() -> list[dict[str, Any]]:
    """One row per zoo model: name, family, task, parameter count (default config), description."""
    rows = []
    for entry in ZOO.values():
        rows.append({"name": entry.name, "family": entry.family, "num_params": _num_params(entry.name),
                     "description": entry.description})
    return rows
