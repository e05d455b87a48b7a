"""The tour's memory arithmetic: the meta device counts what a real pass saves, and the sums are right."""

import pytest

from workbench.lessons.memory import GIB, PRECISIONS, memory_story, memory_table, training_memory
from workbench.lessons.pictures import PANELS, strategy_pictures


@pytest.mark.parametrize(("model", "batch"), [("gpt2-tiny", 4), ("resnet18", 2), ("mlp", 16)])
def test_the_meta_count_equals_the_count_on_real_tensors(model, batch):
    meta, real = training_memory(model, batch), training_memory(model, batch, device="cpu")
    assert meta.activations == real.activations > 0
    assert meta.params == real.params


def test_state_is_bytes_per_parameter_and_activations_grow_with_the_batch():
    one, four = training_memory("gpt2-tiny", 1), training_memory("gpt2-tiny", 4)
    assert (one.weights, one.gradients, one.optimizer) == tuple(one.params * b for b in PRECISIONS["fp32"])
    mixed = training_memory("gpt2-tiny", 1, precision="bf16-mixed")
    assert mixed.state == one.state  # 2 + 2 + 12 = 4 + 4 + 8 bytes per parameter
    assert 3.5 * one.activations < four.activations <= 4 * one.activations + 1024
    assert one.total == one.state + one.activations
    with pytest.raises(ValueError, match="precision must be one of"):
        training_memory("gpt2-tiny", 1, precision="fp8")


def test_table_and_story_read_their_numbers_from_the_rows():
    small = training_memory("gpt2-tiny", 2)
    large = training_memory("gpt2-tiny", 2, label="wide", n_embd=256, n_head=4)
    table = memory_table([small, large])
    assert "| wide |" in table and f"{large.params / 1e6:,.1f} M" in table
    story = memory_story(small, large, device_gib=large.state / GIB / 2)  # a device half the state's size
    assert "more than one" in story and f"{large.params / 1e9:.1f} billion" in story
    assert "which one" in memory_story(small, large, device_gib=80)


def test_the_pictures_draw_every_block_of_every_panel():
    fig = strategy_pictures()
    assert len(fig.layout.shapes) == sum(len(blocks) for blocks, _, _ in PANELS.values())
    assert [a.text for a in fig.layout.annotations[:3]] == list(PANELS)
