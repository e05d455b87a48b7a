"""A layer's time as a function of its batch (``workbench.core.batch_fit``) and its place in ``ModelCosts``."""

import json
from dataclasses import replace

import pytest

from workbench.core.batch_fit import BatchFit, fit_profiles, fit_sizes, interpolate
from workbench.core.costs import ModelCosts
from workbench.scheduling.stagecosts import layer_times_ms


def _profile(batch: int, forward: list[float], backward: list[float]) -> ModelCosts:
    """A synthetic profile of a two-layer model at ``batch`` samples (activations proportional to it)."""
    base = ModelCosts.uniform(2, batch_size=batch, param_bytes=1000, activation_bytes=10 * batch, model="toy")
    return replace(base, layers=tuple(replace(l, forward_ms=f, backward_ms=b, flops=100 * batch)
                                      for l, f, b in zip(base.layers, forward, backward)))


def test_fit_from_two_sizes_gives_the_line_through_them_at_a_third():
    # layer 0: weight-bound, 5 ms fixed + 0.1 ms a sample; layer 1: proportional, 0.5 ms a sample
    small, large = _profile(2, [5.2, 1.0], [10.4, 2.0]), _profile(32, [8.2, 16.0], [16.4, 32.0])
    costs = fit_profiles([small, large])
    assert costs.batch_size == 32 and costs.profiled_sizes == (2, 32)
    assert costs.batch_fit.layer_ms(0, 8) == pytest.approx((5.8, 11.6))  # a + b * 8, not 8 / 32 of the large one
    assert costs.batch_fit.layer_ms(1, 8) == pytest.approx((4.0, 8.0))
    forward, backward = layer_times_ms(costs, 8)  # what the simulator and the partitioners read
    assert forward == pytest.approx([5.8, 4.0]) and backward == pytest.approx([11.6, 8.0])
    at8 = costs.at_batch(8)  # the profile as if taken at 8: fitted times, bytes and FLOPs scaled, no fit left
    assert at8.batch_size == 8 and at8.batch_fit is None
    assert [l.forward_ms for l in at8.layers] == pytest.approx([5.8, 4.0])
    assert at8.layers[0].activation_bytes == 80 and at8.layers[0].flops == 800 and at8.layers[0].param_bytes == 1000


def test_piecewise_between_sizes_and_bounded_beyond_them():
    sizes, values = (1, 4, 16), (4.0, 4.0, 10.0)  # flat while weight-bound, then growing
    assert interpolate(sizes, values, 2) == pytest.approx(4.0)
    assert interpolate(sizes, values, 10) == pytest.approx(7.0)
    assert interpolate(sizes, values, 32) == pytest.approx(18.0)  # the last segment's line continues
    assert interpolate((4, 16), (4.0, 4.0), 64) == 4.0  # never below the largest size's time
    assert interpolate((4, 16), (8.0, 32.0), 1) == pytest.approx(2.0)  # never below proportional to the smallest
    assert interpolate((8,), (4.0,), 2) == pytest.approx(1.0)  # one size: linear scaling, as before


def test_a_dip_between_sizes_is_averaged_not_carried_up():
    costs = fit_profiles([_profile(1, [4.0, 1.0], [8.0, 2.0]), _profile(4, [2.0, 2.0], [4.0, 4.0]),
                          _profile(16, [9.0, 8.0], [18.0, 16.0])])
    assert costs.batch_fit.forward_ms[0] == pytest.approx((3.0, 3.0, 9.0))  # 4 then 2: noise, pooled to 3
    assert costs.batch_fit.forward_ms[1] == (1.0, 2.0, 8.0)


def test_fit_sizes_span_the_range_four_times_apart_up_to_the_cap():
    assert fit_sizes(1, 64) == [1, 4, 16, 64]
    assert fit_sizes(2, 32) == [2, 8, 32]
    assert fit_sizes(1, 256) == [1, 4, 16, 64]
    assert fit_sizes(8, 8) == [8]


def test_json_round_trip_keeps_the_fit(tmp_path):
    costs = fit_profiles([_profile(2, [5.2, 1.0], [10.4, 2.0]), _profile(32, [8.2, 16.0], [16.4, 32.0])], primary=2)
    assert costs.batch_size == 2
    again = ModelCosts.load(costs.save(tmp_path / "fit.json"))
    assert again == costs and again.batch_fit.sizes == (2, 32)
    written = json.loads((tmp_path / "fit.json").read_text())
    assert written["version"] == 3
    assert written["batch_fit"] == {"kind": "piecewise-linear", "source": "measured", "sizes": [2, 32],
                                    "forward_ms": [[5.2, 8.2], [1.0, 16.0]], "backward_ms": [[10.4, 16.4], [2.0, 32.0]]}


def test_an_old_file_loads_without_a_fit_and_scales_linearly():
    old = {"version": 2, "model": "old", "batch_size": 8, "device": "cpu",
           "layers": [{"name": "a", "forward_ms": 4.0, "backward_ms": 8.0}]}
    costs = ModelCosts.from_dict(old)
    assert costs.batch_fit is None and costs.profiled_sizes == (8,)
    assert layer_times_ms(costs, 2) == ([1.0], [2.0])
    assert costs.at_batch(2).layers[0].forward_ms == 1.0


@pytest.mark.parametrize("change, fragment", [
    (dict(sizes=[4, 2]), "distinct batch sizes in ascending order"),
    (dict(forward_ms=[[1.0]]), "one time per size"),
    (dict(kind="cubic"), "valid options are piecewise-linear"),
    (dict(backward_ms=[[1.0, -1.0]]), "finite numbers >= 0"),
])
def test_bad_fits_are_refused(change, fragment):
    fit = {"sizes": [2, 4], "forward_ms": [[1.0, 2.0]], "backward_ms": [[2.0, 4.0]], **change}
    with pytest.raises(ValueError, match=fragment):
        BatchFit.from_dict(fit)


def test_a_fit_that_disagrees_with_the_layers_is_refused():
    costs = fit_profiles([_profile(2, [5.2, 1.0], [10.4, 2.0]), _profile(32, [8.2, 16.0], [16.4, 32.0])])
    with pytest.raises(ValueError, match="change both together"):
        replace(costs, layers=tuple(replace(l, forward_ms=l.forward_ms * 2) for l in costs.layers))
    with pytest.raises(ValueError, match="among its sizes"):
        replace(costs, batch_size=8)
