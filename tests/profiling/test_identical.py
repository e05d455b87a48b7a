"""Identical layers profiled once: which layers share a measurement, and that it matches timing every layer."""

import statistics

import pytest
import torch
from torch import nn

from workbench.models import LayerSequence, build_model, sample_batch
from workbench.profiling import profile
from workbench.profiling.identical import SHARED_TIMED_LAYERS, TimingGroups, layer_signature
from workbench.models.transformers_models import ToyBlock

TIMES = ("forward_ms", "backward_ms", "input_grad_ms", "weight_grad_ms")
COUNTED = ("flops", "param_bytes", "activation_bytes", "saved_bytes", "grad_bytes", "optimizer_bytes", "peak_bytes",
           "num_params")


def signature(layer, x, needs_grad=True, is_last=False):
    return layer_signature(layer, x, needs_grad=needs_grad, is_last=is_last)


def test_the_signature_tells_apart_what_changes_a_layers_timing():
    x = torch.randn(2, 8, 16)
    block = ToyBlock(16, 2)
    base = signature(block, x)
    assert signature(ToyBlock(16, 2), x) == base  # another block, other weights: the same computation
    assert signature(ToyBlock(16, 4), x) != base  # same parameter shapes, more heads (a plain attribute)
    assert signature(block, torch.randn(2, 9, 16)) != base  # another sequence length
    assert signature(block, x.double()) != base and signature(block, x.transpose(0, 1).contiguous()
                                                               .transpose(0, 1)) != base  # dtype, strides
    assert signature(block, x, needs_grad=False) != base and signature(block, x, is_last=True) != base
    assert signature(ToyBlock(16, 2).eval(), x) != base  # training mode
    frozen = ToyBlock(16, 2)
    frozen.qkv.weight.requires_grad_(False)
    assert signature(frozen, x) != base
    hooked = ToyBlock(16, 2)
    hooked.register_forward_hook(lambda *args: None)
    assert signature(hooked, x) != base
    assert signature(nn.Dropout(0.1), x) != signature(nn.Dropout(0.2), x)  # extra_repr
    assert signature(nn.Linear(16, 16), x) != signature(nn.Linear(16, 16, bias=False), x)


def test_transformer_blocks_differing_only_in_their_position_share_a_signature():
    seq = build_model("gpt2-tiny", n_layer=4)
    hidden = torch.randn(2, 64, 64)
    assert [seq[i].block.attn.layer_idx for i in (1, 4)] == [0, 3]  # Hugging Face keeps it for the KV cache
    assert len({signature(seq[i], hidden) for i in range(1, 5)}) == 1


def test_timing_groups_time_the_first_layers_of_a_key_and_pool_their_samples():
    groups = TimingGroups(share=True)
    full = []
    wanted = []
    for i in range(7):
        full.append(groups.full("block"))
        wanted.append(groups.join(i, "block" if 0 < i < 6 else f"other{i}", (100, 200)))
    assert wanted == [True, True, True, True, False, False, True] and SHARED_TIMED_LAYERS == 3
    assert full == [False] * 4 + [True] * 3
    assert groups.join(7, "block", (100, 300))  # alike but counted otherwise: its own measurement
    for i, value in ((0, 9.0), (1, 1.0), (2, 2.0), (3, 3.0), (6, 9.0)):
        groups.add(i, {"forward_ms": [value, value + 0.5]})
    assert groups.samples(5)["forward_ms"] == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5] == groups.samples(1)["forward_ms"]
    assert groups.shared() == [{"layers": [1, 2, 3, 4, 5], "timed": [1, 2, 3]}]
    every = TimingGroups(share=False)
    assert all(not every.full("block") and every.join(i, "block") for i in range(3)) and every.shared() == []


def _profiles(seq, batch):
    full = [profile(seq, batch, repeats=3, progress=False, cache=False, share_identical=False) for _ in range(2)]
    return full, profile(seq, batch, repeats=3, progress=False, cache=False)


