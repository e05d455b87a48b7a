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

import numpy as np
import torch

from ..core.config import RunConfig
from .interpreter import MicrobatchData

__all__ = ["global_batches", "split_rounds", "validation_batches", "run_model", "group_share"]

Batch = tuple[torch.Tensor, torch.Tensor]


def run_model(config: RunConfig):
    """The run's model as every rank and the reference build it; a factory model without an input spec
    takes the per-sample shape of the first training item of a dataset."""
    from ..models.source import build_run_model

    spec = None
    if config.model.from_factory and config.data.is_dataset:
        from ..models.datasets import load_datasets
        from ..models.sequence import InputSpec

        x, _ = load_datasets(config.data, seed=config.training.seed)[0][0]
        x = torch.as_tensor(x)
        spec = InputSpec(tuple(x.shape), x.dtype)
    return build_run_model(config, input_spec=spec)


def group_share(indices: list[int], config: RunConfig, group: int) -> list[int]:
    """The rows of a global batch that data-parallel replica ``group`` trains, round by round."""
    round_size = config.training.global_batch // config.training.grad_accum
    size = round_size // config.plan.dp
    return [i for r in range(config.training.grad_accum) for i in indices[r * round_size + group * size:][:size]]


class _StepIndices:
    """Batch sampler: step ``s``'s global batch is a slice of epoch ``s // per_epoch``'s seeded permutation."""

    def __init__(self, length: int, config: RunConfig, start_step: int, group: int | None) -> None:
        self.length, self.config, self.start, self.group = length, config, start_step, group
        self.per_epoch = length // config.training.global_batch
        if self.per_epoch == 0:
            raise ValueError(f"config field 'training.global_batch' = {config.training.global_batch} is larger "
                             f"than the training "
                             f"set ({length} samples)")

    def __iter__(self) -> Iterator[list[int]]:
        step, batch = self.start, self.config.training.global_batch
        while True:
            epoch, offset = divmod(step, self.per_epoch)
            order = np.random.default_rng([self.config.training.seed, epoch]).permutation(self.length)
            indices = order[offset * batch:(offset + 1) * batch].tolist()
            yield indices if self.group is None else group_share(indices, self.config, self.group)
            step += 1


def _pairs(batch) -> Batch:
    inputs, targets = batch[0], batch[1]
    return torch.as_tensor(inputs), torch.as_tensor(targets)


def global_batches(config: RunConfig, model, start_step: int = 0, group: int | None = None) -> Iterator[Batch]:
    """Infinite iterator of (inputs, targets) global batches starting at ``start_step``.

    For datasets (``config.data.is_dataset``), a DataLoader with
    ``data.workers`` worker processes reads the samples; with ``group`` it
    reads only that data-parallel replica's share of each global batch
    (:func:`group_share`), which :func:`split_rounds` takes as it is.
    """
    from ..models import sample_batch
    from ..models import data as datasets

    kind = config.data.kind
    if config.data.is_dataset:
        from torch.utils.data import DataLoader

        from ..models.datasets import load_datasets

        train, _ = load_datasets(config.data, seed=config.training.seed)
        sampler = _StepIndices(len(train), config, start_step, None if config.plan.dp == 1 else group)
        loader = DataLoader(train, batch_sampler=sampler, num_workers=config.data.workers,
                            persistent_workers=config.data.workers > 0)
        return (_pairs(b) for b in loader)
    if kind == "synthetic":
        def synthetic() -> Iterator[Batch]:
            step = start_step
            while True:
                yield sample_batch(model, config.training.global_batch, seed=config.training.seed * 1_000_003 + step)
                step += 1
        return synthetic()
    if kind == "digits":
        shape = model.input_spec.shape if getattr(model, "input_spec", None) is not None else (3, 32, 32)
        if len(shape) == 1:  # flat features: one-channel square images, flattened
            side = round(shape[0] ** 0.5)
            images = datasets.digits_batches(config.training.global_batch, image_size=side, channels=1,
                                             seed=config.training.seed,
                                             start_batch=start_step)
            return ((x.reshape(x.shape[0], -1), y) for x, y in images)
        return datasets.digits_batches(config.training.global_batch, image_size=shape[-1], channels=shape[0],
                                       seed=config.training.seed, start_batch=start_step)
    return datasets.bytes_lm_batches(config.training.global_batch, config.data.seq_len, seed=config.training.seed,
                                     start_batch=start_step)


def validation_batches(config: RunConfig, model) -> Iterator[Batch]:
    """The held-out batches an evaluation runs over: ``config.evaluation.batches`` of ``global_batch`` samples
    (fewer when the validation set is smaller), the same ones at every evaluation."""
    if not config.data.is_dataset:
        from ..models.datasets import builtin_validation

        yield from builtin_validation(config, model, config.training.global_batch)
        return
    from torch.utils.data import DataLoader, Subset

    from ..models.datasets import load_datasets

    _, val = load_datasets(config.data, seed=config.training.seed)
    val = Subset(val, range(min(len(val), config.evaluation.batches * config.training.global_batch)))
    for batch in DataLoader(val, batch_size=config.training.global_batch, shuffle=False,
                            num_workers=config.data.workers):
        yield _pairs(batch)


def split_rounds(batch: Batch, config: RunConfig, group: int) -> list[MicrobatchData]:
    """This group's micro-batches of one global batch, one entry per accumulation round.

    A batch of ``global_batch / dp`` samples (with dp > 1) is already the
    group's share (:func:`global_batches` with ``group``): its rounds follow
    one another.
    """
    inputs, targets = batch
    round_size = config.training.global_batch // config.training.grad_accum
    group_size = round_size // config.plan.dp
    shared = config.plan.dp > 1 and inputs.shape[0] == config.training.global_batch // config.plan.dp
    if inputs.shape[0] != config.training.global_batch and not shared:
        raise ValueError(f"data yielded a batch of {inputs.shape[0]} samples, config training.global_batch is "
                         f"{config.training.global_batch}")
    rounds = []
    mb = config.microbatch_size
    for r in range(config.training.grad_accum):
        lo = r * group_size if shared else r * round_size + group * group_size
        x, y = inputs[lo:lo + group_size], targets[lo:lo + group_size]
        rounds.append(MicrobatchData(inputs=list(x.split(mb)), targets=list(y.split(mb))))
    return rounds
