"""The profiler on a GPU: CUDA-event timings and the allocator's peak memory."""

import math

import pytest
import torch

from workbench.models import build_model, sample_batch
from workbench.profiling import measure_step_ms, profile

pytestmark = [pytest.mark.gpu, pytest.mark.cuda_only,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_zoo_model_profile_on_cuda_uses_events_and_the_allocator(tmp_path):
    seq = build_model("vgg-tiny")
    batch = sample_batch(seq, 8)
    costs = profile(seq, batch, device="cuda", warmup=2, repeats=3, progress=False, cache_dir=tmp_path)
    assert costs.meta["timer"] == "cuda-events"
    assert costs.meta["peak_bytes_method"] == "cuda-allocator"
    assert costs.device == torch.cuda.get_device_name(0)
    assert costs.names == seq.layer_names
    for layer in costs.layers:
        assert layer.forward_ms > 0 and layer.backward_ms > 0 and math.isfinite(layer.forward_ms + layer.backward_ms)
    samples = costs.meta["samples_ms"]
    assert all(len(s) == 3 and min(s) > 0 for s in samples["forward_ms"] + samples["backward_ms"])
    # the allocator's high-water mark: a computing layer's covers its parameters, its input and the output it allocates
    inputs = [costs.input_bytes] + [layer.activation_bytes for layer in costs.layers[:-1]]
    for layer, input_bytes in zip(costs.layers, inputs):
        assert layer.peak_bytes >= layer.param_bytes + input_bytes, layer.name
        if layer.flops > 0:
            assert layer.peak_bytes >= layer.param_bytes + input_bytes + layer.activation_bytes, layer.name
    assert max(layer.peak_bytes for layer in costs.layers) < torch.cuda.get_device_properties(0).total_memory
    assert sum(costs.column("flops")) > 0

    again = profile(seq, batch, device="cuda", warmup=2, repeats=3, progress=False, cache_dir=tmp_path)
    assert again.meta["cache"] == "hit" and again.meta["timer"] == "cuda-events"


def test_whole_step_reference_on_cuda_is_event_timed_and_positive():
    times = measure_step_ms("mlp", 16, device="cuda", warmup=1, repeats=3)
    assert len(times) == 3 and all(t > 0 and math.isfinite(t) for t in times)
