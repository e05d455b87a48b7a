"""Roofline projection of profiles onto devices we do not have, and the device/link presets."""

from dataclasses import replace

import pytest

from workbench.core.costs import DeviceSpec, LayerCost, ModelCosts
from workbench.core import hardware
from workbench.profiling import profile
from workbench.profiling.devices import DEVICES, LINKS, get_link, measure_local_cpu
from workbench.profiling.projection import fit_efficiency, project

TOY_DEVICE = DeviceSpec("toy", {"float32": 1.0, "bfloat16": 4.0}, 10 ** 9, 100.0, efficiency=0.5)


def hand_costs():
    """A compute-heavy layer (1 TFLOP) and a weight-heavy layer (1 GB of parameters, 1 MFLOP)."""
    layers = (
        LayerCost("conv", 1.0, 2.0, flops=10 ** 12, param_bytes=1000, activation_bytes=1000, saved_bytes=1000),
        LayerCost("fc", 1.0, 2.0, flops=10 ** 6, param_bytes=10 ** 9, activation_bytes=1000),
    )
    return ModelCosts("hand", 8, "cpu", layers, input_bytes=1000, meta={"backward_flops": [2 * 10 ** 12, 10 ** 6]})


def test_roofline_terms_exact():
    projected = project(hand_costs(), TOY_DEVICE, overhead_us=0.0)
    conv, fc = projected.layers
    assert conv.forward_ms == pytest.approx(1e12 / 0.5e12 * 1e3)  # compute bound: 2 s
    assert conv.backward_ms == pytest.approx(2e12 / 0.5e12 * 1e3)
    assert fc.forward_ms == pytest.approx((1e9 + 2000) / 100e9 * 1e3)  # weight read bound
    assert fc.backward_ms == pytest.approx((2e9 + 1000 + 1000) / 100e9 * 1e3)  # weights read + grads written
    assert projected.device == "toy" and projected.meta["projection"]["bound"] == ["compute", "memory"]
    assert projected.meta["projected_from"] == "cpu"


def test_projection_scales_the_split_backward_with_the_backward(tmp_path):
    hand = hand_costs()
    split = ModelCosts("hand", 8, "cpu", (replace(hand[0], input_grad_ms=0.75, weight_grad_ms=1.5,
                                                  input_grad_ms_spread=0.1, weight_grad_ms_spread=0.2),
                                          hand[1]), input_bytes=1000, meta=hand.meta)
    conv, fc = project(split, TOY_DEVICE, overhead_us=0.0).layers
    # I and W keep their measured ratios to the backward: I + W = 1.125 x backward, I : W = 1 : 2
    assert conv.input_grad_ms == pytest.approx(conv.backward_ms * 0.75 / 2.0)
    assert conv.weight_grad_ms == pytest.approx(conv.backward_ms * 1.5 / 2.0)
    assert conv.input_grad_ms_spread == conv.weight_grad_ms_spread == 0.0
    assert fc.input_grad_ms is None and fc.split_backward_ms == (fc.backward_ms / 2, fc.backward_ms / 2)  # fallback
    assert ModelCosts.from_json(project(split, TOY_DEVICE).to_json()).layers[0].has_split_backward

    measured = profile("mlp", 4, repeats=1, progress=False, cache_dir=tmp_path)
    for before, after in zip(measured.layers, project(measured, "A100").layers):
        assert after.has_split_backward and after.backward_ms != before.backward_ms
        assert (after.input_grad_ms + after.weight_grad_ms) / after.backward_ms == pytest.approx(
            (before.input_grad_ms + before.weight_grad_ms) / before.backward_ms)
    assert project(measured, "A100").layers[0].input_grad_ms == 0  # the first layer's input gradient stays none


def test_lower_precision_halves_bytes_and_uses_its_peak():
    projected = project(hand_costs(), TOY_DEVICE, dtype="bfloat16", efficiency=1.0, overhead_us=0.0)
    conv, fc = projected.layers
    assert conv.forward_ms == pytest.approx(1e12 / 4e12 * 1e3)
    assert fc.param_bytes == 5 * 10 ** 8 and projected.dtype == "bfloat16"


def test_newer_gpus_are_faster_and_batch_small_fc_is_memory_bound(tmp_path):
    costs = profile("vgg-tiny", 8, repeats=1, progress=False, cache_dir=tmp_path)
    totals = {name: project(costs, name).total("compute_ms") for name in ("V100", "A100", "H100")}
    assert totals["H100"] < totals["A100"] < totals["V100"] < costs.total("compute_ms")
    bounds = dict(zip(costs.names, project(costs, "A100").meta["projection"]["bound"]))
    assert bounds["fc2"] == "memory"  # 4 MB of weights for 8 samples: reading weights dominates


def test_local_cpu_is_measured_and_fits_its_own_profile(tmp_path):
    spec = DEVICES["local-cpu"]
    assert spec is measure_local_cpu() and spec.tflops("float32") > 0 and spec.memory_bandwidth_gbs > 0
    assert set(DEVICES) == set(hardware.DEVICES) | {"local-cpu"}  # the catalogue of core, and this CPU
    assert {"V100", "V100-PCIe", "A100", "H100", "H200"} <= set(DEVICES)
    costs = profile("vgg-tiny", 16, repeats=2, progress=False, cache_dir=tmp_path)
    efficiency = fit_efficiency(costs, spec)
    projected = project(costs, spec, efficiency=efficiency)
    assert 0.3 < projected.total("compute_ms") / costs.total("compute_ms") < 3.0


