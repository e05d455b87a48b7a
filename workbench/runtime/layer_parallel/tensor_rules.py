"""1D tensor-parallel rules: which linears of a layer are column- or row-parallel.

DTensor ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``
on the linears of HF GPT-2 blocks (``Conv1D``, weight [in, out]), HF BERT
layers and plain ``nn.Linear`` chains; GPT-2's fused q|k|v weight is re-laid
out head-group-major so that a column shard holds complete heads of q, k and v.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import nn

__all__ = ["tensor_parallel_rules", "tensor_parallel_limit", "tensor_parallel_limits"]


def _conv1d_class() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency of the zoo
        return None
    return Conv1D


def _is_conv1d(module: nn.Module) -> bool:
    cls = _conv1d_class()
    return cls is not None and isinstance(module, cls)


def _qkv_order(width: int, degree: int) -> torch.Tensor:
    """Column order putting q, k, v of head group p side by side: [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]."""
    hidden = width // 3
    block = hidden // degree
    return torch.tensor([part * hidden + p * block + i for p in range(degree) for part in range(3)
                         for i in range(block)])


@lru_cache(maxsize=None)
def _styles():
    """ParallelStyles for HF ``Conv1D`` (weight [in, out]), subclasses of torch's Colwise/Rowwise."""
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def distribute_conv1d(style, module: nn.Module, mesh, placements: dict[str, Any],
                          order: torch.Tensor | None = None) -> nn.Module:
        """Shard a Conv1D's parameters (columns re-laid out by ``order`` first) with the style's input/output hooks."""
        def partition(_name: str, mod: nn.Module, mesh_) -> None:
            for name, param in list(mod.named_parameters(recurse=False)):
                data = param.detach() if order is None else param.detach().index_select(-1, order.to(param.device))
                mod.register_parameter(name, nn.Parameter(distribute_tensor(data, mesh_, [placements[name]])))

        return distribute_module(
            module, mesh, partition,
            input_fn=lambda m, i, mesh_: style._prepare_input_fn(style.input_layouts, style.desired_input_layouts,
                                                                 m, i, mesh_),
            output_fn=lambda m, o, mesh_: style._prepare_output_fn(style.output_layouts, style.use_local_output,
                                                                   m, o, mesh_))

    class Colwise(ColwiseParallel):
        """Column-parallel ``nn.Linear`` (torch's own) or ``Conv1D`` (weight Shard(1), bias Shard(0));
        ``fused_qkv`` re-lays the columns out so each shard holds whole heads of q, k and v."""

        def __init__(self, *, fused_qkv: bool = False, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.fused_qkv = fused_qkv

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            if not _is_conv1d(module):
                return super()._apply(module, device_mesh)
            order = _qkv_order(module.nf, device_mesh.size()) if self.fused_qkv else None
            return distribute_conv1d(self, module, device_mesh, {"weight": Shard(1), "bias": Shard(0)}, order)

    class Rowwise(RowwiseParallel):
        """Row-parallel ``nn.Linear`` (torch's own) or ``Conv1D`` (weight Shard(0), bias Replicate)."""

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            if not _is_conv1d(module):
                return super()._apply(module, device_mesh)
            self.desired_input_layouts = (Shard(-1),)
            return distribute_conv1d(self, module, device_mesh, {"weight": Shard(0), "bias": Replicate()})

    return Colwise, Rowwise, Replicate


_ACTIVATIONS = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Dropout, nn.Identity)


@dataclass
class _TensorRules:
    """A layer's parallelize_module plan, the attribute changes it needs and its re-laid-out parameters."""

    plan: dict[str, Any]
    heads: list[tuple[nn.Module, dict[str, int]]]  # (module, attribute -> local value)
    fused: dict[str, torch.Tensor]  # parameter name (relative to the layer) -> its column order


