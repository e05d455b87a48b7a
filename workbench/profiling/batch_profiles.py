"""Profiles at several batch sizes, fitted into one ``ModelCosts`` whose times follow the batch.

A plan runs its layers on micro-batches of its own size (global batch / data
parallel replicas / micro-batches), from one sample to the whole batch, and
what a layer costs a sample depends on that size: fixed work per call
(operator dispatch, reading a fully connected layer's weights) weighs on
small micro-batches, and a CPU keeps getting faster per sample as the batch
grows. :func:`profile_sizes` profiles the model at each of a few sizes
(:func:`workbench.core.batch_fit.fit_sizes`: the planned range's ends and
sizes a factor of 4 apart; each an ordinary :func:`~.profiler.profile`,
identical layers timed once) and fits them
(:func:`workbench.core.batch_fit.fit_profiles`): piecewise-linear per layer
between the sizes. The result is the profile at the largest size with the
fit beside it (``ModelCosts.batch_fit``), cached on disk as one entry.

Drift. A fit is a shape across sizes, so a burst of other work during one
size's profile bends it (on this shared machine one size's total moved by
up to 17% between rounds). So the sizes are profiled in ``rounds`` rounds,
ascending then descending, and each layer's times at each size are the mean
of its rounds: drift is spread over all sizes rather than baked into one.
(Keeping each layer's fastest round instead predicted a round of the
benchmark 28-130% faster than it ran on the loaded machine.)

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

import torch
from torch import nn

from ..core.batch_fit import fit_profiles
from ..core.costs import LayerCost, ModelCosts
from ..core.fields import check_int, check_tuple, integer
from ..models import LayerSequence
from .cache import CACHE_FORMAT, load as load_cached, store as store_cached
from .profiler import _device_key, _fingerprint, as_sequence, profile, resolve_device

__all__ = ["profile_sizes", "PASSES_BATCH", "ROUNDS"]

PASSES_BATCH = 8  # the micro-batch passes run on the profile nearest this size
ROUNDS = 2  # rounds over the sizes (ascending, then descending); a layer's times: the mean of its rounds'
_TIMES = ("forward_ms", "backward_ms", "input_grad_ms", "weight_grad_ms")


def _mean_layer(layers: Sequence[LayerCost]) -> LayerCost:
    """One layer's measurement from several rounds: the mean of each time, the widest spread."""
    out = {}
    for name in _TIMES:
        values = [getattr(l, name) for l in layers]
        if all(v is not None for v in values):
            out[name] = sum(values) / len(values)
            out[f"{name}_spread"] = max(getattr(l, f"{name}_spread") for l in layers)
    return replace(layers[0], **out)


def _pooled(rounds: Sequence[ModelCosts]) -> ModelCosts:
    """One size's profile from its rounds: each layer's times the mean of the rounds', the first round's counts."""
    layers = tuple(_mean_layer(group) for group in zip(*(p.layers for p in rounds)))
    totals = [round(sum(l.compute_ms for l in p.layers), 3) for p in rounds]
    return replace(rounds[0], layers=layers, meta={**rounds[0].meta, "round_totals_ms": totals})


def _key(seq: LayerSequence, sizes: list[int], rounds: int, device: Any, passes: bool,
         kwargs: dict[str, Any]) -> dict[str, Any]:
    settings = {k: kwargs.get(k, default) for k, default in
                (("warmup", 1), ("repeats", 3), ("optimizer", "adam"), ("share_identical", True))}
    return {"model": seq.model_name, "fingerprint": _fingerprint(seq), "layers": seq.layer_names,
            "profile_sizes": sizes, "rounds": rounds, "device": _device_key(resolve_device(device)),
            "microbatch_passes": passes, **settings, "torch": torch.__version__, "format": CACHE_FORMAT}


def profile_sizes(model_or_sequence: LayerSequence | nn.Module | str, sizes: Sequence[int], *,
                  rounds: int = ROUNDS, microbatch_passes: bool = False, cache: bool = True,
                  cache_dir: str | None = None, device: str = "auto", **kwargs: Any) -> ModelCosts:
    """Profile at each of ``sizes`` (synthetic batches) in ``rounds`` interleaved rounds and fit them: a
    ``ModelCosts`` at the largest size whose ``batch_fit`` holds every layer's times at each (one size: that
    profile, without a fit). Cached on disk as one entry (``cache``, ``cache_dir``).

    ``kwargs`` go to every :func:`~.profiler.profile` call (``repeats``, ``warmup``, ``progress``, ...).
    """
    sizes = sorted(set(check_tuple("sizes", sizes, integer(1), expected="a list of batch sizes >= 1")))
    if not sizes:
        raise ValueError("sizes must name at least one batch size")
    check_int("rounds", rounds, 1)
    if "batch" in kwargs:
        raise ValueError("profile_sizes takes the batch sizes as sizes, not batch")
    seq = as_sequence(model_or_sequence)  # one model, so every size times the same weights
    key = _key(seq, sizes, rounds, device, microbatch_passes, kwargs)
    if cache:
        cached, _ = load_cached(key, cache_dir)
        if cached is not None:
            return replace(cached, meta={**cached.meta, "cache": "hit"})
    passes_at = min(sizes, key=lambda b: (abs(math.log(b / PASSES_BATCH)), b))
    measured: dict[int, list[ModelCosts]] = {size: [] for size in sizes}
    for r in range(rounds):
        for size in sizes if r % 2 == 0 else sizes[::-1]:
            passes = microbatch_passes and size == passes_at and r == 0
            measured[size].append(profile(seq, batch=size, microbatch_passes=passes, cache=False, device=device,
                                          **kwargs))
    costs = _fitted([_pooled(measured[size]) for size in sizes], measured[passes_at][0], microbatch_passes)
    if cache:
        store_cached(key, costs, cache_dir)
    return replace(costs, meta={**costs.meta, "cache": "miss" if cache else None})


def _fitted(profiles: list[ModelCosts], passes_profile: ModelCosts, microbatch_passes: bool) -> ModelCosts:
    """The profiles fitted (one alone: itself), with the micro-batch passes' record naming its batch."""
    fitted = fit_profiles(profiles) if len(profiles) > 1 else profiles[0]
    meta = {k: v for k, v in fitted.meta.items() if k != "microbatch_factors"}
    record = passes_profile.meta.get("microbatch_factors")
    if microbatch_passes and record is not None:
        meta["microbatch_factors"] = {**record, "batch": passes_profile.batch_size,
                                      "profiled_ms": sum(l.compute_ms for l in passes_profile.layers)}
    return replace(fitted, meta=meta)
