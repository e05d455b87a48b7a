"""Checks of a run config against its model and data, before any process starts.

:class:`~workbench.core.config.RunConfig` checks its fields alone (stdlib,
no torch). What needs torch is checked here, in the launching process, so
that a bad run is refused with one line naming the field instead of failing
inside every rank: the model (a zoo name with known overrides, or a factory
that imports, accepts ``model_args`` and returns a module), an explicit
partition against the model's layer count, each layer a per-layer plan
splits against the tensor-parallel rules the ranks apply (the rule of
:mod:`workbench.core.tensor_support`, which the planner plans by), the data
against the model (two training samples run through the model and its loss),
and a schedule
built from the stages' costs (``zb-auto``) under its memory limit, which
the ranks would otherwise find impossible only once they had started.
"""

from __future__ import annotations

import torch

from ..core.config import RunConfig
from ..core.partition import Partition
from ..core.tensor_support import runs_uniform_tp
from .uniform_tp import GPT2_SIZES, check_tensor_parallel_model

__all__ = ["check_run", "GPT2_SIZES", "check_tensor_parallel_model"]


def _first_samples(config: RunConfig, model, count: int = 2) -> tuple[torch.Tensor, torch.Tensor] | None:
    if config.data.is_dataset:
        from torch.utils.data import default_collate

        from ..models.datasets import load_datasets

        train, _ = load_datasets(config.data, seed=config.training.seed)
        inputs, targets = default_collate([train[i] for i in range(min(count, len(train)))])
        return torch.as_tensor(inputs), torch.as_tensor(targets)
    if config.data.kind == "synthetic" and getattr(model, "input_spec", None) is None:
        raise ValueError(f"config field 'data.kind' = 'synthetic' needs the input shape of model "
                         f"{config.model.name!r}, "
                         "which its factory does not give: return a LayerSequence with an input_spec, or train "
                         "on a dataset (data = 'package.module:function')")
    if not config.model.from_factory:
        return None  # the zoo's models and the built-in data are made for each other
    from .batches import validation_batches

    inputs, targets = next(iter(validation_batches(config.replace(evaluation={"batches": 1}), model)))
    return inputs[:count], targets[:count]


def check_run(config: RunConfig) -> None:
    """Refuse (ValueError naming the field) a model, partition or data the run could not use."""
    from ..models.zoo import get_entry, list_models

    limited = config.plan.pipeline.uses_costs and getattr(config.plan.pipeline, "memory_limit_mb", 0)
    splits = config.plan.tp_kind != "none" and not runs_uniform_tp(config.plan)  # layers split one by one
    needs_model = (config.model.from_factory or config.data.is_dataset or limited or splits
                   or config.plan.num_virtual_stages > 1)  # a pipeline's stages each need a layer
    if not config.model.from_factory:
        if config.model.name not in list_models():
            raise ValueError(f"config field 'model.name' = {config.model.name!r} is not in the zoo; valid: "
                             f"{', '.join(list_models())}, or a factory 'package.module:function'")
        try:
            sizes = get_entry(config.model.name).config(config.model.overrides)
        except ValueError as exc:
            raise ValueError(f"config field 'model.overrides': {exc}") from None
        check_tensor_parallel_model(config, sizes)
    if not needs_model:
        return
    from .batches import run_model

    model = run_model(config)
    if config.model.from_factory:
        check_tensor_parallel_model(config, getattr(model, "config", None))
    text = config.plan.partition
    if text not in ("uniform", "ampa") and config.plan.num_virtual_stages > 1:
        try:
            Partition.parse(text, len(model))  # its stage count was checked with the plan
        except ValueError as exc:
            raise ValueError(f"plan field 'partition' = {text!r} does not fit model {config.model.name!r} "
                             f"with {len(model)} layers (0-{len(model) - 1}): {exc}") from None
    if splits:
        _check_split_layers(config, model)
    if len(model) < config.plan.num_virtual_stages:
        raise ValueError(f"config field 'plan' = {config.plan.name!r} has {config.plan.num_virtual_stages} stages, "
                         f"model {config.model.name!r} only {len(model)} layers ({', '.join(model.layer_names)}); "
                         "use fewer stages or more model.split_points")
    if limited:
        _check_schedule_fits(config, model)
    samples = _first_samples(config, model)
    if samples is None:
        return
    inputs, targets = samples
    where = f"data ({config.data.factory or config.data.path or config.data.kind})"
    model.eval()
    with torch.no_grad():
        try:
            out = model(inputs)
        except ValueError as exc:
            raise ValueError(f"config field 'data': {where} does not fit model {config.model.name!r}: {exc}") from None
        try:
            loss = model.loss_fn(out, targets)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ValueError(f"config field 'data': the targets of {where} (shape {tuple(targets.shape)}, "
                             f"{targets.dtype}) do not fit the loss of model {config.model.name!r}, whose output has "
                             f"shape {tuple(out.shape)}: {first}") from None
    if not torch.isfinite(loss):
        raise ValueError(f"config field 'data': the loss of model {config.model.name!r} on the first samples of "
                         f"{where} "
                         f"is {float(loss)}")


def _check_split_layers(config: RunConfig, model) -> None:
    """Every layer a layer-by-layer plan splits must be one the tensor-parallel rules split by its degree."""
    from .layer_parallel import tensor_parallel_rules

    try:
        layers = config.plan.layers_for(len(model))
    except ValueError:
        return  # the plan's layer count against the model's is refused where the ranks build their stages
    for i, layer in enumerate(layers):
        if layer.tp_degree > 1:
            try:
                tensor_parallel_rules(model[i], layer.tp_degree)
            except ValueError as exc:
                raise ValueError(f"plan field 'layers[{i}]' = {layer.text!r} does not fit layer {i} "
                                 f"{model.layer_names[i]!r} of model {config.model.name!r}: {exc}") from None


def _check_schedule_fits(config: RunConfig, model) -> None:
    """Build the schedule the ranks would build from the stages' measured costs: a memory limit no schedule meets
    is refused here, naming ``pipeline.memory_limit_mb``."""
    from ..scheduling.registry import schedule_for
    from .batches import global_batches, split_rounds
    from .entry import measured_stage_costs, resolve_partition

    example = split_rounds(next(global_batches(config, model, 0)), config, 0)[0].inputs[0]
    partition = resolve_partition(config, model, example)
    schedule_for(config.plan, stage_costs=measured_stage_costs(config, model, example, partition))


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.runtime.preflight CONFIG.json...``: exit 2 with one line when a run is refused.

    The job launcher runs it with the interpreter and environment the ranks
    will have, so a factory that imports in the notebook but not there is
    refused too. Several configs (the runs of a sweep) are checked in one
    process; the line of a refused one starts with its position.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="workbench.runtime.preflight", description=main.__doc__.splitlines()[0])
    parser.add_argument("config", nargs="+", help="run configs (JSON)")
    args = parser.parse_args(argv)
    for index, path in enumerate(args.config):
        try:
            check_run(RunConfig.from_json(path))
        except ValueError as exc:
            where = f"run {index}: " if len(args.config) > 1 else ""
            print(where + " ".join(str(exc).split()), file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
