"""What uniform tensor parallelism (``tp1d-*``, ``tp2d-*`` plans) asks of a model: the sizes of a GPT-2.

Both the preflight (before launch) and the tensor-parallel strategy (in
every rank) refuse a model without them, with the same message.
"""

from __future__ import annotations

from ..core.config import RunConfig

__all__ = ["GPT2_SIZES", "check_tensor_parallel_model"]

GPT2_SIZES = ("n_embd", "n_head", "n_layer", "vocab_size", "n_positions")  # what uniform tensor parallelism shards


def check_tensor_parallel_model(config: RunConfig, sizes) -> None:
    """A uniform tensor-parallel plan (``tp1d-*``, ``tp2d-*``) shards a GPT-2: refuse a model without its sizes."""
    from ..core.config import runs_layer_by_layer

    if config.plan.tp_kind == "none" or runs_layer_by_layer(config.plan):
        return
    missing = [k for k in GPT2_SIZES if k not in (sizes or {})]
    if missing:
        raise ValueError(f"config field 'model.name' = {config.model.name!r} is invalid for plan {config.plan.name!r}: "
                         f"uniform tensor parallelism needs a GPT-2 model such as 'gpt2-tiny' (lacks {missing}); "
                         "other models take tensor parallelism per layer ([[plan.layers]] with tp = '1d')")
