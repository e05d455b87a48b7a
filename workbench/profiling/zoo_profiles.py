"""Profiles of zoo models, found again without building the model or importing torch.

:func:`workbench.profiling.profile` keys its cache by the built model's
structure, so finding a cached profile costs an import of torch and a model
build (for a 48-layer GPT-2 about 10 s, most of it drawing random weights).
A planner asked again about the same zoo model should answer in a fraction
of a second, so :func:`profile_zoo` keeps an index beside that cache, keyed
by what decides the model and its measurement without building anything:

* the zoo name, its config overrides, the batch and the profiler's settings;
* this machine's CPU as torch would use it (architecture, processor, cores
  this process may use, the thread variables);
* the versions of torch, torchvision and transformers, and a digest of the
  workbench's own sources, so a change to any of them makes the entry stale.

An entry holds the profile, the zoo entry's family and resolved config (what
a planner needs for the transformer's shape), and whatever else a caller
reads off the built model through ``extras`` (the planner: each layer's
tensor-parallel limits by the runtime's rules), keyed by the extras' names
and the functions that compute them, named ``"module:function"`` so that
looking an entry up imports none of them. The index only answers where
the profile would be taken on the CPU: on a machine with an NVIDIA or AMD
GPU driver, ``device="auto"`` may mean the GPU, and only torch can say, so
the model is built and profiled (or found in the profile cache) as before.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.costs import ModelCosts
from .cache import cache_dir as _cache_root

__all__ = ["ZooProfile", "profile_zoo", "indexed_profile", "index_key"]

INDEX_FORMAT = 1
_PACKAGES = ("torch", "torchvision", "transformers")
_GPU_DRIVERS = ("/proc/driver/nvidia", "/dev/nvidia0", "/dev/kfd")


@dataclass(frozen=True)
class ZooProfile:
    """A zoo model's profile, with the zoo entry's family and resolved config."""

    costs: ModelCosts
    family: str
    config: dict[str, Any]
    indexed: bool  # found in the index, without building the model
    extras: dict[str, Any]  # what each of ``extras`` read off the built model


Extras = Mapping[str, str]  # name -> "module:function" of the built model, returning JSON values


def profile_zoo(name: str, overrides: dict[str, Any] | None = None, batch: int = 8, *, device: str = "auto",
                cache: bool = True, cache_dir: str | None = None, extras: Extras | None = None,
                sizes: Sequence[int] | None = None, **settings: Any) -> ZooProfile:
    """Profile zoo model ``name`` built with ``overrides`` at ``batch`` (``settings`` go to
    :func:`~workbench.profiling.profile`), from the index when it holds it (see the module docstring);
    ``extras``: name -> ``"module:function"``, a function of the built model whose value (JSON: lists, numbers,
    strings) the result's ``extras`` carries under that name. ``sizes``: profiled at each of these batch sizes and
    fitted (:func:`~workbench.profiling.profile_sizes`) instead of at ``batch`` alone."""
    overrides, extras = dict(overrides or {}), dict(extras or {})
    if sizes is not None:
        settings = {**settings, "sizes": sorted(set(sizes))}
    key = index_key(name, overrides, batch, device, settings, extras) if cache else None
    path = _entry_path(key, cache_dir) if key is not None else None
    found = _read(path, key) if path is not None else None
    if found is not None:
        return found
    from ..models.zoo import build_model, get_entry
    from .batch_profiles import profile_sizes
    from .profiler import profile

    entry = get_entry(name)
    config = entry.config(overrides)
    model = build_model(name, **overrides)
    read = {extra: _function(spec)(model) for extra, spec in extras.items()}
    if sizes is not None:
        costs = profile_sizes(model, settings.pop("sizes"), device=device, cache=cache, cache_dir=cache_dir,
                              **settings)
    else:
        costs = profile(model, batch=batch, device=device, cache=cache, cache_dir=cache_dir, **settings)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"key": key, "family": entry.family, "config": config, "costs": costs.to_dict(), "extras": read}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, default=list))
        tmp.replace(path)
    return ZooProfile(costs, entry.family, config, indexed=False, extras=read)


def indexed_profile(name: str, overrides: dict[str, Any] | None = None, batch: int = 8, *, device: str = "auto",
                    cache_dir: str | None = None, extras: Extras | None = None, sizes: Sequence[int] | None = None,
                    **settings: Any) -> ZooProfile | None:
    """:func:`profile_zoo`'s answer if the index holds it, else None; never builds the model."""
    if sizes is not None:
        settings = {**settings, "sizes": sorted(set(sizes))}
    key = index_key(name, dict(overrides or {}), batch, device, settings, dict(extras or {}))
    return _read(_entry_path(key, cache_dir), key) if key is not None else None


def index_key(name: str, overrides: dict[str, Any], batch: int, device: str, settings: dict[str, Any],
              extras: Extras | None = None) -> dict | None:
    """The index key of a zoo profile; None where only torch can say which device ``device`` is."""
    if device not in ("auto", "cpu") or (device == "auto" and any(Path(p).exists() for p in _GPU_DRIVERS)):
        return None
    return {"format": INDEX_FORMAT, "model": name, "overrides": overrides, "batch": batch,
            "settings": {k: v for k, v in sorted(settings.items()) if k != "progress"}, "cpu": _cpu(),
            "environment": _environment(), "extras": dict(sorted((extras or {}).items()))}


def _function(spec: str) -> Callable[[Any], Any]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _cpu() -> list:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [platform.machine(), platform.processor(), os.cpu_count(), affinity,
            os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS")]


@lru_cache(maxsize=1)
def _environment() -> dict[str, str]:
    """Package versions and a digest of the workbench's sources (about 200 files, a few milliseconds)."""
    versions = {}
    for package in _PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "absent"
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for source in sorted(root.rglob("*.py")):
        digest.update(str(source.relative_to(root)).encode() + source.read_bytes())
    return {**versions, "sources": digest.hexdigest()[:24]}


def _entry_path(key: dict, directory: str | None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in key["model"])
    return _cache_root(directory) / "zoo-index" / f"{safe}-{digest}.json"


def _read(path: Path, key: dict) -> ZooProfile | None:
    """The entry at ``path`` if it is whole and was written for ``key``; None otherwise (measured again)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if json.dumps(record["key"], sort_keys=True, default=str) != json.dumps(key, sort_keys=True, default=str):
            return None
        costs = ModelCosts.from_dict(record["costs"])
        return ZooProfile(costs, record["family"], record["config"], indexed=True, extras=record["extras"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
