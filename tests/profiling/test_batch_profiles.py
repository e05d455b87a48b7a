"""Profiles at several batch sizes fitted into one ModelCosts, and projections that keep the fit's sizes."""

import pytest

from workbench.profiling import profile, profile_sizes
from workbench.profiling.projection import project


def test_profile_sizes_fits_the_profiles_at_each_size(tmp_path):
    costs = profile_sizes("mlp", [1, 4], repeats=1, progress=False, cache_dir=tmp_path)
    assert costs.batch_size == 4 and costs.profiled_sizes == (1, 4) and costs.batch_fit.source == "measured"
    assert costs.meta["cache"] == "miss" and set(costs.meta["batch_profiles"]) == {"1", "4"}
    assert len(costs.meta["round_totals_ms"]) == 2  # two rounds, each layer the mean of its rounds
    again = profile_sizes("mlp", [1, 4], repeats=1, progress=False, cache_dir=tmp_path)  # one cache entry
    assert again.meta["cache"] == "hit" and again.batch_fit == costs.batch_fit
    assert len(list(tmp_path.glob("mlp-*.json"))) == 1
    for i, layer in enumerate(costs.layers):
        forward = costs.batch_fit.forward_ms[i]
        assert forward[0] <= forward[1] and layer.forward_ms == forward[1]  # non-decreasing, the layer at its size
    assert profile_sizes("mlp", [2], repeats=1, progress=False, cache_dir=tmp_path).batch_fit is None
    with pytest.raises(ValueError, match="sizes must be a list of batch sizes >= 1"):
        profile_sizes("mlp", [0, 2], cache=False)


def test_projection_keeps_the_sizes_as_the_roofline_at_each(tmp_path):
    costs = profile_sizes("mlp", [1, 4], repeats=1, progress=False, cache_dir=tmp_path)
    gpu = project(costs, "V100-PCIe")
    assert gpu.batch_fit.sizes == (1, 4) and gpu.batch_fit.source == "roofline"
    assert [l.forward_ms for l in gpu.layers] == [row[-1] for row in gpu.batch_fit.forward_ms]
    # one sample still reads every weight: the roofline at 1 is more than a quarter of the one at 4
    first = gpu.batch_fit.forward_ms[0]
    assert first[0] > first[1] / 4
    # a single-size profile projected at the sizes asked for (its own size among them)
    single = project(profile("mlp", 8, repeats=1, progress=False, cache_dir=tmp_path), "V100-PCIe", sizes=[1, 64])
    assert single.batch_fit.sizes == (1, 8, 64) and single.batch_size == 8
    assert project(profile("mlp", 8, repeats=1, progress=False, cache_dir=tmp_path), "V100-PCIe").batch_fit is None
