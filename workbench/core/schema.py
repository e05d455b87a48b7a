"""A JSON Schema of the run config, for editors: ``workbench schema > run-config.schema.json``.

Taplo and VS Code's Even Better TOML validate and complete a TOML file
against it (a ``#:schema ./run-config.schema.json`` first line, or the
editor's schema settings). It is derived from the dataclasses themselves:
every field of :class:`~workbench.core.config.RunConfig` and its tables
(``[model]``, ``[training]``, ...) with its type, bounds and default from
the rule the field declares (:mod:`~workbench.core.fields`): the choices the
config accepts (optimizers, data kinds, precisions, pipeline kinds and each
kind's own options), the ranges of its numbers, unknown keys refused as the
config refuses them. The earlier flat keys (``steps`` beside ``model``) are
accepted and marked deprecated, as the config loads them into their tables.
The schema checks the shape of a file; what depends on several fields at
once (a batch that splits over the replicas, a plan against its model) is
checked when the config loads.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from .config import RunConfig
from .config_tables import DataConfig, ModelConfig
from .config_upgrade import FLAT_KEYS
from .fields import rule_of, table_class
from .layer_plan import LayerPlan
from .pipelines import PIPELINE_KINDS

__all__ = ["run_config_schema"]

SCHEMA_URI = "https://json-schema.org/draft/2020-12/schema"


def _type_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a field's annotation, for a field that declares no rule."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if hint in simple:
        return {"type": simple[hint]}
    if origin is dict:
        return {"type": "object"}
    if origin is tuple:
        return {"type": "array", "items": _type_schema(args[0]) if args else {}}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(a) for a in args]}
    return {}


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _table(cls: type) -> dict[str, Any]:
    """An object schema of a dataclass: one property per field (its declared rule's schema, a nested table's own
    object schema, else its annotation's), its default, no other keys."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        rule, nested = rule_of(f), table_class(hints[f.name])
        prop = rule.json_schema if rule is not None else _table(nested) if nested else _type_schema(hints[f.name])
        if f.default is not dataclasses.MISSING:
            prop = {**prop, "default": _jsonable(f.default)}
        elif f.default_factory is not dataclasses.MISSING and nested is None:  # type: ignore[misc]
            prop = {**prop, "default": _jsonable(f.default_factory())}  # type: ignore[misc]
        elif f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            required.append(f.name)
        if nested is not None and nested.__doc__:
            prop["description"] = " ".join(nested.__doc__.replace("``", "`").split())
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


def _flat_keys(tables: dict[str, Any]) -> dict[str, Any]:
    """The earlier flat keys: accepted (each moves into its table when the file loads), marked deprecated."""
    out = {}
    for key, (table, name) in FLAT_KEYS.items():
        target = tables[table]
        target = next(b for b in target["anyOf"] if b.get("type") == "object") if "anyOf" in target else target
        out[key] = {**target["properties"][name], "deprecated": True,
                    "description": f"the earlier flat form of [{table}] {name}: write it there"}
        out[key].pop("default", None)
    return out


def run_config_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a run config file (TOML or JSON)."""
    schema = _table(RunConfig)
    properties = schema["properties"]
    properties["plan"] = _plan_schema()
    properties["model"] = {"anyOf": [{"type": "string", "description": "a zoo model name, or a factory "
                                                                      "'package.module:function'"},
                                     _table(ModelConfig)], "description": properties["model"].get("description", "")}
    properties["data"] = {"anyOf": [{"type": "string", "description": "a factory 'package.module:function'"},
                                    _table(DataConfig)], "description": properties["data"].get("description", "")}
    properties["plugins"] = {"type": "array", "items": {"type": "string"}, "default": [],
                             "description": "modules every process imports before it reads the plan"}
    properties.update(_flat_keys(properties))
    properties["launch"] = {"type": "object", "description": "read by `workbench launch`: LaunchSpec fields and "
                                                              "a [launch.slurm] table"}
    schema["required"] = ["model", "plan"]
    return {"$schema": SCHEMA_URI, "title": "workbench run config", **schema}
