"""On-disk cache of profiles, keyed by everything that changes a measurement.

Profiling a large model takes minutes; a notebook re-run should not pay that
again. An entry is keyed by the model (name and a fingerprint of its
structure and parameter shapes), the batch shapes and dtypes, the parameter
dtype, the device (for CPUs also the thread count), the torch version and
the measurement settings. The file name hashes only the machine-independent
part of the key, so an entry written by another torch version or an older
profiler lands on the same path and is recognised as *stale* rather than
silently ignored. Each entry carries a checksum of its costs: a truncated or
hand-edited file is *corrupted*. Either way :func:`load` returns ``None``
with the reason, and the profiler measures again and overwrites the entry.

Location: ``$WORKBENCH_CACHE_DIR`` if set, else ``~/.cache/workbench/profiles``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..core.costs import ModelCosts

__all__ = ["cache_dir", "entry_path", "load", "store", "CACHE_FORMAT"]

# 2: meta["winograd_flops"]; 3: the split backward; 4: I and W timed as the stages run them; 5: identical layers
# timed once (meta["identical_layers"], the key's share_identical)
CACHE_FORMAT = 5
# Key fields whose change makes an entry stale (same file, different contents).
_VERSION_FIELDS = ("torch", "format")


def cache_dir(override: str | Path | None = None) -> Path:
    if override is not None:
        return Path(override)
    env = os.environ.get("WORKBENCH_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "workbench" / "profiles"


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def entry_path(key: dict[str, Any], directory: str | Path | None = None) -> Path:
    """Where the entry for ``key`` lives (independent of the version fields)."""
    stable = {k: v for k, v in key.items() if k not in _VERSION_FIELDS}
    safe_model = "".join(c if c.isalnum() or c in "-_" else "_" for c in str(key.get("model", "model")))
    return cache_dir(directory) / f"{safe_model}-{_digest(stable)[:20]}.json"


def load(key: dict[str, Any], directory: str | Path | None = None) -> tuple[ModelCosts | None, str]:
    """``(costs, "hit")``, or ``(None, reason)`` for a miss, a stale or a corrupted entry."""
    path = entry_path(key, directory)
    if not path.is_file():
        return None, "miss"
    try:
        entry = json.loads(path.read_text())
        stored_key, checksum, data = entry["key"], entry["checksum"], entry["costs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"corrupted entry {path.name} ({type(exc).__name__}: {exc})"
    if _digest(data) != checksum:
        return None, f"corrupted entry {path.name} (checksum mismatch)"
    if stored_key != json.loads(json.dumps(key, sort_keys=True, default=str)):
        changed = sorted(k for k in set(stored_key) | set(key) if stored_key.get(k) != key.get(k))
        return None, f"stale entry {path.name} (changed: {', '.join(changed)})"
    try:
        costs = ModelCosts.from_dict(data)
    except ValueError as exc:
        return None, f"corrupted entry {path.name} ({exc})"
    return costs, "hit"


def store(key: dict[str, Any], costs: ModelCosts, directory: str | Path | None = None) -> Path:
    """Write the entry atomically (temp file, then rename)."""
    path = entry_path(key, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = costs.to_dict()
    entry = {"key": json.loads(json.dumps(key, sort_keys=True, default=str)), "checksum": _digest(data), "costs": data}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(entry, indent=1))
    tmp.replace(path)
    return path
