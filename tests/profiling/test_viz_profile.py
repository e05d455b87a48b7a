"""Profile figures draw the numbers they are given."""

import plotly.graph_objects as go
import pytest

from workbench.core.costs import LayerCost, ModelCosts
from workbench.viz.profile import layer_cost_bars, layer_cost_table

MB = 1024 ** 2


def costs():
    layers = (LayerCost("stem", 1.0, 2.0, flops=4 * 10 ** 9, param_bytes=2 * MB, activation_bytes=MB, saved_bytes=3 * MB,
                        forward_ms_spread=0.1, num_params=5),
              LayerCost("head", 0.5, 1.5, flops=10 ** 9, param_bytes=MB, optimizer_bytes=2 * MB))
    return ModelCosts("demo", 4, "cpu", layers, meta={"backward_flops": [8 * 10 ** 9, 2 * 10 ** 9]})


def test_time_bars_stack_forward_and_backward_with_spread():
    figure = layer_cost_bars(costs(), "time")
    assert isinstance(figure, go.Figure)
    forward, backward = figure.data
    assert list(forward.x) == ["stem", "head"] and list(forward.y) == [1.0, 0.5] and list(backward.y) == [2.0, 1.5]
    assert list(forward.error_y.array) == [0.1, 0.0]


def test_time_bars_and_table_show_a_measured_split_backward():
    from dataclasses import replace

    from workbench.viz.style import op_color

    plain = costs()
    split = replace(plain, layers=(replace(plain[0], input_grad_ms=0.75, weight_grad_ms=1.5, weight_grad_ms_spread=0.2),
                                   plain[1]))
    bars = {bar.name: bar for bar in layer_cost_bars(split, "time").data}
    assert list(bars) == ["forward", "backward", "input grad (I)", "weight grad (W)"]
    assert list(bars["input grad (I)"].y) == [0.75, None] and list(bars["weight grad (W)"].y) == [1.5, None]
    assert list(bars["weight grad (W)"].error_y.array) == [0.2, 0.0]
    assert bars["input grad (I)"].marker.color == op_color("I") and bars["weight grad (W)"].marker.color == op_color("W")
    table = layer_cost_table(split).data[0]
    assert list(table.header.values)[:5] == ["layer", "fwd ms", "bwd ms", "I ms", "W ms"]
    assert list(table.cells.values[3]) == ["0.750", "-"] and list(table.cells.values[4]) == ["1.500", "-"]
    assert len(layer_cost_bars(plain, "time").data) == 2  # a profile without the split draws as before


def test_flops_and_memory_bars():
    flops = layer_cost_bars(costs(), "flops")
    assert [list(bar.y) for bar in flops.data] == [[4.0, 1.0], [8.0, 2.0]]
    memory = {bar.name: list(bar.y) for bar in layer_cost_bars(costs(), "memory").data}
    assert memory["parameters"] == [2.0, 1.0] and memory["gradients"] == [2.0, 1.0]
    assert memory["optimizer state"] == [0.0, 2.0] and memory["saved for backward"] == [3.0, 0.0]


def test_table_and_bad_metric():
    table = layer_cost_table(costs()).data[0]
    assert list(table.header.values)[:3] == ["layer", "fwd ms", "bwd ms"]
    assert list(table.cells.values[0]) == ["stem", "head"] and list(table.cells.values[3]) == ["4.000", "1.000"]
    with pytest.raises(ValueError, match=r"metric must be one of \('time', 'flops', 'memory'\), got 'energy'"):
        layer_cost_bars(costs(), "energy")
