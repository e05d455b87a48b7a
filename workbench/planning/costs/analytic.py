"""Per-layer costs of a GPT-style decoder from its shape, for models too large to profile here.

A 70-billion-parameter model cannot be built, let alone timed, on the
machine that plans its training; its layers' costs follow from its shape.
:func:`transformer_costs` writes a :class:`~workbench.core.costs.ModelCosts`
with the layers a profile of the zoo's GPT-2 has (``embeddings``,
``block_0`` ... ``block_{L-1}``, ``head``), so every planner path (the
templates, the per-layer search, tensor-parallel costs from the same
:class:`~.tensor_costs.TransformerShape`) reads it as it reads a profile.

Per sample of ``s`` tokens, hidden ``h``, MLP width ``f``, vocabulary ``V``:

* time: a block's forward is ``2 s (4 h^2 + 2 h f) + 4 s^2 h`` FLOPs (the four
  linears, attention scores and their weighting), the head's ``2 s h V``; a
  backward twice its forward, split evenly between the input and the weight
  gradient; each at the device's peak for the dtype times its ``efficiency``
  (the roofline the projection of profiles uses);
* memory per parameter (mixed precision as Megatron-LM trains by default):
  the weights in the dtype, gradients accumulated and all-reduced in fp32
  (4 bytes), the fp32 master copy and Adam's two moments (12 bytes);
* activations: a block keeps ``34 s h`` bytes per sample in 16-bit (``17 s h``
  elements) with fused (flash) attention, whose ``s x s`` scores are not kept
  (Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models", 2022); a stage boundary sends ``s h`` elements; the
  head keeps its fp32 logits, ``4 s V`` bytes.

These are what a well-tuned run reaches at best; a profile on the target
device, where there is one, is the better source.
"""

from __future__ import annotations

from ...core.costs import DeviceSpec, LayerCost, ModelCosts
from ...core.fields import check_str
from .tensor_costs import DTYPE_BYTES, TransformerShape

__all__ = ["transformer_costs", "GRAD_BYTES_PER_PARAM", "OPTIMIZER_BYTES_PER_PARAM"]

GRAD_BYTES_PER_PARAM = 4  # fp32 gradients, accumulated and all-reduced
OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master weights, Adam's first and second moments
SAVED_ELEMENTS_PER_TOKEN_HIDDEN = 17  # 34 s h bytes in 16-bit per block and sample, flash attention


def transformer_costs(shape: TransformerShape, device: DeviceSpec, name: str = "transformer") -> ModelCosts:
    """The layers of ``shape`` (at its ``batch``, in its ``dtype``) on ``device``, from FLOPs and bytes."""
    check_str("name", name, empty=False, expected="a non-empty str")
    peak = device.peak_tflops.get(shape.dtype)
    if peak is None:
        raise ValueError(f"device {device.name!r} has no peak for {shape.dtype} (it has {sorted(device.peak_tflops)})")
    per_ms = peak * 1e9 * device.efficiency  # FLOPs per millisecond
    b, s, h, f, V = shape.batch, shape.seq, shape.hidden, shape.inner, shape.vocab
    e = DTYPE_BYTES[shape.dtype]
    boundary = b * s * h * e

    def layer(label: str, params: int, flops: int, saved: int, sent: int) -> LayerCost:
        forward = flops / per_ms
        return LayerCost(label, forward, 2 * forward, flops=flops, param_bytes=params * e, activation_bytes=sent,
                         saved_bytes=saved, grad_bytes=params * GRAD_BYTES_PER_PARAM,
                         optimizer_bytes=params * OPTIMIZER_BYTES_PER_PARAM, num_params=params,
                         input_grad_ms=forward, weight_grad_ms=forward)

    block_params = 4 * h * h + 2 * h * f + 3 * h + h + f + h + 4 * h  # linears, their biases, two layer norms
    block_flops = b * (2 * s * (4 * h * h + 2 * h * f) + 4 * s * s * h)
    layers = [layer("embeddings", (V + shape.positions) * h, 0, b * s * 8, boundary)]
    layers += [layer(f"block_{i}", block_params, block_flops, SAVED_ELEMENTS_PER_TOKEN_HIDDEN * b * s * h * e,
                     boundary) for i in range(shape.layers)]
    layers.append(layer("head", V * h + 2 * h, 2 * b * s * h * V, b * s * (h * e + 4 * V), 0))
    meta = {"source": "analytic", "shape": {k: getattr(shape, k) for k in
                                            ("hidden", "heads", "layers", "vocab", "positions", "seq", "inner")}}
    return ModelCosts(name, b, device.name, tuple(layers), dtype=shape.dtype, input_bytes=b * s * 8, meta=meta)
