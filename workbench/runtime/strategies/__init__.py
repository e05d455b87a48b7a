"""Parallel strategies run by the runtime, chosen by what the run's plan says.

:func:`strategy_class` reads the plan's pipeline kind (and, without a
pipeline, its tensor parallelism) and returns the class that runs it, as
``"module:Class"`` inside this package imported only when a run uses it (so
registering a strategy costs nothing and needs no torch import here).
Pipeline kinds say which runtime runs them (``PipelineSpec.runtime``), so a
new kind that the interpreter can run needs nothing here; a new runtime is
one line in :data:`BY_RUNTIME`.

Plans that give layers different options, shard data parallelism (zero2,
fsdp) or use 1D tensor parallelism other than the uniform 1D strategy's run
layer by layer (:func:`~workbench.core.config.runs_layer_by_layer`), whatever
their pipeline kind; the config has refused, before launch, what that
runtime cannot run.
"""

from __future__ import annotations

from importlib import import_module

from ...core.config import runs_layer_by_layer
from ...core.plan import NoPipeline, ParallelPlan

__all__ = ["BY_RUNTIME", "BY_TENSOR", "LAYERWISE", "strategy_class"]

# a pipeline kind's runtime (PipelineSpec.runtime) -> the strategy that runs it
BY_RUNTIME: dict[str, str] = {
    "pipeline": "pipeline:ScheduledPipeline",
    "grouped": "gropipe:GroPipe",
    "async": "async_pipeline:AsyncPipeline",
    "torch": "torch_pipelining:TorchPipelining",
}
# plans without a pipeline, by the mesh's tensor parallelism
BY_TENSOR: dict[str, str] = {
    "none": "ddp:DataParallel",
    "2d": "tensor_parallel:TensorParallel2D",
    "1d": "tensor_parallel:TensorParallel1D",
}

LAYERWISE = "layerwise:Layerwise"


def strategy_class(plan: ParallelPlan) -> type:
    """The Strategy class that runs ``plan``."""
    if not isinstance(plan, ParallelPlan):
        raise ValueError(f"strategy_class takes a ParallelPlan, got {type(plan).__name__}")
    if runs_layer_by_layer(plan):
        target = LAYERWISE
    elif isinstance(plan.pipeline, NoPipeline):
        target = BY_TENSOR[plan.tp_kind]
    else:
        target = BY_RUNTIME[plan.pipeline.runtime]
    module_name, class_name = target.split(":")
    return getattr(import_module(f"{__name__}.{module_name}"), class_name)