def _within_noise(full, shared, blocks) -> list[str]:
    """The shared time of the blocks against the two full profiles: off their median block time by no more than
    the profiler's own noise, the most the two full profiles differ on one block; the misses, named."""
    misses = []
    for name in TIMES:
        a, b = ([getattr(costs[i], name) for i in blocks] for costs in full)
        noise = max(abs(x - y) for x, y in zip(a, b))
        if abs(getattr(shared[blocks[0]], name) - statistics.median(a + b)) > noise:
            misses.append(f"{name}: shared {getattr(shared[blocks[0]], name):.3f} vs {a} / {b}")
    return misses


@pytest.mark.exclusive  # compares timings: another worker's load between the profiles moves them apart
def test_shared_times_match_a_profile_of_every_layer_within_its_own_noise():
    seq = build_model("gpt2-tiny", n_layer=6)
    batch = sample_batch(seq, 2)
    profile(seq, batch, repeats=1, progress=False, cache=False, share_identical=False)  # warm up torch
    for attempt in range(3):  # timing on a shared machine: best of three
        full, shared = _profiles(seq, batch)
        blocks = list(range(1, 7))
        assert shared.meta["identical_layers"] == [{"layers": blocks, "timed": [1, 2, 3]}]
        assert shared.meta["share_identical"] and not full[0].meta["share_identical"]
        assert full[0].meta["identical_layers"] == []
        misses = _within_noise(full, shared, blocks)
        if not misses:
            break
    assert not misses, misses
    for name in TIMES:  # one measurement: every block carries it
        assert len({getattr(shared[i], name) for i in blocks}) == 1
    assert shared.meta["samples_ms"]["forward_ms"][6] == shared.meta["samples_ms"]["forward_ms"][1]
    assert len(shared.meta["samples_ms"]["forward_ms"][1]) == 3 * 3 and len(full[0].meta["samples_ms"]
                                                                              ["forward_ms"][1]) == 3
    # blocks 4 to 6 ran a forward only and took the counts of the three timed blocks before them; the counts
    # equal a profile that counted every layer
    assert shared.meta["counts_borrowed"] == [4, 5, 6] and full[0].meta["counts_borrowed"] == []
    for mine, theirs in zip(shared.layers, full[0].layers):
        assert [getattr(mine, f) for f in COUNTED] == [getattr(theirs, f) for f in COUNTED], mine.name
    assert shared.meta["backward_flops"] == full[0].meta["backward_flops"]


def test_resnet_blocks_that_differ_are_not_merged(tmp_path):
    seq = build_model("resnet18")
    batch = (torch.randn(2, 3, 32, 32), torch.zeros(2, dtype=torch.long))
    costs = profile(seq, batch, repeats=1, warmup=0, progress=False, cache_dir=tmp_path)
    names = costs.names
    merged = [[names[i] for i in group["layers"]] for group in costs.meta["identical_layers"]]
    # only the two blocks of the first stage are the same computation: every later stage opens with a block
    # that halves the resolution and widens the channels (a strided conv and a projection), then one that keeps them
    assert merged == [["layer1_0", "layer1_1"]]
    assert costs.meta["identical_layers"][0]["timed"] == [1, 2]


def test_layers_alike_but_for_their_input_or_a_setting_are_not_merged(tmp_path):
    chain = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Dropout(0.1), nn.Dropout(0.2),
                          nn.Linear(16, 16), nn.Linear(16, 4))
    seq = LayerSequence.from_sequential(chain, name="alike")
    batch = (torch.randn(4, 16), torch.zeros(4, dtype=torch.long))
    costs = profile(seq, batch, repeats=1, progress=False, cache_dir=tmp_path)
    # layer0 reads data (no input gradient), layer1 and layer4 are the same Linear on the same input shape
    assert costs.meta["identical_layers"] == [{"layers": [1, 4], "timed": [1, 4]}]
    every = profile(seq, batch, repeats=1, progress=False, cache_dir=tmp_path, share_identical=False)
    assert every.meta["cache"] == "miss" and every.meta["identical_layers"] == []
    assert profile(seq, batch, repeats=1, progress=False, cache_dir=tmp_path).meta["cache"] == "hit"
    with pytest.raises(ValueError, match="share_identical must be true or false"):
        profile(seq, batch, share_identical="yes", cache=False)
