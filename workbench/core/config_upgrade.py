"""Run configs of the earlier formats: where each flat key lives now, and the upgrade that moves it there.

Two earlier formats meet a run config:

* the flat keys of the plan (``strategy``, ``groups``, ``stages``, ``tp``,
  ``delay``, ...) are refused, naming where each lives in ``[plan]``
  (:data:`MOVED_TO_PLAN`): their meaning changed with the plan;
* the flat training keys (``steps``, ``global_batch``, ``eval_every``,
  ``run_dir``, ...) keep loading: :func:`upgrade` moves each into its table
  (:data:`FLAT_KEYS`), so a config file or run directory written before the
  tables reads as it always did, and is written back grouped.

Standard library only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MOVED_TO_PLAN", "FLAT_KEYS", "upgrade", "moved_attribute"]

# flat keys of the earlier plan format -> where each lives now
MOVED_TO_PLAN: dict[str, str] = {
    "strategy": "[plan] (plan = \"NAME\", or mesh + [plan.pipeline] kind)",
    "groups": "[plan] mesh.dp", "stages": "[plan] mesh.pp", "tp": "[plan] mesh.tp (1D) or mesh.tp_row/tp_col (2D)",
    "chunks": "[plan.pipeline] chunks (kind = \"interleaved\")", "inner": "[plan.pipeline] inner",
    "delay": "[plan.pipeline] delay", "stash": "[plan.pipeline] stash",
    "vertical_sync": "[plan.pipeline] vertical_sync",
    "mode": "[plan.pipeline] mode", "inflight": "[plan.pipeline] inflight",
    "memory_cap_mb": "[plan.pipeline] memory_cap_mb", "partition": "[plan] partition",
    "microbatches": "[plan] microbatches", "recompute": "[[plan.layers]] recompute (or a '-rc' plan name)",
}

# flat keys of the earlier run config -> (table, key in it)
FLAT_KEYS: dict[str, tuple[str, str]] = {
    "model_overrides": ("model", "overrides"), "model_args": ("model", "args"),
    "split_points": ("model", "split_points"),
    "global_batch": ("training", "global_batch"), "steps": ("training", "steps"), "seed": ("training", "seed"),
    "optimizer": ("training", "optimizer"), "grad_accum": ("training", "grad_accum"),
    "precision": ("training", "precision"), "checkpoint_every": ("training", "checkpoint_every"),
    "resume": ("training", "resume"),
    "eval_every": ("evaluation", "every"), "eval_batches": ("evaluation", "batches"),
    "target_accuracy": ("evaluation", "target_accuracy"), "target_perplexity": ("evaluation", "target_perplexity"),
    "tensorboard": ("events", "tensorboard"),
    "fail_at_step": ("faults", "step"), "fail_rank": ("faults", "rank"),
    "run_dir": ("run", "dir"), "device": ("run", "device"), "placement": ("run", "placement"),
    "collective_timeout_s": ("run", "collective_timeout_s"), "dump_params": ("run", "dump_params"),
}


def moved_to_plan_error(key: str) -> ValueError:
    return ValueError(f"config field {key!r} has moved into the parallel plan: use {MOVED_TO_PLAN[key]}. "
                      f"For example: plan = \"pp2-1f1b-m4\", or a [plan] table with "
                      f"mesh = {{dp = 1, pp = 2}}, microbatches = 4 and [plan.pipeline] kind = \"1f1b\"")


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every flat key of the earlier format moved into its table (a new dict; ``data`` as is when
    it has none). A plan key of the flat format is refused, naming where it lives now; a flat key given
    together with its new place is refused, naming both."""
    moved = [k for k in data if k in MOVED_TO_PLAN]
    if moved:
        raise moved_to_plan_error(moved[0])
    if not any(k in FLAT_KEYS for k in data):
        return data
    out = {k: v for k, v in data.items() if k not in FLAT_KEYS}
    for key in (k for k in data if k in FLAT_KEYS):
        table, name = FLAT_KEYS[key]
        target = out.get(table, {})
        if table == "model" and isinstance(target, str):  # model = "name" with the flat model_overrides
            target = {"name": target}
        if not isinstance(target, dict):
            raise ValueError(f"config field {table!r} = {target!r} is invalid: expected a table, which the flat "
                             f"field {key!r} moves into as {table}.{name}")
        if name in target:
            raise ValueError(f"config field {key!r} is the earlier flat form of '{table}.{name}', which is also "
                             f"given; keep '{table}.{name}'")
        out[table] = {**target, name: data[key]}
    return out


def moved_attribute(name: str) -> str | None:
    """Where a flat ``RunConfig`` attribute of the earlier format lives now (``config.training.steps``)."""
    if name in FLAT_KEYS:
        table, key = FLAT_KEYS[name]
        return f"config.{table}.{key}"
    if name == "model_from_factory":
        return "config.model.from_factory"
    return None
