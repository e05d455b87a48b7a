"""Costs of a decoder from its shape: the counts a profile would hold, at the device's roofline."""

from __future__ import annotations

import pytest

from workbench.core.hardware import DEVICES
from workbench.planning.costs.analytic import (GRAD_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM, transformer_costs)
from workbench.planning.costs.tensor_costs import TransformerShape

SHAPE = TransformerShape(hidden=1024, heads=16, layers=6, vocab=32000, positions=1024, batch=2, seq=512,
                         dtype="bfloat16")


def test_the_layers_count_what_the_shape_holds():
    costs = transformer_costs(SHAPE, DEVICES["H100"], "decoder")
    assert [l.name for l in costs.layers] == ["embeddings"] + [f"block_{i}" for i in range(6)] + ["head"]
    assert sum(l.num_params for l in costs.layers) == pytest.approx(SHAPE.num_params() + SHAPE.vocab * 1024, rel=1e-3)
    block = costs.layers[1]
    h, s, b = 1024, 512, 2
    assert block.flops == b * (2 * s * 12 * h * h + 4 * s * s * h)
    assert block.forward_ms == pytest.approx(block.flops / (DEVICES["H100"].peak_tflops["bfloat16"] * 1e9 * 0.5))
    assert block.backward_ms == pytest.approx(2 * block.forward_ms)
    assert block.split_backward_ms == pytest.approx((block.forward_ms, block.forward_ms))
    assert block.param_bytes == 2 * block.num_params and block.grad_bytes == GRAD_BYTES_PER_PARAM * block.num_params
    assert block.optimizer_bytes == OPTIMIZER_BYTES_PER_PARAM * block.num_params
    assert block.saved_bytes == 34 * s * h * b and block.activation_bytes == b * s * h * 2
    assert costs.layers[-1].flops == 2 * b * s * h * 32000


def test_the_planner_reads_it_as_a_profile():
    from workbench.planning import Budget, SearchOptions, Workload, plan

    costs = transformer_costs(SHAPE, DEVICES["H100"], "decoder")
    result = plan(Workload(costs, 64, shape=SHAPE), "2x8xH100-IB", Budget(), SearchOptions(top=3))
    assert result.best.estimate.iteration_ms > sum(l.compute_ms for l in costs.layers) * 64 / 2 / 16 * 0.99
    with pytest.raises(ValueError, match="no peak for float64|must be one of"):
        transformer_costs(TransformerShape(64, 2, 1, 10, 8, 1, 8, dtype="float64"), DEVICES["H100"])
