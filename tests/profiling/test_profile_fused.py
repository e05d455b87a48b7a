"""A profile of the linear layers fused (``fused_weight_grads=True``): what a fused stage runs, the model untouched."""

from __future__ import annotations

import pytest
import torch

from workbench.core.config import RunConfig
from workbench.models import build_model, sample_batch
from workbench.profiling import profile


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))


def test_a_fused_profile_times_a_copy_and_counts_what_the_plain_one_counts(tmp_path):
    model = build_model("vgg-tiny")
    batch = sample_batch(model, 4)
    plain = profile(model, batch, repeats=1, progress=False, cache_dir=tmp_path)
    fused = profile(model, batch, repeats=1, progress=False, cache_dir=tmp_path, fused_weight_grads=True)
    assert fused.meta["cache"] == "miss" and fused.meta["fused_weight_grads"] is True  # its own cache entry
    assert "fused_weight_grads" not in plain.meta
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all("forward" not in vars(m) for m in linears)  # the caller's layers keep their forward
    assert all(p.grad is None for p in model.parameters())
    assert fused.meta["backward_flops"] == plain.meta["backward_flops"]  # the in-place product is counted
    for layer in fused.layers:
        if layer.name.startswith("fc"):
            assert layer.weight_grad_ms > 0 and layer.input_grad_ms > 0 and layer.backward_ms > 0, layer.name
    again = profile(model, batch, repeats=1, progress=False, cache_dir=tmp_path, fused_weight_grads=True)
    assert again.meta["cache"] == "hit" and again.meta["fused_weight_grads"] is True


def test_a_fused_run_profiles_its_stages_fused(tmp_path):
    """AMPA's cut and zb-auto's schedule come from a profile of the stages as the run runs them."""
    from workbench.runtime.entry import _profile_copy

    config = RunConfig.from_dict({"model": "mlp", "plan": "pp2-zbauto-m2", "training": {"fused_weight_grads": True},
                                  "run": {"dir": str(tmp_path)}})
    model = build_model("mlp")
    x, _ = sample_batch(model, 4)
    assert _profile_copy(config, model, x, "cpu").meta["fused_weight_grads"] is True


def test_the_setting_must_be_a_boolean():
    with pytest.raises(ValueError, match="fused_weight_grads"):
        profile(build_model("mlp"), 4, progress=False, cache=False, fused_weight_grads="yes")
