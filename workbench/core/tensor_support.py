"""Which models tensor parallelism can split: the one rule the runtime refuses by and the planner plans by.

A plan's tensor parallelism runs one of two ways (:func:`runs_uniform_tp`):

* whole, on a uniform strategy (``tp1d-*``, ``tp2d-*`` without per-layer
  options): Megatron 1D or the SUMMA grid over a GPT-2, which shards it by
  its sizes. A model whose config lacks them (:data:`UNIFORM_TP_SIZES`:
  BERT, convolutional nets, the toy transformer, a factory's model) is
  refused: by the preflight before launch and by every rank
  (``runtime/uniform_tp.py``), and the planner offers no such plan for a
  model without a GPT-2 shape (``planning/strategy/space.py``), with a note
  saying so;
* layer by layer (per-layer options, sharded data parallelism, a pipeline):
  each layer it splits must be one the layer-by-layer runtime has rules for
  (``runtime/layer_parallel/tensor_rules.py``: GPT-2 and BERT blocks,
  embeddings, linears and chains of linears), by a degree those rules take
  (one that divides the attention heads). The runtime reads each layer's
  largest degree off a model (``tensor_parallel_limits``) and the planner's
  per-layer search splits no layer further (``Workload.tp_limits``).

Standard library only: the planner never imports torch.
"""

from __future__ import annotations

from typing import Any

from .config import runs_layer_by_layer
from .plan import ParallelPlan

__all__ = ["UNIFORM_TP_SIZES", "UNIFORM_TP_NEEDS", "PER_LAYER_TP", "runs_uniform_tp", "uniform_tp_missing"]

UNIFORM_TP_SIZES = ("n_embd", "n_head", "n_layer", "vocab_size", "n_positions")  # what uniform TP shards: GPT-2's
UNIFORM_TP_NEEDS = "uniform tensor parallelism needs a GPT-2 model such as 'gpt2-tiny'"
PER_LAYER_TP = "other models take tensor parallelism per layer ([[plan.layers]] with tp = '1d')"


def runs_uniform_tp(plan: ParallelPlan) -> bool:
    """Whether ``plan`` runs tensor parallelism on a uniform strategy (which shards a GPT-2 whole) rather than
    layer by layer."""
    return plan.tp_kind != "none" and not runs_layer_by_layer(plan)


def uniform_tp_missing(sizes: Any) -> list[str]:
    """The GPT-2 sizes a model's config lacks (a zoo config, a transformers config or None); empty when the
    uniform tensor-parallel strategies can shard the model."""
    return [k for k in UNIFORM_TP_SIZES if k not in (sizes or {})]
