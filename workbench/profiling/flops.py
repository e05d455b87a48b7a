"""FLOP counting with torch's FlopCounterMode, including attention on CPU.

Convention (as torch counts): a multiply-add is 2 FLOPs, so a matrix product
[m, k] @ [k, n] is 2*m*k*n FLOPs. Published CNN figures such as "ResNet-50:
4.1 GFLOPs" count multiply-accumulates (MACs); compare them with
``flops / 2``. Only matrix products, convolutions and attention are counted
(element-wise ops, norms and softmax are not), as in those published figures.

torch registers formulas for the CUDA attention kernels but not for the one
``scaled_dot_product_attention`` dispatches to on CPU; without it a CPU
profile of a transformer would miss the attention matmuls. The same formulas
are registered here for the CPU kernel.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["flop_counter"]

aten = torch.ops.aten


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args,
                                  out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _custom_mapping() -> dict:
    mapping = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_attention_flops
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_attention_backward_flops
    return mapping


def flop_counter() -> FlopCounterMode:
    """A silent FlopCounterMode that also counts CPU attention; read ``get_total_flops()`` after use."""
    return FlopCounterMode(display=False, custom_mapping=_custom_mapping())