def tensor_parallel_rules(layer: nn.Module, degree: int) -> _TensorRules:
    """The 1D tensor-parallel plan of one workbench layer; ValueError for layers it does not know.

    Known: an HF GPT-2 block or BERT layer (wrapped or not), the zoo's GPT-2
    and BERT embeddings (vocab-parallel token embedding) and GPT-2 head
    (vocab-parallel logits, gathered), a plain ``nn.Linear`` and an
    ``nn.Sequential`` of linears with activations between them (column, row,
    column, ... with a gathered last column).
    """
    Colwise, Rowwise, Replicate = _styles()
    prefix, block = "", layer
    if hasattr(layer, "block") and isinstance(layer.block, nn.Module):
        prefix, block = "block.", layer.block
    kind = type(block).__name__
    if kind == "GPT2Block":
        attn, heads = block.attn, block.attn.num_heads
        _check_heads(heads, degree, kind)
        width = attn.c_attn.nf
        return _TensorRules(
            plan={f"{prefix}attn.c_attn": Colwise(fused_qkv=True), f"{prefix}attn.c_proj": Rowwise(),
                  f"{prefix}mlp.c_fc": Colwise(), f"{prefix}mlp.c_proj": Rowwise()},
            heads=[(attn, {"num_heads": heads // degree, "split_size": attn.split_size // degree})],
            fused={f"{prefix}attn.c_attn.weight": _qkv_order(width, degree),
                   f"{prefix}attn.c_attn.bias": _qkv_order(width, degree)})
    if kind == "BertLayer":
        attn = block.attention.self
        heads = attn.num_attention_heads
        _check_heads(heads, degree, kind)
        base = f"{prefix}attention."
        return _TensorRules(
            plan={f"{base}self.query": Colwise(), f"{base}self.key": Colwise(), f"{base}self.value": Colwise(),
                  f"{base}output.dense": Rowwise(), f"{prefix}intermediate.dense": Colwise(),
                  f"{prefix}output.dense": Rowwise()},
            heads=[(attn, {"num_attention_heads": heads // degree, "all_head_size": attn.all_head_size // degree})],
            fused={})
    if kind == "GPT2EmbeddingUnit":  # vocab-parallel token embedding, partial rows summed
        return _TensorRules(plan={"wte": Rowwise(input_layouts=Replicate())}, heads=[], fused={})
    if kind == "BertEmbeddingUnit":
        return _TensorRules(plan={"embeddings.word_embeddings": Rowwise(input_layouts=Replicate())}, heads=[],
                            fused={})
    if kind == "GPT2HeadUnit":  # vocab-parallel logits, gathered for the loss
        return _TensorRules(plan={"lm_head": Colwise(output_layouts=Replicate())}, heads=[], fused={})
    if isinstance(layer, nn.Linear):
        return _TensorRules(plan={"": Colwise(output_layouts=Replicate())}, heads=[], fused={})
    if isinstance(layer, nn.Sequential) and _is_linear_chain(layer):
        linears = [name for name, m in layer.named_children() if isinstance(m, nn.Linear)]
        plan: dict[str, Any] = {}
        for i, name in enumerate(linears):  # column, row, column, ...; a last column is gathered
            if i % 2:
                plan[name] = Rowwise()
            else:
                plan[name] = Colwise() if i + 1 < len(linears) else Colwise(output_layouts=Replicate())
        return _TensorRules(plan=plan, heads=[], fused={})
    raise ValueError(f"1D tensor parallelism applies to GPT-2 blocks, embeddings and head, BERT layers and "
                     f"embeddings, linear layers and chains of linears with activations; this layer is a {kind}")


def tensor_parallel_limit(layer: nn.Module, cap: int = 1024) -> int:
    """The largest power-of-two degree up to ``cap`` that :func:`tensor_parallel_rules` split ``layer`` by; 1 for a
    layer they do not split (a degree that does not divide the heads fails, and so does every multiple of it)."""
    degree = 1
    while degree * 2 <= cap:
        try:
            tensor_parallel_rules(layer, degree * 2)
        except ValueError:
            break
        degree *= 2
    return degree


def tensor_parallel_limits(model: Any, cap: int = 1024) -> tuple[int, ...]:
    """:func:`tensor_parallel_limit` of every layer of a layer sequence, in order: what the planner's per-layer
    search may split each layer by (``Workload.tp_limits``; the rule is :mod:`workbench.core.tensor_support`'s)."""
    return tuple(tensor_parallel_limit(model[i], cap) for i in range(len(model)))


def _is_linear_chain(layer: nn.Sequential) -> bool:
    """Linears with element-wise activations between them, optionally after a leading Flatten."""
    children = list(layer.children())
    first = next((i for i, m in enumerate(children) if isinstance(m, nn.Linear)), None)
    if first is None:
        return False
    return all(isinstance(m, nn.Flatten) for m in children[:first]) and \
        all(isinstance(m, (nn.Linear, *_ACTIVATIONS)) for m in children[first:])


def _check_heads(heads: int, degree: int, kind: str) -> None:
    if heads % degree:
        raise ValueError(f"tensor-parallel degree {degree} does not divide the {heads} attention heads of this "
                         f"{kind}")
