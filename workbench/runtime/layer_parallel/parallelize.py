"""One layer of a stage: apply its plan (tensor parallelism, recomputation, data parallelism), read back what ran.

Data parallelism is FSDP2 ``fully_shard`` (``reshard_after_forward`` True
for ``fsdp``, False for ``zero2``) or FSDP2's ``replicate`` (DDP semantics)
on the layer's ``dp`` dim, gradients summed. What was applied is read back
from the wrapped modules (:func:`realized_options`) and compared with the
plan; a mismatch is an error, never a fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...core.plan import LayerPlan
from .meshes import Layout
from .recompute import Recomputed
from .tensor_rules import tensor_parallel_rules

__all__ = ["ParallelLayer", "parallelize_layer", "realized_options", "check_realized", "dense_parameters"]


@dataclass
class ParallelLayer:
    """One layer of a stage as applied: the module to call, the original layer and what was applied."""

    index: int
    name: str
    module: nn.Module  # what the stage calls (data-parallel wrapper around the recompute wrapper, if any)
    layer: nn.Module  # the original layer object, for dense parameter names
    plan: LayerPlan
    layout: Layout
    fused: dict[str, torch.Tensor]  # parameter -> column order it was re-laid out in


def parallelize_layer(index: int, name: str, layer: nn.Module, plan: LayerPlan, layout: Layout, mesh) -> ParallelLayer:
    """Apply ``plan`` to ``layer`` in place: tensor parallelism, then recomputation, then data parallelism."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    fused: dict[str, torch.Tensor] = {}
    if plan.tp == "2d":
        raise ValueError(f"layer {index} {name!r}: option 'tp2d' is not run per layer (only the uniform SUMMA "
                         f"grid runs 2D tensor parallelism)")
    if plan.tp == "1d":
        try:
            rules = tensor_parallel_rules(layer, plan.tp_degree)
        except ValueError as exc:
            raise ValueError(f"layer {index} {name!r}: option 'tp1d{plan.tp_degree}': {exc}") from None
        parallelize_module(layer, mesh["tp"], rules.plan)
        for module, values in rules.heads:
            for attribute, value in values.items():
                setattr(module, attribute, value)
        fused = rules.fused
    module = Recomputed(layer) if plan.recompute else layer
    if any(p.requires_grad for p in module.parameters()):
        dp_mesh = mesh["dp"]
        if plan.dp == "replicate":
            from torch.distributed._composable.replicate_with_fsdp import replicate

            replicate(module, mesh=dp_mesh)
        else:
            fully_shard(module, mesh=dp_mesh, reshard_after_forward=plan.dp == "fsdp")
        # every data group back-propagates its part of the one stage loss: sum the parts (plain SUM
        # collectives, which every backend has, rather than a pre-multiplied sum)
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return ParallelLayer(index, name, module, layer, plan, layout, fused)


def realized_options(layer: ParallelLayer) -> dict[str, Any]:
    """What was applied to ``layer``, read back from its modules (not from the plan)."""
    from torch.distributed._composable.replicate_with_fsdp import ReplicateModule
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    module = layer.module
    if isinstance(module, ReplicateModule):
        dp = "replicate"
    elif isinstance(module, FSDPModule):
        group = module._get_fsdp_state()._fsdp_param_group
        dp = "fsdp" if group is not None and group.post_forward_mesh_info is not None else "zero2"
    else:
        dp = "none"
    degree = 1
    for param in layer.layer.parameters():
        if isinstance(param, DTensor):
            names = param.device_mesh.mesh_dim_names or ()
            for dim, placement in enumerate(param.placements):
                if names[dim:dim + 1] == ("tp",) and isinstance(placement, Shard):
                    degree = max(degree, param.device_mesh.size(dim))
    return {"index": layer.index, "name": layer.name, "dp": dp, "tp_degree": degree,
            "recompute": isinstance(module, Recomputed), "consecutive": layer.layout.consecutive,
            "dp_size": layer.layout.dp, "param_bytes": sum(_local(p).numel() * p.element_size()
                                                            for p in layer.layer.parameters())}


def _local(param: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this rank holds (its shard, for a DTensor)."""
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


def check_realized(layer: ParallelLayer, realized: dict[str, Any]) -> None:
    """Raise unless what ran is what the plan asked for (a layer without parameters has no data parallelism)."""
    plan = layer.plan
    has_params = any(p.requires_grad for p in layer.layer.parameters())
    want = {"dp": plan.dp if has_params else "none", "tp_degree": plan.tp_degree, "recompute": plan.recompute}
    got = {k: realized[k] for k in want}
    if got != want:
        wrong = [k for k in want if got[k] != want[k]]
        raise RuntimeError(f"layer {layer.index} {layer.name!r} ran {', '.join(f'{k}={got[k]!r}' for k in wrong)} "
                           f"but the plan asks for {', '.join(f'{k}={want[k]!r}' for k in wrong)}")


def dense_parameters(layer: ParallelLayer) -> dict[str, torch.Tensor]:
    """Collective over the layer's mesh: its parameters as dense tensors under the layer's own names."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    for name, param in layer.layer.named_parameters():
        value = param.full_tensor() if isinstance(param, DTensor) else param
        value = value.detach().float().cpu()
        if name in layer.fused:
            order = layer.fused[name]
            value = value.index_select(-1, torch.argsort(order))
        out[name] = value.clone()
    return out
