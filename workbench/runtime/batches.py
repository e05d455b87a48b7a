"""Global batches and how one rank slices them into micro-batches.

Every strategy and the single-process reference must see the same samples
in the same order, or their parameters could not be compared. So there is
one source: :func:`global_batches` yields the whole global batch of each
step (deterministic in ``seed`` and the step, so a resumed run continues
with the exact next batch), and :func:`split_rounds` cuts it the way the
runtime does: ``grad_accum`` rounds, each round across the plan's ``dp``
replicas (replica ``g`` takes the ``g``-th equal slice) and then into the
plan's ``microbatches``.
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..core.config import RunConfig
from .interpreter import MicrobatchData

__all__ = ["global_batches", "split_rounds"]

Batch = tuple[torch.Tensor, torch.Tensor]


def global_batches(config: RunConfig, model, start_step: int = 0) -> Iterator[Batch]:
    """Infinite iterator of (inputs, targets) global batches starting at ``start_step``."""
    from ..models import sample_batch
    from ..models import data as datasets

    kind = config.data.kind
    if kind == "synthetic":
        def synthetic() -> Iterator[Batch]:
            step = start_step
            while True:
                yield sample_batch(model, config.global_batch, seed=config.seed * 1_000_003 + step)
                step += 1
        return synthetic()
    if kind == "digits":
        shape = model.input_spec.shape if getattr(model, "input_spec", None) is not None else (3, 32, 32)
        if len(shape) == 1:  # flat features: one-channel square images, flattened
            side = round(shape[0] ** 0.5)
            images = datasets.digits_batches(config.global_batch, image_size=side, channels=1, seed=config.seed,
                                             start_batch=start_step)
            return ((x.reshape(x.shape[0], -1), y) for x, y in images)
        return datasets.digits_batches(config.global_batch, image_size=shape[-1], channels=shape[0],
                                       seed=config.seed, start_batch=start_step)
    return datasets.bytes_lm_batches(config.global_batch, config.data.seq_len, seed=config.seed,
                                     start_batch=start_step)


def split_rounds(batch: Batch, config: RunConfig, group: int) -> list[MicrobatchData]:
    """This group's micro-batches of one global batch, one entry per accumulation round."""
    inputs, targets = batch
    if inputs.shape[0] != config.global_batch:
        raise ValueError(f"data yielded a batch of {inputs.shape[0]} samples, config global_batch is "
                         f"{config.global_batch}")
    rounds = []
    round_size = config.global_batch // config.grad_accum
    group_size = round_size // config.plan.dp
    mb = config.microbatch_size
    for r in range(config.grad_accum):
        lo = r * round_size + group * group_size
        x, y = inputs[lo:lo + group_size], targets[lo:lo + group_size]
        rounds.append(MicrobatchData(inputs=list(x.split(mb)), targets=list(y.split(mb))))
    return rounds
