"""The tables of a run config besides the plan: ``[optimizer]``, ``[data]`` and ``[events]``.

Each field declares its check (:mod:`~workbench.core.fields`), so each bad
value is a ValueError naming the config field. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .fields import (Rule, boolean, choice, config_error, from_dict, integer, is_number, number, spec, table, tuple_of,
                     validate)

__all__ = ["OptimizerConfig", "DataConfig", "EventsConfig", "is_import_path", "OPTIMIZERS", "DATA_KINDS"]

OPTIMIZERS = ("sgd", "adam")
DATA_KINDS = ("synthetic", "digits", "bytes-lm", "factory", "image-folder", "cifar10", "hf-disk")
# "package.module:factory" (a model or data factory given by import path)
IMPORT_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_import_path(text: object) -> bool:
    """Whether ``text`` names a factory as ``package.module:function`` (rather than a zoo model)."""
    return isinstance(text, str) and bool(IMPORT_PATH.match(text))


def _build(cls: type, name: str, data: Any) -> Any:
    """A table of the run config from its dict (an instance passes as is), naming ``name.key`` if unknown."""
    if isinstance(data, cls):
        return data
    return from_dict(cls, data, f"{name}.", config_error)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = spec("sgd", choice(OPTIMIZERS))
    lr: float = spec(0.01, number(0.0, strict=True))
    momentum: float = spec(0.0, number(0.0))
    weight_decay: float = spec(0.0, number(0.0))

    def __post_init__(self) -> None:
        validate(self, "optimizer.", config_error)


@dataclass(frozen=True)
class DataConfig:
    """Where batches come from.

    Built-in kinds: ``synthetic`` (random tensors of the model's input shape),
    ``digits`` (scikit-learn's 8x8 digits, resized) and ``bytes-lm`` (next-byte
    prediction over the standard library's source). Datasets on disk:
    ``image-folder`` (``path`` holding ``train/`` and ``val/`` class folders,
    or one folder split by ``val_fraction``), ``cifar10`` (``path`` holding the
    extracted ``cifar-10-batches-py``) and ``hf-disk`` (a dataset saved with
    ``datasets``' ``save_to_disk``; ``columns`` names the input and target).
    ``factory`` calls ``factory(**args)``, a ``package.module:function``
    returning ``(train, validation)`` torch Datasets of ``(input, target)``
    pairs. Dataset kinds load with ``workers`` DataLoader processes per rank,
    each rank reading only its data-parallel share.
    """

    kind: str = spec("synthetic", choice(DATA_KINDS))
    seq_len: int = spec(64, integer(1))
    factory: str = ""
    args: dict[str, Any] = spec(default_factory=dict, rule=table(
        expected="a table of keyword arguments for the data factory"))
    path: str = ""
    columns: tuple[str, ...] = spec((), tuple_of(expected="two column names: [input, target]"))
    image_size: int = spec(0, integer(0))
    val_fraction: float = spec(0.1, Rule(lambda v: is_number(v) and 0 < v < 1, "a fraction between 0 and 1"))
    workers: int = spec(0, integer(0))

    def __post_init__(self) -> None:
        validate(self, "data.", config_error)
        if self.kind == "factory" and not is_import_path(self.factory):
            raise config_error("data.factory", self.factory, "expected 'package.module:function' returning (train, "
                               "validation) datasets")
        if self.kind != "factory" and (self.factory or self.args):
            raise config_error("data.factory" if self.factory else "data.args", self.factory or self.args,
                               "only data.kind = 'factory' takes a factory and its args")
        if self.kind in ("image-folder", "cifar10", "hf-disk") and not (isinstance(self.path, str) and self.path):
            raise config_error("data.path", self.path, f"data.kind = {self.kind!r} reads a dataset from disk: give "
                               "its folder")
        if self.columns and (len(self.columns) != 2 or not all(isinstance(c, str) for c in self.columns)):
            raise config_error("data.columns", list(self.columns), "expected two column names: [input, target]")

    @property
    def is_dataset(self) -> bool:
        """Whether batches are drawn from finite datasets (vs the endless built-in streams)."""
        return self.kind in ("factory", "image-folder", "cifar10", "hf-disk")


@dataclass(frozen=True)
class EventsConfig:
    stage_events: bool = spec(True, boolean())
    heartbeat_s: float = spec(5.0, number(0.0, strict=True))

    def __post_init__(self) -> None:
        validate(self, "events.", config_error)
