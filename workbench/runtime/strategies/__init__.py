"""Parallel strategies run by the runtime, by config name.

``STRATEGIES`` maps a config's ``strategy`` to ``"module:Class"`` inside
this package, imported only when a run uses it (so registering a strategy
costs nothing and needs no torch import here). Adding a strategy is one
line below, plus its layout in ``workbench.core.config.STRATEGY_LAYOUTS``.
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["STRATEGIES", "strategy_class"]

STRATEGIES: dict[str, str] = {
    "gpipe": "pipeline:ScheduledPipeline",
    "1f1b": "pipeline:ScheduledPipeline",
    "interleaved": "pipeline:ScheduledPipeline",
    "gropipe": "gropipe:GroPipe",
    "async": "async_pipeline:AsyncPipeline",
    "ddp": "ddp:DataParallel",
    "torch-pipelining": "torch_pipelining:TorchPipelining",
    "tensor2d": "tensor_parallel:TensorParallel2D",
    "tensor1d": "tensor_parallel:TensorParallel1D",
}


def strategy_class(name: str) -> type:
    """The Strategy class registered under ``name``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; registered: {', '.join(sorted(STRATEGIES))}")
    module_name, class_name = STRATEGIES[name].split(":")
    return getattr(import_module(f"{__name__}.{module_name}"), class_name)
