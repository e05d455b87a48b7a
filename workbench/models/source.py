"""A run's model from its config: a zoo name, or a user factory given by import path.

``model = "package.module:function"`` names a factory; ``model_args`` are its
keyword arguments. The factory returns a :class:`LayerSequence` (used as it
is), an ``nn.Sequential`` (its children become the layers) or any other
``nn.Module``, which is traced with ``torch.fx`` and cut into a chain: before
each of ``split_points`` when given (``["layer2", "layer3"]``), else at its
top-level children (refused, naming the values, when a branch crosses a cut).

Every rank of a torchrun job calls the factory itself with the run's seed
set, so the weights agree across ranks without being sent; that is also why
a model object in a notebook cannot be launched as it is: the processes
need a name they can import.

Each check raises a ValueError naming the config field, so the CLI and
:class:`~workbench.jobs.Job` refuse a bad factory before any process starts.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import torch
from torch import nn

from ..core.fields import reject_unknown
from .sequence import InputSpec, LayerSequence

__all__ = ["load_factory", "check_factory_args", "model_from_factory", "build_run_model"]


def load_factory(path: str, field: str = "model.name") -> Callable[..., Any]:
    """Import ``package.module:function``; a ValueError naming ``field`` when it cannot."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import can raise anything its module raises
        raise ValueError(f"config field {field!r} = {path!r}: cannot import module {module_name!r} "
                         f"({type(exc).__name__}: {exc}); is its package on PYTHONPATH or installed?") from None
    factory = getattr(module, attr, None)
    if factory is None:
        names = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ValueError(f"config field {field!r} = {path!r}: module {module_name!r} has no {attr!r}; "
                         f"its callables are {names}")
    if not callable(factory):
        raise ValueError(f"config field {field!r} = {path!r}: {attr!r} is a {type(factory).__name__}, "
                         "not a callable factory")
    return factory


def check_factory_args(factory: Callable[..., Any], args: dict[str, Any], field: str, path: str) -> None:
    """Refuse keyword arguments the factory's signature does not take (unless it takes ``**kwargs``)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin without a signature: let the call say
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items()
                if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    reject_unknown(args, accepted, error=lambda key, _, takes: ValueError(
        f"config field {field!r} has unknown key {key!r} for factory {path!r}; {takes}"), unknown="it takes",
        ordered=True)
    try:
        signature.bind(**args)
    except TypeError as exc:
        raise ValueError(f"config field {field!r} does not fit factory {path!r}: {exc}") from None


def model_from_factory(path: str, args: dict[str, Any] | None = None, *, seed: int = 0,
                       split_points: tuple[str, ...] | list[str] = (),
                       input_spec: InputSpec | None = None) -> LayerSequence:
    """Call the factory with ``seed`` set and turn what it returns into a :class:`LayerSequence`."""
    args = dict(args or {})
    factory = load_factory(path)
    check_factory_args(factory, args, "model.args", path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            built = factory(**args)
        except Exception as exc:
            raise ValueError(f"config field 'model.name' = {path!r}: the factory raised {type(exc).__name__}: "
                             f"{exc}") from exc
    name = path.rpartition(":")[2]
    if isinstance(built, LayerSequence):
        if split_points:
            raise ValueError(f"config field 'model.split_points' = {list(split_points)}: factory {path!r} returns a "
                             "LayerSequence, which is already cut into layers")
        if built.input_spec is None and input_spec is not None:
            built.input_spec = input_spec
        return built
    if not isinstance(built, nn.Module):
        raise ValueError(f"config field 'model.name' = {path!r}: the factory returned a {type(built).__name__}; "
                         "it must return an nn.Module (an nn.Sequential, a LayerSequence or any module)")
    if split_points:
        from .tracing import split_at_points

        try:
            units = split_at_points(built, split_points)
        except ValueError as exc:
            raise ValueError(f"config field 'model.split_points' = {list(split_points)}: {exc}") from None
        return LayerSequence(units, name=name, task="custom", input_spec=input_spec)
    try:
        seq = LayerSequence.from_module(built, name=name, input_spec=input_spec)
    except ValueError as exc:
        raise ValueError(f"config field 'model.name' = {path!r}: {exc}; or name where to cut it with model.split_points"
                         ) from None
    seq.model_name = name
    return seq


def build_run_model(config, *, input_spec: InputSpec | None = None) -> LayerSequence:
    """The model a run config names, as every rank and the reference build it (seeded by ``config.training.seed``)."""
    if config.model.from_factory:
        return model_from_factory(config.model.name, config.model.args, seed=config.training.seed,
                                  split_points=config.model.split_points, input_spec=input_spec)
    from .zoo import build_model, list_models

    if config.model.name not in list_models():
        raise ValueError(f"config field 'model.name' = {config.model.name!r} is not in the zoo; valid: "
                         f"{', '.join(list_models())}, or a factory 'package.module:function'")
    try:
        return build_model(config.model.name, seed=config.training.seed, **config.model.overrides)
    except ValueError as exc:
        raise ValueError(f"config field 'model.overrides': {exc}") from None

