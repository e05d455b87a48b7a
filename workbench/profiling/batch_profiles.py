"""Profiles at several batch sizes, fitted into one ``ModelCosts`` whose times follow the batch.

A plan runs its layers on micro-batches of its own size (global batch / data
parallel replicas / micro-batches), from one sample to the whole batch, and
what a layer costs a sample depends on that size: fixed work per call
(operator dispatch, reading a fully connected layer's weights) weighs on
small micro-batches, and a CPU keeps getting faster per sample as the batch
grows. :func:`profile_sizes` profiles the model at each of a few sizes
(:func:`workbench.core.batch_fit.fit_sizes`: the planned range's ends and
sizes a factor of 4 apart; each an ordinary :func:`~.profiler.profile`, cached
on disk, identical layers timed once) and fits them
(:func:`workbench.core.batch_fit.fit_profiles`): piecewise-linear per layer
between the sizes. The result is the profile at the largest size with the
fit beside it (``ModelCosts.batch_fit``).

With ``microbatch_passes`` the passes (:mod:`.microbatch`) run on the
profile at the size nearest 8 (their cost as before); their record
(``meta["microbatch_factors"]``) names that ``batch`` and its profiled
``profiled_ms``, so the planner can set them against the fit
(:func:`workbench.planning.costs.compute_scaling.profiled_compute_models`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

from torch import nn

from ..core.batch_fit import fit_profiles
from ..core.costs import ModelCosts
from ..core.fields import check_tuple, integer
from ..models import LayerSequence
from .profiler import as_sequence, profile

__all__ = ["profile_sizes", "PASSES_BATCH"]

PASSES_BATCH = 8  # the micro-batch passes run on the profile nearest this size


def profile_sizes(model_or_sequence: LayerSequence | nn.Module | str, sizes: Sequence[int], *,
                  microbatch_passes: bool = False, **kwargs: Any) -> ModelCosts:
    """Profile at each of ``sizes`` (synthetic batches) and fit them: a ``ModelCosts`` at the largest size
    whose ``batch_fit`` holds every layer's times at each (one size: that profile, without a fit).

    ``kwargs`` go to every :func:`~.profiler.profile` call (``device``, ``repeats``, ``cache``, ...).
    """
    sizes = sorted(set(check_tuple("sizes", sizes, integer(1), expected="a list of batch sizes >= 1")))
    if not sizes:
        raise ValueError("sizes must name at least one batch size")
    if "batch" in kwargs:
        raise ValueError("profile_sizes takes the batch sizes as sizes, not batch")
    seq = as_sequence(model_or_sequence)  # one model, so every size times the same weights
    passes_at = min(sizes, key=lambda b: (abs(math.log(b / PASSES_BATCH)), b))
    profiles, record = [], None
    for size in sizes:
        passes = microbatch_passes and size == passes_at
        costs = profile(seq, batch=size, microbatch_passes=passes, **kwargs)
        profiles.append(costs)
        if passes and "microbatch_factors" in costs.meta:
            record = {**costs.meta["microbatch_factors"], "batch": size,
                      "profiled_ms": sum(l.forward_ms + l.backward_ms for l in costs.layers)}
    if len(profiles) == 1:
        return profiles[0]
    fitted = fit_profiles(profiles)
    meta = {k: v for k, v in fitted.meta.items() if k != "microbatch_factors"}
    if record is not None:
        meta["microbatch_factors"] = record
    return replace(fitted, meta=meta)
