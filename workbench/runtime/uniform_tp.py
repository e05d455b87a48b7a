"""What uniform tensor parallelism (``tp1d-*``, ``tp2d-*`` plans) asks of a model: the sizes of a GPT-2.

Both the preflight (before launch) and the tensor-parallel strategy (in
every rank) refuse a model without them, with the same message. The rule is
:mod:`workbench.core.tensor_support`'s, which the planner plans by too.
"""

from __future__ import annotations

from ..core.config import RunConfig
from ..core.tensor_support import PER_LAYER_TP, UNIFORM_TP_NEEDS, UNIFORM_TP_SIZES, runs_uniform_tp, \
    uniform_tp_missing

__all__ = ["GPT2_SIZES", "check_tensor_parallel_model"]

GPT2_SIZES = UNIFORM_TP_SIZES  # what uniform tensor parallelism shards


def check_tensor_parallel_model(config: RunConfig, sizes) -> None:
    """A uniform tensor-parallel plan (``tp1d-*``, ``tp2d-*``) shards a GPT-2: refuse a model without its sizes."""
    if not runs_uniform_tp(config.plan):
        return
    missing = uniform_tp_missing(sizes)
    if missing:
        raise ValueError(f"config field 'model.name' = {config.model.name!r} is invalid for plan {config.plan.name!r}: "
                         f"{UNIFORM_TP_NEEDS} (lacks {missing}); {PER_LAYER_TP}")
