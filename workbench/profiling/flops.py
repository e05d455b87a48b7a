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

Fast convolutions: GPU libraries run a 3x3, stride-1, dilation-1, ungrouped
2D convolution by Winograd's minimal filtering (cuDNN's WINOGRAD algorithms,
forward, backward-data and backward-filter), which needs fewer multiplies
than the direct count torch reports: F(2x2, 3x3) uses 16 where the direct
convolution uses 36, 2.25x fewer. ``flop_counter(winograd=tally)`` also adds
the FLOPs of such convolutions to ``tally["flops"]``, so a projection can
charge them at the device's reduced rate (``DeviceSpec.winograd``).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["flop_counter"]

aten = torch.ops.aten


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args,
                                  out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _winograd_eligible(w_shape, stride, dilation, transposed, groups) -> bool:
    """A 2D 3x3 convolution with stride 1, dilation 1 and one group: what Winograd F(2x2, 3x3) runs."""
    return (not transposed and groups == 1 and len(w_shape) == 4 and tuple(w_shape[2:]) == (3, 3)
            and all(s == 1 for s in stride) and all(d == 1 for d in dilation))


def _winograd_mapping(tally: dict[str, int]) -> dict:
    """Convolution formulas that count as torch does and add eligible convolutions' FLOPs to ``tally``."""

    def counting(op, offset: int):
        # aten.convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups);
        # aten.convolution_backward has the same arguments after a leading grad_output (offset 1)
        formula = flop_registry[op]

        def count(*args, out_shape=None):
            flops = formula(*args, out_val=out_shape)
            w_shape, stride, dilation, transposed, groups = (args[offset + i] for i in (1, 3, 5, 6, 8))
            if _winograd_eligible(w_shape, stride, dilation, transposed, groups):
                tally["flops"] = tally.get("flops", 0) + flops
            return flops

        return count

    return {aten.convolution: counting(aten.convolution, 0),
            aten.convolution_backward: counting(aten.convolution_backward, 1)}


def _custom_mapping(winograd: dict[str, int] | None = None) -> dict:
    mapping = {} if winograd is None else _winograd_mapping(winograd)
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_attention_flops
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_attention_backward_flops
    return mapping


def flop_counter(winograd: dict[str, int] | None = None) -> FlopCounterMode:
    """A silent FlopCounterMode that also counts CPU attention; read ``get_total_flops()`` after use.

    ``winograd``: a dict whose ``"flops"`` entry accumulates the FLOPs of the
    convolutions a GPU library runs by Winograd (see the module docstring).
    """
    return FlopCounterMode(display=False, custom_mapping=_custom_mapping(winograd))
