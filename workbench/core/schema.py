"""A JSON Schema of the run config, for editors: ``workbench schema > run-config.schema.json``.

Taplo and VS Code's Even Better TOML validate and complete a TOML file
against it (a ``#:schema ./run-config.schema.json`` first line, or the
editor's schema settings). It is derived from the dataclasses themselves:
every field of :class:`~workbench.core.config.RunConfig` and its tables with
its type and default, the choices the config accepts (optimizers, data
kinds, precisions, pipeline kinds and each kind's own options), unknown keys
refused as the config refuses them. The schema checks the shape of a file;
what depends on several fields at once (a batch that splits over the
replicas, a plan against its model) is checked when the config loads.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from .config import PRECISIONS, RunConfig
from .config_tables import DATA_KINDS, OPTIMIZERS, DataConfig, EventsConfig, OptimizerConfig
from .layer_plan import DP_KINDS, TP_KINDS, LayerPlan
from .pipelines import PIPELINE_KINDS

__all__ = ["run_config_schema"]

SCHEMA_URI = "https://json-schema.org/draft/2020-12/schema"
CHOICES = {("RunConfig", "precision"): PRECISIONS, ("OptimizerConfig", "name"): OPTIMIZERS,
           ("DataConfig", "kind"): DATA_KINDS, ("LayerPlan", "dp"): DP_KINDS, ("LayerPlan", "tp"): TP_KINDS}
TABLES = {"optimizer": OptimizerConfig, "events": EventsConfig}


def _type_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a field's annotation (the types the config fields use)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if origin is dict:
        return {"type": "object"}
    if origin is tuple:
        item = _type_schema(args[0]) if args else {}
        return {"type": "array", "items": item}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(a) for a in args]}
    return {}


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _table(cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object schema of a dataclass: one property per field, its default, no other keys."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        if f.name in skip or f.name.startswith("_"):
            continue
        prop = _type_schema(hints[f.name])
        if (cls.__name__, f.name) in CHOICES:
            prop = {"enum": list(CHOICES[(cls.__name__, f.name)])}
        if f.default is not dataclasses.MISSING:
            prop["default"] = _jsonable(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            prop["default"] = _jsonable(f.default_factory())  # type: ignore[misc]
        else:
            required.append(f.name)
        properties[f.name] = prop
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def _pipeline_schema() -> dict[str, Any]:
    """``[plan.pipeline]``: one branch per kind, with only that kind's options."""
    branches = []
    for kind, cls in PIPELINE_KINDS.items():
        options = _table(cls)
        options["properties"] = {"kind": {"const": kind}, **options["properties"]}
        options["required"] = ["kind"]
        options["title"] = f"pipeline kind {kind!r}"
        branches.append(options)
    return {"oneOf": branches}


def _plan_schema() -> dict[str, Any]:
    axes = {name: {"type": "integer", "minimum": 1} for name in ("dp", "pp", "tp", "tp_row", "tp_col")}
    layer = _table(LayerPlan)
    layer["properties"] = {"layers": {"type": ["string", "integer"], "description": "'all', 'N' or 'A-B'"},
                           **layer["properties"]}
    layer["required"] = ["layers"]
    table = {"type": "object", "additionalProperties": False, "properties": {
        "mesh": {"type": "object", "properties": axes, "additionalProperties": False,
                 "description": "the size of each device axis; the world size is their product"},
        "pipeline": _pipeline_schema(),
        "microbatches": {"type": "integer", "minimum": 1, "default": 1},
        "partition": {"type": "string", "default": "uniform",
                      "description": "'uniform', 'ampa' or one layer range per stage, e.g. '0-2|3-4'"},
        "layers": {"type": "array", "items": layer},
        "name": {"type": "string", "description": "a plan name instead of the table's other keys"}}}
    return {"anyOf": [{"type": "string", "description": "a plan name, e.g. 'pp2-1f1b-m4' or 'dp4'"}, table]}


def run_config_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a run config file (TOML or JSON)."""
    schema = _table(RunConfig, skip=("plan", "optimizer", "data", "events"))
    properties = schema["properties"]
    properties["plan"] = _plan_schema()
    for name, cls in TABLES.items():
        properties[name] = _table(cls)
    properties["data"] = {"anyOf": [{"type": "string", "description": "a factory 'package.module:function'"},
                                    _table(DataConfig)]}
    properties["model"]["description"] = "a zoo model name, or a factory 'package.module:function'"
    properties["launch"] = {"type": "object", "description": "read by `workbench launch`: LaunchSpec fields and "
                                                              "a [launch.slurm] table"}
    schema["required"] = ["model", "plan"]
    return {"$schema": SCHEMA_URI, "title": "workbench run config", **schema}
