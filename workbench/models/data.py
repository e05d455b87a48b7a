"""Batches for the zoo: synthetic tensors of the right shape, and two real small tasks.

Profiling and shape checks need only tensors of the right shape and dtype
(:func:`sample_batch`). Learning checks need real data that is present on
every machine without a download:

* :func:`digits_batches`: the 1797 handwritten 8x8 digits shipped inside
  scikit-learn, scaled to ``image_size`` and repeated to ``channels`` so
  torchvision CNNs accept them (``image_size=8, channels=1`` keeps them raw
  for small nets). A fixed split holds out every fifth image for testing.
* :func:`bytes_lm_batches`: byte-level language modelling (vocabulary 256)
  over the Python standard library's own source files, which ship with every
  Python. Targets are the next byte: ``targets[:, t] == corpus[o + t + 1]``
  when ``tokens[:, t] == corpus[o + t]``, so a causal LM's loss compares
  logits at ``t`` with ``targets[:, t]`` without shifting again.

Both streams are infinite, deterministic given ``seed``, and resumable:
batch ``i`` depends only on ``(seed, i)``, so ``start_batch=i`` continues a
run with exactly the data it would have seen.
"""

from __future__ import annotations

import importlib.util
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ..core.fields import check_int
from .sequence import InputSpec, LayerSequence, synthetic_inputs

__all__ = ["sample_batch", "digits_batches", "digits_dataset", "bytes_lm_batches",
           "bytes_corpus"]

CORPUS_BYTES = 4_000_000


def _spec_and_task(seq_or_name: LayerSequence | str) -> tuple[InputSpec, str, str]:
    if isinstance(seq_or_name, str):
        from .zoo import get_entry

        entry = get_entry(seq_or_name)
        with torch.device("meta"):
            seq = entry.to_sequence(entry.build(entry.config({})), entry.name, entry.config({}))
    elif isinstance(seq_or_name, LayerSequence):
        seq = seq_or_name
    else:
        raise ValueError(f"sample_batch needs a LayerSequence or a zoo model name, got {type(seq_or_name).__name__}")
    if seq.input_spec is None:
        raise ValueError(f"model {seq.model_name!r} has no input_spec, so no batch can be synthesised; "
                         "pass input_spec=InputSpec(shape=..., dtype=...) when building the LayerSequence")
    return seq.input_spec, seq.task, seq.model_name


def sample_batch(seq_or_name: LayerSequence | str, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic ``(inputs, targets)`` batch for a sequence (or zoo name), right shape and dtype.

    Classifiers: inputs [B, ...] float, targets [B] class ids. Causal LMs:
    tokens [B, T] and next tokens [B, T]. Masked LMs: tokens [B, T] with 15%
    of positions replaced by random tokens, targets [B, T] holding the
    original token there and -100 (ignored) elsewhere.
    """
    check_int("batch_size", batch_size, 1)
    spec, task, _ = _spec_and_task(seq_or_name)
    generator = torch.Generator().manual_seed(seed + 1)
    if task == "causal-lm":
        stream = synthetic_inputs(InputSpec((spec.shape[0] + 1,), spec.dtype, spec.high), batch_size, seed=seed)
        return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()
    inputs = synthetic_inputs(spec, batch_size, seed=seed)
    if task == "masked-lm":
        masked = torch.rand(inputs.shape, generator=generator) < 0.15  # [B, T] bool
        targets = torch.where(masked, inputs, torch.full_like(inputs, -100))
        noise = torch.randint(0, spec.high, inputs.shape, generator=generator, dtype=inputs.dtype)
        return torch.where(masked, noise, inputs), targets
    if spec.num_targets is None:
        raise ValueError("input_spec.num_targets is None, so no targets can be synthesised; set it to the class count")
    return inputs, torch.randint(0, spec.num_targets, (batch_size,), generator=generator)


@lru_cache(maxsize=None)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 bundled 8x8 digits: images [N, 8, 8] in [0, 1] and labels [N].

    Read from scikit-learn's own data file (what ``load_digits`` reads: one
    row per image, 64 pixel values then the label) without importing
    scikit-learn, whose import (SciPy's statistics with it) cost every rank of
    a run about two seconds of CPU before its first step; ``load_digits``
    where the file is not found.
    """
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is not None and path.is_file():
        data = np.loadtxt(path, delimiter=",")
        images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1]
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images, target = digits.images, digits.target
    return images.astype(np.float32) / 16.0, target.astype(np.int64)


@lru_cache(maxsize=8)
def digits_dataset(*, image_size: int = 32, channels: int = 3, train: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """All digits of one split: images [N, channels, image_size, image_size] (normalised), labels [N]."""
    check_int("image_size", image_size, 1)
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}")
    images, labels = _digits_raw()
    held_out = np.arange(len(images)) % 5 == 0
    keep = ~held_out if train else held_out
    x = torch.from_numpy(images[keep]).unsqueeze(1)  # [N, 1, 8, 8]
    if image_size != 8:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    x = (x - 0.3) / 0.4  # roughly zero mean, unit spread over the whole set
    return x.expand(-1, channels, -1, -1).contiguous(), torch.from_numpy(labels[keep])


def digits_batches(batch_size: int, *, image_size: int = 32, channels: int = 3, train: bool = True,
                   seed: int = 0, start_batch: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (images [B, C, S, S], labels [B]) batches, reshuffled each epoch; last partial batch dropped."""
    check_int("batch_size", batch_size, 1)
    check_int("start_batch", start_batch, 0)
    images, labels = digits_dataset(image_size=image_size, channels=channels, train=train)
    per_epoch = len(images) // batch_size
    if per_epoch == 0:
        raise ValueError(f"batch_size must be <= {len(images)} (the split's size), got {batch_size}")
    index = start_batch
    while True:
        epoch, offset = divmod(index, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(images))
        chosen = torch.from_numpy(order[offset * batch_size:(offset + 1) * batch_size])
        yield images[chosen], labels[chosen]
        index += 1


@lru_cache(maxsize=1)
def bytes_corpus() -> np.ndarray:
    """The standard library's top-level ``.py`` files, sorted by name, concatenated (first 4 MB) as uint8."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= CORPUS_BYTES:
            break
    corpus = np.frombuffer(b"".join(chunks)[:CORPUS_BYTES], dtype=np.uint8)
    if len(corpus) < 10_000:
        raise RuntimeError(f"the standard library at {stdlib} holds only {len(corpus)} bytes of source")
    return corpus


def bytes_lm_batches(batch_size: int, seq_len: int, *, seed: int = 0, start_batch: int = 0,
                     train: bool = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (tokens [B, T] long, next tokens [B, T] long) windows of the byte corpus.

    The last 10% of the corpus is the test split (``train=False``).
    """
    check_int("batch_size", batch_size, 1)
    check_int("seq_len", seq_len, 1)
    check_int("start_batch", start_batch, 0)
    corpus = bytes_corpus()
    split = int(len(corpus) * 0.9)
    lo, hi = (0, split) if train else (split, len(corpus))
    if hi - lo <= seq_len + 1:
        raise ValueError(f"seq_len must be < {hi - lo - 1}, got {seq_len}")
    data = torch.from_numpy(corpus[lo:hi].astype(np.int64))
    window = torch.arange(seq_len + 1)  # [T + 1]
    index = start_batch
    while True:
        starts = np.random.default_rng([seed, index]).integers(0, len(data) - seq_len - 1, size=batch_size)
        rows = data[torch.from_numpy(starts)[:, None] + window]  # [B, T + 1]
        yield rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        index += 1
