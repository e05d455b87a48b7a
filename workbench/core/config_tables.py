"""The tables of a run config besides the plan: ``[model]``, ``[data]``, ``[training]`` (with
``[training.optimizer]``), ``[evaluation]``, ``[events]``, ``[faults]`` and ``[run]``.

Each field declares its check (:mod:`~workbench.core.fields`), so each bad
value is a ValueError naming the config field by its place in the file
(``training.steps``). Checks that involve another table (a batch against the
plan) are the run config's own. Standard library only.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any

from .fields import (Rule, boolean, choice, config_error, from_dict, integer, is_number, number, spec, string, table,
                     tuple_of, validate)

__all__ = ["ModelConfig", "DataConfig", "TrainingConfig", "OptimizerConfig", "EvaluationConfig", "EventsConfig",
           "FaultsConfig", "RunOptions", "is_import_path", "OPTIMIZERS", "DATA_KINDS", "PRECISIONS"]

OPTIMIZERS = ("sgd", "adam")
DATA_KINDS = ("synthetic", "digits", "bytes-lm", "factory", "image-folder", "cifar10", "hf-disk")
PRECISIONS = ("auto", "fp32", "bf16")
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


def _factory_name(obj: Any) -> Any:
    """A model factory (function or class) passed as an object, as the import path the ranks can use.

    Processes started by torchrun cannot receive a model object from the
    notebook; they build the model themselves, so the config keeps a name
    they can import. A model *instance*, or a factory defined in the notebook
    itself, has no such name: that is refused with what to do instead.
    """
    what = type(obj).__name__
    if hasattr(obj, "named_parameters") and not isinstance(obj, type):
        raise config_error("model.name", f"<{what} object>", "a model object cannot be sent to the run's processes, "
                           "which build the model themselves: move the code that builds it into a function in a "
                           "module (a .py file next to the notebook) and pass model = 'module:function' (or the "
                           "function)")
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not callable(obj) or not module or not qualname:
        return obj  # not a factory: the string check names the field
    if module == "__main__" or "<" in qualname or "." in qualname:
        raise config_error("model.name", f"{module}.{qualname}", "this factory is defined in the notebook (or "
                           "nested), so the run's processes cannot import it: move it into a module (a .py file next "
                           "to the notebook) and import it from there")
    try:
        found = getattr(importlib.import_module(module), qualname, None)
    except Exception:  # noqa: BLE001 - any import failure means it cannot be named
        found = None
    if found is not obj:
        raise config_error("model.name", f"{module}.{qualname}", "this factory cannot be imported by its name; pass "
                           "model = 'package.module:function'")
    return f"{module}:{qualname}"


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: a zoo model by ``name`` (``overrides`` change its constructor's config), or a factory
    ``name = "package.module:function"`` that every rank calls with ``args`` and cuts before each submodule
    in ``split_points``. ``model = "vgg-tiny"`` in a file is short for ``[model] name = "vgg-tiny"``; in
    Python, ``name`` may be the factory itself (it is stored by its import path)."""

    name: str
    overrides: dict[str, Any] = spec(default_factory=dict, rule=table(
        expected="a table of model constructor overrides"))
    args: dict[str, Any] = spec(default_factory=dict, rule=table(
        expected="a table of keyword arguments for the model factory"))
    split_points: tuple[str, ...] = spec((), tuple_of(string(empty=False), expected="a list of submodule names to "
                                                      "cut the model before, such as ['layer2', 'layer3']"))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            object.__setattr__(self, "name", _factory_name(self.name))
        if not isinstance(self.name, str) or not self.name:
            raise config_error("model.name", self.name, "expected a zoo model name such as 'vgg-tiny', 'resnet18', "
                               "'mlp', or a factory 'package.module:function'")
        validate(self, "model.", config_error)
        if self.args and not self.from_factory:
            raise config_error("model.args", self.args, f"model {self.name!r} is a zoo name; zoo models take "
                               "model.overrides, and model.args go to a factory name = 'package.module:function'")
        if self.overrides and self.from_factory:
            raise config_error("model.overrides", self.overrides, "a factory model takes its arguments as model.args")
        if self.split_points and not self.from_factory:
            raise config_error("model.split_points", list(self.split_points), "zoo models are already cut into "
                               "layers; split_points apply to a factory model")

    @property
    def from_factory(self) -> bool:
        """Whether ``name`` is a ``package.module:function`` factory rather than a zoo name."""
        return is_import_path(self.name)

    @property
    def heads(self) -> int | None:
        """The attention heads its overrides set (``n_head`` or ``num_attention_heads``), if they set them."""
        heads = self.overrides.get("n_head", self.overrides.get("num_attention_heads"))
        return heads if isinstance(heads, int) and heads >= 1 else None


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
    val_fraction: float = spec(0.1, Rule(lambda v: is_number(v) and 0 < v < 1, "a fraction between 0 and 1",
                                         schema={"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}))
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
class OptimizerConfig:
    """``[training.optimizer]``: ``sgd`` (with ``momentum``, ``weight_decay``) or ``adam``."""

    name: str = spec("sgd", choice(OPTIMIZERS))
    lr: float = spec(0.01, number(0.0, strict=True))
    momentum: float = spec(0.0, number(0.0))
    weight_decay: float = spec(0.0, number(0.0))

    def __post_init__(self) -> None:
        validate(self, "training.optimizer.", config_error)


@dataclass(frozen=True)
class TrainingConfig:
    """``[training]``: ``steps`` optimizer steps of ``global_batch`` samples each, split into ``grad_accum``
    rounds (each over the plan's replicas and micro-batches); the ``seed`` every rank builds the model and data
    with; ``precision``; per-rank checkpoints every ``checkpoint_every`` steps, and ``resume`` from the newest;
    ``fused_weight_grads``: the pipelines' linear layers accumulate their weight gradients inside the product
    (:mod:`workbench.models.fused_grads`)."""

    global_batch: int = spec(32, integer(1))
    steps: int = spec(10, integer(1))
    seed: int = spec(0, integer(0))
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    grad_accum: int = spec(1, integer(1))
    precision: str = spec("auto", choice(PRECISIONS))
    checkpoint_every: int = spec(0, integer(0))
    resume: bool = spec(False, boolean())
    fused_weight_grads: bool = spec(False, boolean())

    def __post_init__(self) -> None:
        object.__setattr__(self, "optimizer", _build(OptimizerConfig, "training.optimizer", self.optimizer))
        validate(self, "training.", config_error)


@dataclass(frozen=True)
class EvaluationConfig:
    """``[evaluation]``: evaluate ``every`` N steps (0: never) on ``batches`` held-out batches; a
    ``target_accuracy`` (classifiers) or ``target_perplexity`` (language models) the run reports reaching."""

    every: int = spec(0, integer(0))
    batches: int = spec(8, integer(1))
    target_accuracy: float = spec(0.0, number(0, 1, expected="a top-1 accuracy in [0, 1] (0: none)"))
    target_perplexity: float = spec(0.0, number(0.0))

    def __post_init__(self) -> None:
        validate(self, "evaluation.", config_error)
        if (self.target_accuracy or self.target_perplexity) and not self.every:
            raise config_error("evaluation.every", self.every, "a target is reached only by evaluating: set "
                               "evaluation.every to evaluate every N steps")


@dataclass(frozen=True)
class EventsConfig:
    """``[events]``: what a run records besides its steps: per-action ``stage_events`` for the measured
    timeline, a heartbeat every ``heartbeat_s`` (what a stall is judged by), and rank 0's TensorBoard scalars
    (``tensorboard``)."""

    stage_events: bool = spec(True, boolean())
    heartbeat_s: float = spec(5.0, number(0.0, strict=True))
    tensorboard: bool = spec(True, boolean())

    def __post_init__(self) -> None:
        validate(self, "events.", config_error)


@dataclass(frozen=True)
class FaultsConfig:
    """``[faults]``: a failure injected on purpose, to test restarts and resumption: ``rank`` fails at
    ``step`` (-1: never)."""

    step: int = spec(-1, integer(-1))
    rank: int = spec(0, integer(0))

    def __post_init__(self) -> None:
        validate(self, "faults.", config_error)


_DEVICE = Rule(lambda v: v in ("auto", "cpu", "cuda") or (isinstance(v, str) and v.startswith("cuda:")),
               "auto, cpu, cuda or cuda:N", valid="valid options are auto, cpu, cuda, cuda:N",
               schema={"type": "string", "pattern": "^(auto|cpu|cuda|cuda:.*)$"})


@dataclass(frozen=True)
class RunOptions:
    """``[run]``: where and how the run's processes work: the run directory ``dir`` (set by the launch),
    ``device``, ``placement`` (``placement[r]``: the process that runs rank ``r`` of the plan's mesh), how long
    a collective may wait (``collective_timeout_s``), and ``dump_params`` (each rank writes its final
    parameters, to compare with a reference)."""

    dir: str = spec("", string(expected="a directory path string"))
    device: str = spec("auto", _DEVICE)
    placement: tuple[int, ...] = spec((), tuple_of(integer(), expected="a list of process ranks, one per rank of "
                                                   "the plan's mesh"))
    collective_timeout_s: float = spec(120.0, number(0.0, strict=True))
    dump_params: bool = spec(False, boolean())

    def __post_init__(self) -> None:
        validate(self, "run.", config_error)
