"""The tables of a run config besides the plan: ``[optimizer]``, ``[data]`` and ``[events]``.

With the field checks every part of a run config uses, so each bad value
is a ValueError naming the config field. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["OptimizerConfig", "DataConfig", "EventsConfig", "is_import_path", "OPTIMIZERS", "DATA_KINDS"]

OPTIMIZERS = ("sgd", "adam")
DATA_KINDS = ("synthetic", "digits", "bytes-lm", "factory", "image-folder", "cifar10", "hf-disk")
# "package.module:factory" (a model or data factory given by import path)
IMPORT_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_import_path(text: object) -> bool:
    """Whether ``text`` names a factory as ``package.module:function`` (rather than a zoo model)."""
    return isinstance(text, str) and bool(IMPORT_PATH.match(text))


def _fail(field_name: str, value: Any, valid: str) -> ValueError:
    return ValueError(f"config field {field_name!r} = {value!r} is invalid: {valid}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(name, value, f"expected an int >= {minimum}")


def _check_number(name: str, value: Any, minimum: float, *, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or (strict and value == minimum):
        raise _fail(name, value, f"expected a number {'>' if strict else '>='} {minimum}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...] | list[str]) -> None:
    if value not in choices:
        raise _fail(name, value, f"valid options are {', '.join(map(str, choices))}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _fail(name, value, "expected true or false")


def _build(cls: type, name: str, data: Any) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise _fail(name, data, f"expected a table with fields {[f.name for f in fields(cls)]}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise _fail(f"{name}.{unknown[0]}", data[unknown[0]], f"unknown field; valid fields are {sorted(known)}")
    return cls(**data)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_choice("optimizer.name", self.name, OPTIMIZERS)
        _check_number("optimizer.lr", self.lr, 0.0, strict=True)
        _check_number("optimizer.momentum", self.momentum, 0.0)
        _check_number("optimizer.weight_decay", self.weight_decay, 0.0)


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

    kind: str = "synthetic"
    seq_len: int = 64
    factory: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    columns: tuple[str, ...] = ()
    image_size: int = 0
    val_fraction: float = 0.1
    workers: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        _check_choice("data.kind", self.kind, DATA_KINDS)
        _check_int("data.seq_len", self.seq_len, 1)
        _check_int("data.image_size", self.image_size, 0)
        _check_int("data.workers", self.workers, 0)
        if isinstance(self.val_fraction, bool) or not isinstance(self.val_fraction, (int, float)) \
                or not 0 < self.val_fraction < 1:
            raise _fail("data.val_fraction", self.val_fraction, "expected a fraction between 0 and 1")
        if not isinstance(self.args, dict):
            raise _fail("data.args", self.args, "expected a table of keyword arguments for the data factory")
        if self.kind == "factory" and not is_import_path(self.factory):
            raise _fail("data.factory", self.factory, "expected 'package.module:function' returning (train, "
                        "validation) datasets")
        if self.kind != "factory" and (self.factory or self.args):
            raise _fail("data.factory" if self.factory else "data.args", self.factory or self.args,
                        "only data.kind = 'factory' takes a factory and its args")
        if self.kind in ("image-folder", "cifar10", "hf-disk") and not (isinstance(self.path, str) and self.path):
            raise _fail("data.path", self.path, f"data.kind = {self.kind!r} reads a dataset from disk: give its "
                        "folder")
        if self.columns and (len(self.columns) != 2 or not all(isinstance(c, str) for c in self.columns)):
            raise _fail("data.columns", list(self.columns), "expected two column names: [input, target]")

    @property
    def is_dataset(self) -> bool:
        """Whether batches are drawn from finite datasets (vs the endless built-in streams)."""
        return self.kind in ("factory", "image-folder", "cifar10", "hf-disk")


@dataclass(frozen=True)
class EventsConfig:
    stage_events: bool = True
    heartbeat_s: float = 5.0

    def __post_init__(self) -> None:
        _check_bool("events.stage_events", self.stage_events)
        _check_number("events.heartbeat_s", self.heartbeat_s, 0.0, strict=True)
