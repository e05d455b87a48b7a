"""Synthetic batches, the digits task and the byte-level LM corpus: shapes, determinism, resumption, learning."""

import itertools

import numpy as np
import pytest
import torch

from workbench.models import build_model, bytes_lm_batches, digits_batches, sample_batch
from workbench.models.data import digits_dataset


def take(iterator, n):
    return list(itertools.islice(iterator, n))


@pytest.mark.parametrize("name,input_shape,input_dtype,target_shape", [
    ("resnet18", (3, 3, 224, 224), torch.float32, (3,)),
    ("mlp", (3, 64), torch.float32, (3,)),
    ("gpt2-tiny", (3, 64), torch.int64, (3, 64)),
    ("bert-tiny", (3, 64), torch.int64, (3, 64)),
])
def test_sample_batch_shapes_and_dtypes(name, input_shape, input_dtype, target_shape):
    inputs, targets = sample_batch(name, 3)
    assert tuple(inputs.shape) == input_shape and inputs.dtype == input_dtype
    assert tuple(targets.shape) == target_shape and targets.dtype == torch.int64
    again, _ = sample_batch(name, 3)
    assert torch.equal(inputs, again)


def test_causal_lm_sample_targets_are_next_tokens():
    tokens, targets = sample_batch("gpt2-tiny", 2)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])


def test_masked_lm_sample_ignores_unmasked_positions():
    tokens, targets = sample_batch(build_model("bert-tiny"), 4)
    masked = targets != -100
    assert 0.05 < masked.float().mean() < 0.3
    assert int(targets[masked].max()) < 256


def test_sample_batch_rejects_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        sample_batch("mlp", 0)


def test_the_digits_are_scikit_learns_digits():
    from sklearn.datasets import load_digits

    from workbench.models.data import _digits_raw

    images, labels = _digits_raw()
    reference = load_digits()
    assert np.array_equal(images, reference.images.astype(np.float32) / 16.0)
    assert np.array_equal(labels, reference.target) and labels.dtype == np.int64


def test_digits_split_shapes_and_resumption():
    train_x, train_y = digits_dataset(image_size=32, channels=3, train=True)
    test_x, _ = digits_dataset(image_size=32, channels=3, train=False)
    assert train_x.shape[1:] == (3, 32, 32) and len(train_x) + len(test_x) == 1797
    assert set(train_y.tolist()) == set(range(10))
    stream = take(digits_batches(64, seed=3), 30)  # 22 batches per epoch: crosses an epoch boundary
    resumed = take(digits_batches(64, seed=3, start_batch=20), 10)
    for (x, y), (rx, ry) in zip(stream[20:], resumed):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    other_seed = next(digits_batches(64, seed=4))
    assert not torch.equal(stream[0][1], other_seed[1])
    raw, _ = next(digits_batches(8, image_size=8, channels=1))
    assert raw.shape == (8, 1, 8, 8)


def test_bytes_lm_targets_shifted_and_resumable():
    tokens, targets = next(bytes_lm_batches(4, 32, seed=1))
    assert tokens.shape == targets.shape == (4, 32) and tokens.dtype == torch.int64
    assert torch.equal(tokens[:, 1:], targets[:, :-1]) and int(tokens.max()) < 256
    stream = take(bytes_lm_batches(4, 32, seed=1), 5)
    resumed = take(bytes_lm_batches(4, 32, seed=1, start_batch=3), 2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(stream[3:], resumed))
    with pytest.raises(ValueError, match="start_batch must be an int >= 0"):
        next(bytes_lm_batches(4, 32, start_batch=-1))


def _train(seq, batches, steps, lr):
    optimizer = torch.optim.Adam(seq.parameters(), lr=lr)
    for inputs, targets in itertools.islice(batches, steps):
        loss = seq.loss_fn(seq(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def test_vgg_tiny_learns_digits():
    torch.manual_seed(0)
    seq = build_model("vgg-tiny", fc_width=256)
    _train(seq, digits_batches(64, seed=0), 60, 1e-3)
    test_x, test_y = digits_dataset(image_size=32, channels=3, train=False)
    with torch.no_grad():
        accuracy = (seq.eval()(test_x).argmax(-1) == test_y).float().mean().item()
    assert accuracy > 0.85


def test_gpt2_tiny_learns_bytes():
    torch.manual_seed(0)
    seq = build_model("gpt2-tiny", seq_len=32)
    final = _train(seq, bytes_lm_batches(16, 32, seed=0), 80, 3e-3)
    assert final < 3.6  # uniform guessing over 256 bytes scores ln(256) = 5.55