def test_bad_projection_inputs():
    with pytest.raises(ValueError, match=r"unknown device 'B200'; known devices: V100, V100-PCIe, A100, H100, H200, "
                                         r"cpu-2core, local-cpu \(or pass a DeviceSpec\)"):
        project(hand_costs(), "B200")
    with pytest.raises(ValueError, match="device V100 has no peak for dtype 'bfloat16'"):
        project(hand_costs(), "V100", dtype="bfloat16")
    with pytest.raises(ValueError, match="efficiency must be in"):
        project(hand_costs(), "A100", efficiency=1.5)
    with pytest.raises(ValueError, match="hold neither FLOPs nor bytes"):
        project(ModelCosts.uniform(2), "A100")


def test_link_presets_order():
    assert LINKS["nvlink4"].bandwidth_gbs > LINKS["nvlink3"].bandwidth_gbs > LINKS["pcie4"].bandwidth_gbs
    assert get_link("infiniband-ndr").transfer_ms(45e6) == pytest.approx(1.0 + 0.010)  # 45 GB/s, 10 us
    assert LINKS is hardware.LINKS and get_link(LINKS["pcie3"]) is LINKS["pcie3"]
    with pytest.raises(ValueError, match="unknown link 'nvlink9'"):
        get_link("nvlink9")


def test_winograd_convolutions_are_counted_and_projected_at_the_reduced_rate(tmp_path):
    import torch

    from workbench.profiling.flops import flop_counter

    # what is counted: 3x3 stride-1 ungrouped convolutions, forward and backward; not 1x1, stride 2 or grouped
    eligible, others = torch.nn.Conv2d(4, 8, 3, padding=1), [torch.nn.Conv2d(8, 8, 1),
                                                              torch.nn.Conv2d(8, 8, 3, stride=2, padding=1),
                                                              torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)]
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    forward, backward = {}, {}
    with flop_counter(forward) as total_forward:
        out = eligible(x)
        for conv in others:
            out = conv(out)
    with flop_counter(backward) as total_backward:
        out.sum().backward()
    direct = 2 * (2 * 8 * 8 * 8) * 4 * 9  # 2 FLOPs x output elements x input channels x kernel taps
    assert forward["flops"] == direct and backward["flops"] == 2 * direct  # input and weight gradients
    assert total_forward.get_total_flops() > direct and total_backward.get_total_flops() > 2 * direct

    # the profiler records them per layer; VGG's convolutions are all 3x3 stride 1, its classifier none
    costs = profile("vgg-tiny", 8, repeats=1, progress=False, cache_dir=tmp_path)
    recorded = dict(zip(costs.names, costs.meta["winograd_flops"]))
    layers = {layer.name: layer for layer in costs.layers}
    assert recorded["conv2"][0] == layers["conv2"].flops > 0 and recorded["fc2"] == [0, 0]

    # the projection charges them 2.25x less on V100 in float32, at the direct count in float16 (tensor cores)
    device = DeviceSpec("gpu", {"float32": 1.0, "float16": 4.0}, 10 ** 9, 1e6, efficiency=1.0,
                        winograd={"float32": 2.25})
    conv = LayerCost("conv", 1.0, 2.0, flops=10 ** 12, param_bytes=1000, activation_bytes=1000)
    fc = LayerCost("fc", 1.0, 2.0, flops=10 ** 12, param_bytes=1000, activation_bytes=1000)
    hand = ModelCosts("hand", 8, "cpu", (conv, fc), input_bytes=1000,
                      meta={"backward_flops": [2 * 10 ** 12, 2 * 10 ** 12], "winograd_flops": [[10 ** 12, 2 * 10 ** 12],
                                                                                              [0, 0]]})
    fast, plain = project(hand, device, overhead_us=0.0).layers
    assert fast.forward_ms == pytest.approx(plain.forward_ms / 2.25) and fast.backward_ms == pytest.approx(
        plain.backward_ms / 2.25)
    half = project(hand, device, dtype="float16", overhead_us=0.0).layers
    assert half[0].forward_ms == pytest.approx(half[1].forward_ms)
    assert project(hand, device).meta["projection"]["winograd_reduction"] == 2.25
    # a profile without the record (older cache, hand-made costs) is projected at the direct count
    assert project(hand_costs(), "V100").meta["projection"]["winograd_reduction"] == 2.25
    with pytest.raises(ValueError, match=r"winograd\[float32\] must be in \[1, 4\]"):
        DeviceSpec("gpu", {"float32": 1.0}, 10 ** 9, 1.0, winograd={"float32": 9.0})
    with pytest.raises(ValueError, match="winograd names dtype 'bfloat16', which has no peak_tflops"):
        DeviceSpec("gpu", {"float32": 1.0}, 10 ** 9, 1.0, winograd={"bfloat16": 2.25})
